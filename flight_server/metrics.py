"""What an operator watches: Prometheus metrics and one log line per request.

Every Flight call is observed once, where its status is decided
(`DatasetFlightServer`'s error mapping for unary calls, the stream generator for
``do_get``, the auth middleware for calls refused before a handler runs): a
request counter by method and status, a latency histogram, and
for streams the open gauge, the duration and the time to the first batch. Rows
and bytes served per dataset and population come from the engine's counts
(`DatasetService.served`, bounded to 64 populations per dataset), so no label
grows without bound: the labels are method, status (the gRPC code names),
dataset (the catalog's names) and population (the bounded set).

Each server has its own registry (tests start many servers in one process).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from dataset_rt import _native

#: A dataset's ``served`` entries (`DatasetService.served`), by dataset name.
Served = Callable[[str], list[dict[str, Any]]]
#: A dataset's count of activation-log entries skipped as damaged or hostile.
Skipped = Callable[[str], int]

requests_log = logging.getLogger("flight_server.requests")

#: Latency buckets (seconds): sub-millisecond actions to multi-minute epochs.
_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
    1800,
)

#: The request fields worth a log line (the rest of a ticket is defaults, mostly).
LOGGED_KEYS = (
    "seed",
    "epoch",
    "epoch_len",
    "shuffle",
    "world_size",
    "rank",
    "offset",
    "start",
    "stop",
    "block",
    "population",
    "payload",
    "run",
    "generation",
)


def status_of(error: BaseException | None) -> str:
    """The gRPC status name a client sees for ``error`` (``OK`` for none)."""
    if error is None:
        return "OK"
    for kind, name in _STATUSES:
        if isinstance(error, kind):
            return name
    return "UNKNOWN"


_STATUSES: tuple[tuple[type[BaseException], str], ...] = (
    (flight.FlightUnauthenticatedError, "UNAUTHENTICATED"),
    (flight.FlightUnauthorizedError, "PERMISSION_DENIED"),
    (flight.FlightUnavailableError, "UNAVAILABLE"),
    (flight.FlightTimedOutError, "DEADLINE_EXCEEDED"),
    (flight.FlightCancelledError, "CANCELLED"),
    (flight.FlightInternalError, "INTERNAL"),
    (pa.ArrowKeyError, "NOT_FOUND"),
    (pa.ArrowInvalid, "INVALID_ARGUMENT"),
    (flight.FlightServerError, "INTERNAL"),
)


class ServerMetrics:
    """The registry of one server, and the calls that feed it."""

    def __init__(
        self, served: Served, datasets: Iterable[str], skipped: Skipped = lambda _: 0
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "datasetrt_requests",
            "Flight calls by method and final status",
            ["method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "datasetrt_request_seconds",
            "Duration of unary Flight calls (do_get: see datasetrt_stream_seconds)",
            ["method"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.streams_open = Gauge(
            "datasetrt_streams_open",
            "do_get streams being served",
            ["dataset"],
            registry=self.registry,
        )
        self.stream_seconds = Histogram(
            "datasetrt_stream_seconds",
            "Duration of do_get streams, from the call to the last batch or the failure",
            ["dataset"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.first_batch = Histogram(
            "datasetrt_time_to_first_batch_seconds",
            "From a do_get call to its first batch handed to Flight",
            ["dataset"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        for name in datasets:  # every dataset's series exist from the start (at 0)
            self.streams_open.labels(name)
        self.registry.register(_ServedCollector(served, list(datasets), skipped))

    def exposition(self) -> bytes:
        """The text format of ``/metrics``."""
        return generate_latest(self.registry)

    def call(
        self,
        method: str,
        seconds: float,
        error: BaseException | None,
        fields: Mapping[str, Any],
        cause: BaseException | None = None,
    ) -> None:
        """A unary call ended: ``error`` is what the client got (None: success),
        ``cause`` the error before it was made fit for the client (the log keeps
        its whole message, paths included)."""
        status = status_of(error)
        self.requests.labels(method, status).inc()
        self.latency.labels(method).observe(seconds)
        log_request(method, status, seconds, fields, cause or error)

    def refused(self, method: str, error: BaseException, reason: str) -> None:
        """A call refused before any handler ran (a failed login, from
        `flight_server.auth.BearerAuthFactory`): counted under its method and
        status like any call, and logged with ``reason``, never the token. No
        latency: the refusal costs nothing worth timing."""
        status = status_of(error)
        self.requests.labels(method, status).inc()
        log_request(method, status, 0.0, {"reason": reason}, error)

    def stream(self, dataset: str, fields: Mapping[str, Any]) -> StreamObservation:
        """A ``do_get`` stream starts (it is watched until `StreamObservation.end`)."""
        return StreamObservation(self, dataset, dict(fields))


class StreamObservation:
    """One ``do_get``: open gauge, first batch, rows, bytes, duration, status.

    `flight_server.limits.Stream` reports its first batch and how the stream
    ended (exhausted, failed, cancelled, or dropped because the client went
    away), exactly once, with the rows and bytes it handed to gRPC."""

    def __init__(self, metrics: ServerMetrics, dataset: str, fields: dict[str, Any]) -> None:
        self._metrics = metrics
        self._dataset = dataset
        self._fields = fields
        self._began = time.perf_counter()
        self._first: float | None = None
        self._ended = threading.Event()
        metrics.streams_open.labels(dataset).inc()

    def first_batch(self) -> None:
        """The first batch is being handed to gRPC."""
        self._first = time.perf_counter() - self._began
        self._metrics.first_batch.labels(self._dataset).observe(self._first)

    def end(self, error: BaseException | None, rows: int, nbytes: int) -> None:
        """The stream ended: ``error`` is what the client got (None: every
        batch); ``rows`` and ``nbytes`` (Arrow data) are what it handed out."""
        if self._ended.is_set():
            return
        self._ended.set()
        seconds = time.perf_counter() - self._began
        status = status_of(error)
        metrics = self._metrics
        metrics.streams_open.labels(self._dataset).dec()
        metrics.stream_seconds.labels(self._dataset).observe(seconds)
        metrics.requests.labels("do_get", status).inc()
        fields = self._fields | {"rows": rows, "bytes": nbytes}
        if self._first is not None:
            fields["first_batch_seconds"] = round(self._first, 6)
        log_request("do_get", status, seconds, fields, error)


class _ServedCollector(Collector):
    """Rows and bytes served per dataset and population, read from the engine
    (`DatasetService.served`) at scrape time (its bounded population set keeps
    the labels bounded)."""

    def __init__(self, served: Served, datasets: list[str], skipped: Skipped) -> None:
        self._served = served
        self._datasets = datasets
        self._skipped = skipped

    def collect(self) -> Iterable[Metric]:
        rows = CounterMetricFamily(
            "datasetrt_rows_served", "Rows sent by do_get", labels=["dataset", "population"]
        )
        sent = CounterMetricFamily(
            "datasetrt_bytes_served",
            "Arrow bytes sent by do_get (payload, ids and columns)",
            labels=["dataset", "population"],
        )
        skipped = CounterMetricFamily(
            "datasetrt_activation_log_skipped",
            "Activation-log entries skipped as damaged or hostile (the entry before stays "
            "active; docs/operations.md)",
            labels=["dataset"],
        )
        requests, fetched = _native.object_store_reads()
        yield CounterMetricFamily(
            "datasetrt_object_store_read_requests",
            "Read requests made of object storage (ranged GETs of records and shards)",
            value=requests,
        )
        yield CounterMetricFamily(
            "datasetrt_object_store_read_bytes",
            "Bytes read from object storage (per byte served: datasetrt_bytes_served)",
            value=fetched,
        )
        yield CounterMetricFamily(
            "datasetrt_object_store_slow_downs",
            "Slow-down answers (503 SlowDown, 429) from object storage, each retried with "
            "backoff; many mean the store's request rate, not its bandwidth, holds replicas back",
            value=_native.object_store_slow_downs(),
        )
        for dataset in self._datasets:
            for served in self._served(dataset):
                labels = [dataset, served["population"]]
                rows.add_metric(labels, served["rows"])
                sent.add_metric(labels, served["bytes"])
            skipped.add_metric([dataset], self._skipped(dataset))
        yield rows
        yield sent
        yield skipped


def log_request(
    method: str, status: str, seconds: float, fields: Mapping[str, Any], error: BaseException | None
) -> None:
    """One line per request: method, status, duration and the request's fields
    (as JSON keys with ``--log-format json``)."""
    record = {"method": method, "status": status, "seconds": round(seconds, 6), **fields}
    if error is not None:
        record["error"] = str(error).splitlines()[0] if str(error) else type(error).__name__
    level = logging.INFO if status in ("OK", "CANCELLED") else logging.WARNING
    if status in ("INVALID_ARGUMENT", "NOT_FOUND", "UNAUTHENTICATED", "PERMISSION_DENIED"):
        level = logging.INFO  # the client's mistake, not the server's trouble
    text = " ".join(f"{k}={v}" for k, v in record.items() if k not in ("method", "status"))
    requests_log.log(level, "%s %s %s", method, status, text, extra={"request": record})


def request_fields(keys: Mapping[str, Any]) -> dict[str, Any]:
    """The logged subset of a request's keys."""
    fields = {"dataset": keys.get("dataset")}
    fields |= {k: keys[k] for k in LOGGED_KEYS if keys.get(k) is not None}
    return fields
