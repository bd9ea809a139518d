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

- ``CONNECTION_LIMIT`` (1024) connections open at once, and up to
  ``CONNECTION_CAP`` (2048) while those past the limit are too young to close:
  a connection costs a file descriptor and a few KiB of buffers, so the limit is
  far above the 64 parallel scrapers the fault suite runs, and the cap bounds
  what the port holds. Past the limit the server does not stop accepting, as
  waitress would (which let 1,100 connections dripping a header byte every 3 s
  hold the port, so 0 of 32 probes were answered, issue 46): it accepts, and
  closes the connections that have waited longest for their client, of those
  accepted at least ``GRACE_SECONDS`` (0.5 s) earlier and with no request read,
  being answered or unsent (``SidePortServer``). The grace is what keeps a probe
  safe: it sends its request as it connects, and is answered within
  milliseconds, far inside it. Without it a connection was closed once a limit's
  worth of newer ones had been accepted, which an attacker reopening at once did
  in tens of milliseconds, so a probe whose request a loaded machine had not yet
  read was closed unanswered (2 of 32 in a full-suite run on two busy cores).
  Young connections pile up past the limit, hence the cap: at it the server
  stops accepting until the oldest turns 0.5 s old and may be closed, and new
  connections wait in the listen queue. So it takes at most ``CONNECTION_CAP``
  connections per grace, and against thousands a probe waits its turn in the
  queue (in trials on two cores, a median 0.3 s behind 3,000 dripping
  connections and 0.8 s behind 5,000, where closing with no grace gave 0.2 and
  0.4 s); closing young connections at the cap would take it sooner, but might
  again close it before its request is read.
- ``HEADER_SECONDS`` (2 s): a request head must arrive whole within this long of
  the accept (or of its first byte, on a kept-alive connection), however often
  its bytes come; checked every ``CLEANUP_INTERVAL`` (1 s), so a dripping
  connection lives 3 s at most. Probes and scrapers send a head in one packet.
- ``CHANNEL_TIMEOUT`` (5 s): a connection that has sent nothing for this long,
  and has no request being answered, is closed (an idle kept-alive one; checked
  every ``CLEANUP_INTERVAL``). ``flight_server.health`` gives up after 4 s; a
  keep-alive scraper simply reconnects at its next scrape.
- ``BACKLOG`` (4096) connections the kernel completes before the loop accepts
  them (capped by ``net.core.somaxconn``, 4096 by default since Linux 5.4): the
  5 of ``http.server`` dropped the SYNs of parallel scrapers, and a drop costs a
  client a 1 s retransmit, a failed probe. At the cap it is where an attacker's
  reconnects wait, so it must hold them and the probes: with 1024, 3,000
  dripping connections made 2 of 32 probes miss their second. Past the cap plus
  this queue the kernel drops SYNs, whatever the server does.
  ``ACCEPT_BATCH`` (64) are accepted per turn of the loop (waitress takes one).
- ``THREADS`` (4): an answer takes about a millisecond of Python; more
  concurrent requests queue, at most one per connection.
- request headers up to 16 KiB and no body: nothing here reads one. A
  ``/readyz`` reason is cut to ``REASON_CHARS`` (512) characters, so the probes'
  answers stay small whatever an error message holds.

Of the defences issue 46 named, the header deadline alone is not enough: a
dripping connection is closed within 3 s, but an attacker that reopens each at
once keeps the limit full, and a probe waits behind it for up to those 3 s
(under the fault test's drip, 11 of 32 probes answered within 1 s, kubelet's
default timeout). Closing the longest-waiting connections at the limit is what
keeps the probes' way open (32 of 32, the slowest in under 30 ms, and in under
half a second beside two busy loops on the two cores); the deadline bounds what
each dripping connection holds meanwhile and ends a drip that does not reopen. A
connection budget per client address is not used: it fails the prober whenever
it shares the attacker's address (clients behind one NAT or proxy, a port
published by compose, the fault test on loopback), and an attacker with more
than ``CONNECTION_LIMIT / budget`` addresses fills the limit anyway. A listener
of its own for the probes would face the same drip on its own port. The cost
under attack: while an attacker holds more than the limit, each of its
connections is closed about 0.5 s after its accept and reopened (in the fault
test, on two cores, about 1,500 reconnects a second and 0.13 of a core of the
server process, whose Python the Flight handlers share, where closing the oldest
with no grace cost 10,000 and 0.6). The port is on loopback unless
``--metrics-host`` says otherwise; expose it to the probers and scrapers that
need it, not to the world.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import CONTENT_TYPE_LATEST
from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import TcpWSGIServer
from waitress.task import ThreadedTaskDispatcher

from flight_server.auth import TokenFile, bearer_token
from flight_server.catalog import Catalog

CONNECTION_LIMIT = 1024
#: The most connections open at once: past the limit, the ones too young to close.
CONNECTION_CAP = 2 * CONNECTION_LIMIT
#: How long a connection is safe from being closed to make room, from its accept.
GRACE_SECONDS = 0.5
HEADER_SECONDS = 2.0
CHANNEL_TIMEOUT = 5.0
CLEANUP_INTERVAL = 1.0
BACKLOG = 4096
ACCEPT_BATCH = 64
THREADS = 4
MAX_HEADER_BYTES = 16 * 1024
#: The longest reason ``/readyz`` gives (characters, before the ``not ready: ``).
REASON_CHARS = 512
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


class HeadTimedChannel(HTTPChannel):
    """A waitress connection that knows since when it has waited for a request head.

    ``head_since`` (``time.time()``, waitress's clock) is the accept, or the first
    byte of a head after an answered request; None while no head is under way."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_since: float | None = self.creation_time

    def received(self, data: bytes) -> bool:
        # In the loop's thread, as every read is.
        now = time.time()
        partial = self.request
        if self.head_since is None:
            self.head_since = now
        result = super().received(data)
        if self.request is None:  # every byte read went into complete requests
            self.head_since = None
        elif partial is not None and self.request is not partial:
            # The head under way ended in this read and a new one began. (Without
            # ``partial``, the head is the one ``head_since`` already dates: the
            # first, from the accept, or one after an answer, from this read.)
            self.head_since = now
        return result

    def waiting_since(self) -> float:
        """Since when the connection has waited for its client: the start of the
        head under way, else the last byte read or written (idle, kept alive)."""
        return self.last_activity if self.head_since is None else self.head_since


class SidePortServer(TcpWSGIServer):
    """waitress's TCP server on ``listener`` with the rules of this module's doc:
    a request head has ``HEADER_SECONDS`` to arrive, and past the connection limit
    the longest-waiting connections at least ``GRACE_SECONDS`` old are closed,
    where waitress stops accepting; it stops at ``CONNECTION_CAP``."""

    channel_class = HeadTimedChannel
    _next_sweep = 0.0  # when ``_sweep`` runs next (``time.time()``)
    _open = 0  # connections open (closing or not): counted each turn, plus accepts
    _ripe_at: float | None = None  # at the cap: when a connection turns old enough to close

    def __init__(
        self,
        application: WSGIApplication,
        connections: dict[int, Any],
        listener: socket.socket,
        adjustments: Adjustments,
    ) -> None:
        self.connections = connections  # the loop's map, which this server joins
        dispatcher = ThreadedTaskDispatcher()
        dispatcher.set_thread_count(adjustments.threads)
        # What waitress's create_server does for one listening socket.
        super().__init__(
            application,
            connections,
            _sock=listener,
            dispatcher=dispatcher,
            adj=adjustments,
            bind_socket=False,
            sockinfo=(listener.family, listener.type, listener.proto, listener.getsockname()),
        )

    def _active(self) -> dict[int, HeadTimedChannel]:
        # ``active_channels`` is a dict of descriptor to channel (the stubs say otherwise).
        return cast("dict[int, HeadTimedChannel]", self.active_channels)

    def _channels(self) -> list[HeadTimedChannel]:
        return list(self._active().values())

    def readable(self) -> bool:
        # Asked once per turn of the loop, before its poll and before the
        # connections are (the server joined the map first): those ``_make_room``
        # marks are polled as writable and close in this turn, after
        # ``handle_accept``, so no descriptor is reused among the poll's results.
        now = time.time()
        if now >= self._next_sweep:
            self._next_sweep = now + self.adj.cleanup_interval
            self._sweep(now)
        self._ripe_at = None
        if len(self._active()) > self.adj.connection_limit:
            self._make_room(now)
        self._open = len(self._active())  # those marked to close hold theirs still
        return bool(self.accepting) and self._open < CONNECTION_CAP

    def poll_seconds(self, longest: float) -> float:
        """How long the loop's next poll may wait: ``longest``, or less when the
        server is full, so that it makes room as soon as a connection may close."""
        if self._ripe_at is None or self._open < CONNECTION_CAP:
            return longest
        # A millisecond more: the poll counts whole milliseconds, rounded down.
        return min(longest, max(0.0, self._ripe_at - time.time()) + 0.001)

    def _sweep(self, now: float) -> None:
        """Close (in the loop's next turn) every connection silent for the channel
        timeout or ``HEADER_SECONDS`` into a head, unless a request is being answered."""
        silent = now - self.adj.channel_timeout
        slow = now - HEADER_SECONDS
        for channel in self._channels():
            if channel.requests:
                continue
            head_since = channel.head_since
            if channel.last_activity < silent or (head_since is not None and head_since < slow):
                channel.will_close = True

    def handle_accept(self) -> None:
        for _ in range(min(ACCEPT_BATCH, CONNECTION_CAP - self._open)):
            try:
                accepted = self.accept()  # None when none is waiting
                if accepted is None:
                    break
                connection, address = accepted
            except OSError:  # as waitress: logged, and the loop goes on
                if self.adj.log_socket_errors:
                    self.logger.warning("accept() failed on the side port", exc_info=True)
                break
            try:
                self.set_socket_options(connection)
            except OSError:  # the client is already gone
                connection.close()
                continue
            self.channel_class(self, connection, self.fix_addr(address), self.adj, self.connections)
            self._open += 1
        if self._open >= CONNECTION_CAP:  # for ``poll_seconds``, before the next poll
            self._make_room(time.time())

    def _make_room(self, now: float) -> None:
        """Past the connection limit, mark to close the connections that have waited
        longest for their client, of those accepted ``GRACE_SECONDS`` ago or more
        with no request read, being answered or unsent, and note when the first of
        those too young turns old enough."""
        staying = [c for c in self._channels() if not (c.will_close or c.close_when_flushed)]
        excess = len(staying) - self.adj.connection_limit
        old = now - GRACE_SECONDS
        closable: list[HeadTimedChannel] = []
        first_young: float | None = None  # the earliest accept of those too young
        if excess > 0:
            for channel in staying:
                if channel.requests or channel.total_outbufs_len:
                    continue
                if channel.creation_time <= old:
                    closable.append(channel)
                elif first_young is None or channel.creation_time < first_young:
                    first_young = channel.creation_time
        closing = heapq.nsmallest(excess, closable, key=HeadTimedChannel.waiting_since)
        for channel in closing:
            channel.will_close = True
        self._ripe_at = None if first_young is None else first_young + GRACE_SECONDS


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
            adjustments = Adjustments(
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
            self._server = SidePortServer(self._answer, self._map, listener, adjustments)
        except BaseException:
            listener.close()
            raise
        self._stopping = threading.Event()
        self.port = listener.getsockname()[1]
        bind = f"[{host}]" if ":" in host else host
        self.url = f"http://{bind}:{self.port}"
        self._thread = threading.Thread(target=self._loop, name="probes", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            wait = self._server.poll_seconds(LOOP_SECONDS)
            wasyncore.loop(timeout=wait, map=self._map, use_poll=True, count=1)
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
            if len(problem) > REASON_CHARS:
                problem = problem[: REASON_CHARS - 3] + "..."
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
