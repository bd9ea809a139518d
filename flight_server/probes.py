"""The HTTP side port (``--metrics-port``): ``/metrics``, ``/healthz``, ``/readyz``.

pyarrow's Flight server cannot host gRPC's health service, so orchestrators
probe over HTTP: ``/healthz`` answers 200 while the process serves HTTP at all
(live), ``/readyz`` 200 only when every dataset's caches are open and the
population store is writable (ready), 503 with the reason otherwise, and
``/metrics`` is the Prometheus text format.
"""

from __future__ import annotations

import logging
import socket
import tempfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST

from flight_server.catalog import Catalog

log = logging.getLogger("flight_server")


def readiness(catalog: Catalog, state_dir: Path) -> Callable[[], str | None]:
    """A check answering None when ready, else what is wrong (for ``/readyz``)."""

    def check() -> str | None:
        for name in catalog.names():
            try:
                catalog.get(name).active()
            except Exception as error:
                return f"dataset {name!r} cannot serve: {error}"
        try:
            with tempfile.NamedTemporaryFile(dir=state_dir, prefix=".ready-"):
                pass
        except OSError as error:
            return f"the population store is not writable: {error.strerror}"
        return None

    return check


class ProbeServer:
    """Serves the probes on ``host:port`` (port 0: any free port) from a daemon thread."""

    def __init__(
        self,
        host: str,
        port: int,
        metrics: Callable[[], bytes],
        ready: Callable[[], str | None],
    ) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._answer(200, metrics(), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    self._answer(200, b"ok\n")
                elif path == "/readyz":
                    problem = ready()
                    if problem is None:
                        self._answer(200, b"ready\n")
                    else:
                        self._answer(503, f"not ready: {problem}\n".encode())
                else:
                    self._answer(404, b"the probes are /metrics, /healthz and /readyz\n")

            def _answer(self, code: int, body: bytes, kind: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("probe %s", format % args)

        class Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            daemon_threads = True

        self._http = Server((host, port), Handler)
        self.port = self._http.server_address[1]
        bind = f"[{host}]" if ":" in host else host
        self.url = f"http://{bind}:{self.port}"
        self._thread = threading.Thread(target=self._http.serve_forever, name="probes", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(5)
