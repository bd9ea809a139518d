"""A store that asks its clients to slow down, for tests.

S3 answers ``503 SlowDown`` when one key prefix gets more requests than it serves.
``SlowDownProxy`` stands on loopback in front of a real store (the radosgw that the
object-storage tests start) and forwards every request to it, except those it
answers with S3's own SlowDown error instead:

- ``"off"``: none;
- ``"once"``: each distinct request (method, path with query, ``Range``) the first
  time it is seen, so a client that retries gets through on its second try;
- ``"always"``: every request, as a store under a load it never sheds.

Requests are forwarded with their headers as signed (``Host`` included), so the
store checks the client's signatures as if there were no proxy.
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import urlsplit

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
# Connection-level headers are the proxy's own on each side.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te"}
UPSTREAM_TIMEOUT_SECONDS = 60


class SlowDownProxy:
    def __init__(self, upstream: str, mode: str = "once") -> None:
        split = urlsplit(upstream)
        assert split.scheme == "http", upstream
        assert split.hostname, upstream
        self.upstream = (split.hostname, split.port or 80)
        self.mode = mode
        self.slow_downs = 0  # answers sent as 503 SlowDown
        self.forwarded = 0
        self._seen: set[tuple[str, str, str | None]] = set()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def slows_down(self, method: str, path: str, byte_range: str | None) -> bool:
        """Whether this request gets a SlowDown answer (and counts it)."""
        with self._lock:
            if self.mode == "always":
                slow = True
            elif self.mode == "once":
                key = (method, path, byte_range)
                slow = key not in self._seen
                self._seen.add(key)
            else:
                slow = False
            if slow:
                self.slow_downs += 1
            else:
                self.forwarded += 1
            return slow

    def __enter__(self) -> SlowDownProxy:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


def _handler(proxy: SlowDownProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: a test prints what it counts

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _answer(self) -> None:
            body = self._body()
            if proxy.slows_down(self.command, self.path, self.headers.get("Range")):
                self.send_response(503, "Slow Down")
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(SLOW_DOWN)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(SLOW_DOWN)
                return
            upstream = http.client.HTTPConnection(*proxy.upstream, timeout=UPSTREAM_TIMEOUT_SECONDS)
            try:
                upstream.putrequest(
                    self.command, self.path, skip_host=True, skip_accept_encoding=True
                )
                for name, value in self.headers.items():
                    if name.lower() not in HOP_BY_HOP | {"content-length"}:
                        upstream.putheader(name, value)
                if body or self.command in ("PUT", "POST"):
                    upstream.putheader("Content-Length", str(len(body)))
                upstream.endheaders(body)
                response = upstream.getresponse()
                data = response.read()
                self.send_response(response.status, response.reason)
                for name, value in response.getheaders():
                    lower = name.lower()
                    if lower in HOP_BY_HOP | {"date", "server"}:
                        continue
                    if lower == "content-length" and self.command != "HEAD":
                        continue  # the body as read, chunked or not
                    self.send_header(name, value)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
            finally:
                upstream.close()

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _answer

    return Handler
