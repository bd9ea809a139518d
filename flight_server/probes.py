"""The HTTP side port (``--metrics-port``): ``/metrics``, ``/healthz``, ``/readyz``.

pyarrow's Flight server cannot host gRPC's health service, so orchestrators
probe over HTTP: ``/healthz`` answers 200 while the process serves HTTP at all
(live), ``/readyz`` 200 only when every dataset's caches are open, the
population store is writable and its volume has ``--min-free-bytes`` free
(ready), 503 with the reason otherwise, and ``/metrics`` is the Prometheus text
format. With a token file, ``/metrics`` needs one of its tokens (read or admin)
as ``authorization: Bearer <token>``, and answers 401 without; the probes never
need one (docs/operations.md).

The port is served by waitress: one thread runs an event loop that owns every
connection and a few worker threads answer complete requests, so a client that
connects and sends nothing (or half a request) holds a file descriptor, never a
thread. The bounds, each against what a side port of probes and scrapers sees:

- ``CONNECTION_LIMIT`` (1024) connections open at once: a connection costs a
  file descriptor and a few KiB of buffers, so the limit is far above the 64
  parallel scrapers the fault suite runs, and a flood of silent connections
  (600 in the audit's attack) sits beside the probes rather than in front of
  them: at 128 a probe waited 18 s behind 600 of them. Past the limit the
  server stops accepting; new connections wait in the listen queue until idle
  ones are closed, so the port recovers by itself, ``CHANNEL_TIMEOUT`` after
  the silent connections' last byte.
- ``CHANNEL_TIMEOUT`` (5 s): a connection that has sent nothing for this long,
  and has no request being answered, is closed (checked every
  ``CLEANUP_INTERVAL``, 1 s). Probes and scrapers send their request as soon as
  they connect; ``flight_server.health`` gives up after 4 s. A keep-alive
  scraper simply reconnects at its next scrape.
- ``BACKLOG`` (1024) connections the kernel completes before the loop accepts
  them (capped by ``net.core.somaxconn``): the 5 of ``http.server`` dropped the
  SYNs of parallel scrapers, and each drop costs a client a 1 s retransmit.
- ``THREADS`` (4): an answer takes about a millisecond of Python; more
  concurrent requests queue, at most one per connection.
- request headers up to 16 KiB and no body: nothing here reads one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from wsgiref.types import StartResponse, WSGIEnvironment

from prometheus_client import CONTENT_TYPE_LATEST
from waitress import wasyncore
from waitress.server import BaseWSGIServer, create_server

from flight_server.auth import TokenFile, bearer_token
from flight_server.catalog import Catalog

CONNECTION_LIMIT = 1024
CHANNEL_TIMEOUT = 5.0
CLEANUP_INTERVAL = 1.0
BACKLOG = 1024
THREADS = 4
MAX_HEADER_BYTES = 16 * 1024
#: The default of ``--min-free-bytes``: room for a few population tables and the
#: temporary copy an update writes before it is renamed into place.
MIN_FREE_BYTES = 512 * 1024 * 1024
#: Longest wait of the event loop between its checks of ``close``.
LOOP_SECONDS = 1.0
CLOSE_SECONDS = 5
TEXT = "text/plain; charset=utf-8"
UNAUTHORIZED = (
    b"/metrics needs 'authorization: Bearer <token>' with a token of the server's --token-file\n"
)


def readiness(
    catalog: Catalog, state_dir: Path, min_free_bytes: int = MIN_FREE_BYTES
) -> Callable[[], str | None]:
    """A check answering None when ready, else what is wrong (for ``/readyz``).

    ``min_free_bytes`` (0: no floor) is the free space the state directory's
    volume must keep for the server to take population updates."""

    def check() -> str | None:
        for name in catalog.names():
            service = catalog.get(name)
            try:
                service.active()
            except Exception as error:
                return f"dataset {name!r} cannot serve: {catalog.redact(str(error))}"
            problem = service.problem()  # a cache file cut, deleted or damaged under us
            if problem is not None:
                return f"dataset {name!r} cannot serve: {catalog.redact(problem)}"
        try:
            with tempfile.NamedTemporaryFile(dir=state_dir, prefix=".ready-"):
                pass
        except OSError as error:
            return f"the population store is not writable: {error.strerror}"
        if min_free_bytes > 0:
            try:
                volume = os.statvfs(state_dir)
            except OSError as error:
                return f"cannot read the free space of the state volume: {error.strerror}"
            free = volume.f_bavail * volume.f_frsize
            if free < min_free_bytes:
                return (
                    f"the state volume has {free} bytes free ({free / 2**20:.0f} MiB), "
                    f"below --min-free-bytes {min_free_bytes}"
                )
        return None

    return check


class ProbeServer:
    """Serves the probes on ``host:port`` (port 0: any free port) from a daemon thread.

    With ``tokens``, ``/metrics`` answers only requests that carry one of them."""

    def __init__(
        self,
        host: str,
        port: int,
        metrics: Callable[[], bytes],
        ready: Callable[[], str | None],
        *,
        tokens: TokenFile | None = None,
    ) -> None:
        # A request waiting for a thread is expected when scrapers come together,
        # and bounded (one per connection): not a warning per request.
        logging.getLogger("waitress.queue").setLevel(logging.ERROR)
        self._metrics = metrics
        self._ready = ready
        self._tokens = tokens
        self.tokens_required = tokens is not None
        # Bound here, so that a name is one address (its first) and one server.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.create_server((host, port), family=family, backlog=BACKLOG)
        self._map: dict[int, Any] = {}  # the loop's connections, owned by this server
        try:
            server = create_server(
                self._answer,
                map=self._map,
                sockets=[listener],
                threads=THREADS,
                connection_limit=CONNECTION_LIMIT,
                channel_timeout=CHANNEL_TIMEOUT,
                cleanup_interval=CLEANUP_INTERVAL,
                backlog=BACKLOG,
                max_request_header_size=MAX_HEADER_BYTES,
                max_request_body_size=0,
                asyncore_use_poll=True,  # select() stops at descriptor 1024
                ident="flight_server",
            )
        except BaseException:
            listener.close()
            raise
        if not isinstance(server, BaseWSGIServer):  # one socket makes one server
            raise TypeError(f"waitress made a {type(server).__name__} of one socket")
        self._server = server
        self._stopping = threading.Event()
        self.port = listener.getsockname()[1]
        bind = f"[{host}]" if ":" in host else host
        self.url = f"http://{bind}:{self.port}"
        self._thread = threading.Thread(target=self._loop, name="probes", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            wasyncore.loop(timeout=LOOP_SECONDS, map=self._map, use_poll=True, count=1)
        # In the loop's own thread, so no poll is using them.
        wasyncore.close_all(self._map)

    def close(self) -> None:
        """Stop accepting, close every connection, and stop the threads."""
        self._stopping.set()
        # Wakes the loop's poll; an OSError means the loop saw the flag first
        # and closed the trigger already: it is done.
        with contextlib.suppress(OSError):
            self._server.pull_trigger()
        self._thread.join(CLOSE_SECONDS)
        self._server.task_dispatcher.shutdown(timeout=CLOSE_SECONDS)

    def _answer(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        """The WSGI application."""
        status, body, kind, headers = self._route(environ)
        start_response(
            status, [("Content-Type", kind), ("Content-Length", str(len(body))), *headers]
        )
        return [b""] if environ.get("REQUEST_METHOD") == "HEAD" else [body]

    def _route(self, environ: WSGIEnvironment) -> tuple[str, bytes, str, list[tuple[str, str]]]:
        """(status, body, content type, more headers) of one request."""
        path = environ.get("PATH_INFO", "")
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return (
                "405 Method Not Allowed",
                b"the probes answer GET\n",
                TEXT,
                [("Allow", "GET, HEAD")],
            )
        if path == "/healthz":
            return "200 OK", b"ok\n", TEXT, []
        if path == "/readyz":
            problem = self._ready()
            if problem is None:
                return "200 OK", b"ready\n", TEXT, []
            return "503 Service Unavailable", f"not ready: {problem}\n".encode(), TEXT, []
        if path == "/metrics":
            if not self._authorized(environ.get("HTTP_AUTHORIZATION", "")):
                return "401 Unauthorized", UNAUTHORIZED, TEXT, [("WWW-Authenticate", "Bearer")]
            return "200 OK", self._metrics(), CONTENT_TYPE_LATEST, []
        return "404 Not Found", b"the probes are /metrics, /healthz and /readyz\n", TEXT, []

    def _authorized(self, header: str) -> bool:
        if self._tokens is None:
            return True
        token = bearer_token(header)
        return token is not None and self._tokens.role_of(token) is not None
