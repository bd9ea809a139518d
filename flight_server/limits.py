"""What one request, one stream or one client may cost the server.

`Limits` holds the bounds (the ``--max-*`` options, defaults in
docs/flight-protocol.md#limits). `StreamSlots` admits ``do_get`` streams, in total
and per client, and cancels a stream whose client stopped taking batches.

pyarrow has no RESOURCE_EXHAUSTED: over-limit streams are refused with UNAVAILABLE
(`flight.FlightUnavailableError`), which clients retry later or on another replica.

A stream's idle clock runs while a batch is with the client: from when the
server hands gRPC a batch until gRPC asks for the next one (it asks once the
client has taken enough of what was sent). When the clock passes the timeout, the
stream is cancelled: its native stream (workers, prefetched batches) is closed
and its slot in the server's total is free. pyarrow cannot cancel a gRPC write
from Python, so the call's thread and the one batch in its write buffer stay
until the client reads again (it then gets DEADLINE_EXCEEDED) or goes away:
until then such a *stalled* stream still counts against its client's limit.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from collections import Counter
from dataclasses import dataclass, fields
from typing import Any, Protocol

import pyarrow.flight as flight

from flight_server.auth import identity_of

#: The option that sets each limit, for messages.
OPTIONS = {
    "max_endpoints": "--max-endpoints",
    "max_streams": "--max-streams",
    "max_streams_per_client": "--max-streams-per-client",
    "stream_idle_timeout": "--stream-idle-timeout",
    "max_put_rows": "--max-put-rows",
    "max_put_bytes": "--max-put-bytes",
}


@dataclass(frozen=True)
class Limits:
    """The server's bounds; every value must be positive."""

    #: endpoints in one ``get_flight_info`` answer (= its ``world_size``)
    max_endpoints: int = 65_536
    #: ``do_get`` streams open at once, in total and per client
    max_streams: int = 64
    max_streams_per_client: int = 16
    #: seconds a stream may wait for its client to take a batch
    stream_idle_timeout: float = 60.0
    #: rows and Arrow bytes of one ``do_put`` table: the engine streams a put
    #: to disk batch by batch, so the defaults are the most a population holds
    #: (2^32 - 1 rows) and 1 TiB, for operators to lower
    max_put_rows: int = 4_294_967_295
    max_put_bytes: int = 1024**4

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{OPTIONS[field.name]} must be a positive number, got {value!r}")


class StreamSlots:
    """The ``do_get`` streams of one server: admission, idle deadlines, shutdown."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._open: set[Stream] = set()
        self._per_client: Counter[str] = Counter()
        self._stalled = 0
        self._closed: str | None = None  # why new streams are refused
        self._watchdog: threading.Thread | None = None

    def admit(self, client: str) -> Stream:
        """A slot for a new stream of ``client``, or UNAVAILABLE naming the limit."""
        limits = self.limits
        with self._lock:
            if self._closed is not None:
                raise flight.FlightUnavailableError(self._closed)
            if self._per_client[client] >= limits.max_streams_per_client:
                raise flight.FlightUnavailableError(
                    f"this client has {self._per_client[client]} streams, the limit per client "
                    f"(--max-streams-per-client {limits.max_streams_per_client}), counting those "
                    "cancelled while it did not read; read or close them first"
                )
            if len(self._open) >= limits.max_streams:
                raise flight.FlightUnavailableError(
                    f"the server has {len(self._open)} streams open, its limit "
                    f"(--max-streams {limits.max_streams}); retry later or on another replica"
                )
            stream = Stream(self, client)
            self._open.add(stream)
            self._per_client[client] += 1
            if self._watchdog is None:
                self._watchdog = threading.Thread(
                    target=self._watch, name="stream-deadlines", daemon=True
                )
                self._watchdog.start()
        return stream

    def counts(self) -> dict[str, int]:
        """``{"open", "stalled"}``: streams holding a slot, and cancelled ones whose
        gRPC call has not ended yet."""
        with self._lock:
            return {"open": len(self._open), "stalled": self._stalled}

    def close(self, reason: str) -> None:
        """Refuse new streams and cancel the open ones, UNAVAILABLE with ``reason``."""
        with self._lock:
            self._closed = reason
            streams = list(self._open)
        for stream in streams:
            stream.cancel(flight.FlightUnavailableError(reason))

    def _watch(self) -> None:
        """Cancel idle streams; runs while any stream is open."""
        timeout = self.limits.stream_idle_timeout
        interval = min(1.0, max(0.05, timeout / 4))
        while True:
            with self._lock:
                if not self._open:
                    self._watchdog = None
                    return
                streams = list(self._open)
            now = time.monotonic()
            for stream in streams:
                stream.expire(now, timeout)
            time.sleep(interval)

    def _release(self, stream: Stream, *, stalled: bool) -> None:
        """Free ``stream``'s slot; ``stalled``: its gRPC call goes on for now."""
        with self._lock:
            self._account(stream, stalled=stalled)
            idle = not self._open
        if idle:
            _return_memory()

    def _account(self, stream: Stream, *, stalled: bool) -> None:
        # A stalled stream leaves the total at once but stays its client's until
        # its call ends: an idle client does not get new slots by idling.
        if stream in self._open:
            self._open.discard(stream)
            if stalled:
                stream.stalled = True
                self._stalled += 1
                return
        elif stream.stalled and not stalled:
            stream.stalled = False
            self._stalled -= 1
        else:
            return
        self._per_client[stream.client] -= 1
        if not self._per_client[stream.client]:
            del self._per_client[stream.client]


class StreamWatch(Protocol):
    """What observes a stream (`flight_server.metrics.StreamObservation`)."""

    def first_batch(self) -> None: ...

    def end(self, error: BaseException | None, rows: int, nbytes: int) -> None: ...


class NativeStream(Protocol):
    """What a slot watches and cancels (`dataset_rt.service.BatchStream`): the
    stream keeps its own progress, so no Python runs per batch."""

    def progress(self) -> Any: ...

    def cancel(self) -> None: ...


#: How a stream ends when pyarrow drops its generator first: its client went away.
DROPPED = flight.FlightCancelledError("the client went away before the stream ended")


class Stream:
    """One admitted ``do_get``. The server `attach`-es the native stream it
    serves; the slot ends when the stream ends, fails, is cancelled, or pyarrow
    drops it (the client went away)."""

    def __init__(self, slots: StreamSlots, client: str) -> None:
        self.client = client
        self.stalled = False
        self._slots = slots
        self._lock = threading.Lock()
        self._native: NativeStream | None = None
        self._watch: StreamWatch | None = None
        self._admitted = time.monotonic()
        #: The error the client gets once the stream was cancelled (None: not cancelled).
        self.cancelled: flight.FlightError | None = None
        self._ended = False

    def attach(self, native: NativeStream, watch: StreamWatch | None = None) -> None:
        """Serve ``native``; ``watch`` sees the first batch and, once, how the stream ended."""
        self._native = native
        self._watch = watch

    def first_batch(self) -> None:
        if self._watch is not None:
            self._watch.first_batch()

    def expire(self, now: float, timeout: float) -> None:
        """Cancel the stream if its client has held a batch for ``timeout`` s
        (the native stream knows: no Python runs per batch to tell the slot)."""
        if self._native is None:
            idle: float | None = now - self._admitted
        else:
            idle = self._native.progress().idle_seconds
        if idle is not None and idle >= timeout:
            self.cancel(
                flight.FlightTimedOutError(
                    f"the stream was cancelled: its client took no batch for {timeout:g} s "
                    "(--stream-idle-timeout); resume it with 'offset' set to the samples "
                    "received"
                )
            )

    def cancel(self, error: flight.FlightError) -> None:
        """End the stream with ``error``: its native stream is freed now (or,
        if it is producing a batch, once that batch is done), its next read
        fails with ``error``, and its slot leaves the server's total at once."""
        with self._lock:
            if self._ended or self.cancelled is not None:
                return
            self.cancelled = error
        if self._native is not None:
            self._native.cancel()
        self._report(error)
        self._slots._release(self, stalled=True)

    def end(self, outcome: BaseException | None = DROPPED) -> None:
        """Free the slot (idempotent). ``outcome`` is what the client got
        (None: every batch); the default is for a stream pyarrow dropped before
        it ended (the client went away)."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        if self._native is not None:
            self._native.cancel()  # frees a stream dropped midway at once
        self._report(outcome)
        self._slots._release(self, stalled=False)

    def _report(self, outcome: BaseException | None) -> None:
        with self._lock:  # once, whichever of cancel and end comes first
            watch, self._watch = self._watch, None
        if watch is not None:
            progress = self._native.progress() if self._native is not None else None
            rows = progress.rows if progress is not None else 0
            nbytes = progress.bytes if progress is not None else 0
            watch.end(outcome, rows, nbytes)


def _libc_malloc_trim() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError, TypeError):  # not glibc
        return None


_malloc_trim = _libc_malloc_trim()
#: Seconds between trims; the last end of a burst gets a trim this long after.
TRIM_INTERVAL = 1.0
_trim_lock = threading.Lock()
_trim_state = {"last": 0.0, "pending": False}


def _return_memory() -> None:
    """Hand the heap that ended streams freed back to the OS, at most once a
    second, and once more a second after the last call of a burst.

    glibc keeps freed memory in its per-thread arenas, and streams free it from
    many threads (gRPC's, the engine's): without a trim the server's RSS stays
    at its peak after a burst of streams (~3.5 MiB per stream). Streams of a
    burst end within the same second, so the trim that the first one's end
    runs comes before the others' memory is free: a deferred trim follows."""
    if _malloc_trim is None:
        return
    with _trim_lock:
        now = time.monotonic()
        wait = _trim_state["last"] + TRIM_INTERVAL - now
        if wait <= 0:
            _trim_state["last"] = now
        elif _trim_state["pending"]:
            return
        else:
            _trim_state["pending"] = True
    if wait <= 0:
        _malloc_trim(0)
        return
    timer = threading.Timer(wait, _deferred_trim)
    timer.daemon = True
    timer.start()


def _deferred_trim() -> None:
    with _trim_lock:
        _trim_state["pending"] = False
        _trim_state["last"] = time.monotonic()
    if _malloc_trim is not None:
        _malloc_trim(0)


# -- who is a client ---------------------------------------------------------------


def client_of(context: Any) -> str:
    """The client a call counts against: with a token file, its token's name
    (one client however the header spells the token); else its address."""
    identity = identity_of(context)
    if identity is not None:
        return f"token:{identity.name}"
    return peer_address(str(context.peer()))


def peer_address(peer: str) -> str:
    """The peer without its port: ``ipv4:127.0.0.1:5123`` -> ``ipv4:127.0.0.1``."""
    kind, _, address = peer.partition(":")
    host, sep, port = address.rpartition(":")
    if kind in ("ipv4", "ipv6") and sep and port.isdigit():
        return f"{kind}:{host}"
    return peer
