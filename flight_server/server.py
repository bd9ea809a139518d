"""`DatasetFlightServer`: the Flight RPC surface over a `Catalog`.

The per-batch path of ``do_get`` is built in Rust: the native stream is handed
to pyarrow as a ``RecordBatchReader`` and passed on to gRPC by a bare generator
(`_handed_to_grpc`), so no Python runs per batch. What was served (the ``stats``
action) is counted by the engine as each batch is handed out.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.flight as flight

import dataset_rt as drt
from dataset_rt import service as engine
from flight_server.auth import MIDDLEWARE, BearerAuthFactory, TokenFile, require_admin
from flight_server.catalog import Catalog
from flight_server.errors import ProtocolError, hide_tracebacks, to_flight_error
from flight_server.limits import DROPPED, Limits, Stream, StreamSlots, client_of
from flight_server.metrics import ServerMetrics, request_fields
from flight_server.protocol import ActionBody, PutCommand, RunAction

log = logging.getLogger("flight_server")

F = TypeVar("F", bound=Callable[..., Any])

#: FlightInfo.total_records is an int64; a longer epoch is reported as -1 (unknown).
INT64_MAX = 2**63 - 1
#: After the shutdown grace, how long cancelled streams get to notice it.
CANCEL_WAIT = 1.0

ACTIONS = {
    "set_epoch_len": 'set the active epoch length: {"dataset", "epoch_len"} (admin)',
    "list_populations": 'the stored populations and the active one: {"dataset"}',
    "remove_population": "delete a stored population that is not active (tickets that pin it "
    'get NOT_FOUND): {"dataset", "population"} (admin)',
    "claim_run": "a new generation of a training run resumed from a checkpoint (fencing): "
    '{"dataset", "run", "after", "epoch", "position", "fresh"?} -> {"generation"}',
    "check_run": "CANCELLED when a newer generation of a training run exists: "
    '{"dataset", "run", "generation"}',
    "health": "liveness and the datasets served",
    "stats": "per dataset: rows, populations, streams served, rows and bytes sent, "
    "and what was served per population (rows, bytes, groups)",
}


def _flight_errors(handler: F) -> F:
    """Translate DatasetRT and protocol errors into Flight statuses (one place),
    and observe the call: its status, duration and request fields go to the
    metrics and the request log (a ``do_get`` that starts a stream is observed
    by its stream instead, until it ends).

    The client gets the status and the message (`flight_server.errors`); the
    log keeps the error, with its traceback when it is the server's fault."""
    method = handler.__name__

    @functools.wraps(handler)
    def wrapped(self: DatasetFlightServer, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        fields = self._call_fields()
        try:
            answer = handler(self, *args, **kwargs)
        except Exception as error:
            mapped = to_flight_error(error, self.catalog.redact, dataset=fields.get("dataset"))
            if isinstance(mapped, flight.FlightInternalError | flight.FlightServerError):
                if isinstance(error, drt.DatasetRTError | flight.FlightError):
                    log.warning("%s failed: %s", method, error)
                else:  # a bug: the whole error, for the operator
                    log.error("%s failed", method, exc_info=error)
            self.metrics.call(method, time.perf_counter() - began, mapped, fields, cause=error)
            if mapped is error:
                raise
            raise mapped from None
        if method != "do_get":
            self.metrics.call(method, time.perf_counter() - began, None, fields)
        return answer

    return wrapped  # type: ignore[return-value]


@dataclass
class _PutCounter:
    """Rows and Arrow bytes of a put, counted as its batches arrive."""

    rows: int = 0
    bytes: int = 0
    #: The limit the put passed, once it has: the engine reads the batches
    #: through a C stream, which keeps only the text of this error.
    refused: ProtocolError | None = None


class DatasetFlightServer(flight.FlightServerBase):  # type: ignore[misc]
    """Serves the datasets of ``catalog`` at ``location`` (``grpc://host:port``)."""

    def __init__(
        self,
        catalog: Catalog,
        location: str = "grpc://127.0.0.1:8815",
        *,
        tokens: TokenFile | None = None,
        tls_certificates: list[tuple[bytes, bytes]] | None = None,
        advertise: list[str] | None = None,
        batch_size: int = 1024,
        prefetch_size: int = 256,
        telemetry_column: str | None = None,
        telemetry_max_groups: int = 64,
        limits: Limits | None = None,
    ) -> None:
        # First, so that bad options fail before a port is bound.
        if telemetry_max_groups < 1:
            raise ValueError(f"telemetry_max_groups must be >= 1, got {telemetry_max_groups}")
        for name in catalog.names():
            catalog.get(name).set_grouping(telemetry_column, telemetry_max_groups)
        #: The column whose values the engine counts rows of (the ``stats`` action).
        self.group_column = telemetry_column
        self.limits = limits or Limits()
        self.streams = StreamSlots(self.limits)
        hide_tracebacks()
        # Before the middleware: failed logins are counted there, before any handler.
        self.metrics = ServerMetrics(
            lambda name: catalog.get(name).served(),
            catalog.names(),
            lambda name: catalog.get(name).stats().skipped_log_entries,
        )
        middleware = (
            {MIDDLEWARE: BearerAuthFactory(tokens, on_refused=self.metrics.refused)}
            if tokens
            else None
        )
        super().__init__(location, tls_certificates=tls_certificates or [], middleware=middleware)
        parts = urlsplit(location)
        self.location = f"{parts.scheme}://{parts.hostname}:{self.port}"
        if advertise:
            self.locations = list(advertise)
        elif parts.hostname in ("0.0.0.0", "::"):
            # A wildcard address is not reachable: advertise no location, which
            # in Flight means "the server you asked" (clients reuse their connection).
            self.locations = []
        else:
            self.locations = [self.location]
        self.catalog = catalog
        # The request fields of the call this thread serves (for its log line).
        self._calls = threading.local()
        self._batch_size = batch_size
        self._prefetch_size = prefetch_size

    def _call_fields(self) -> dict[str, Any]:
        """A fresh record of this thread's call, filled by `_note`."""
        fields: dict[str, Any] = {}
        self._calls.fields = fields
        return fields

    def _note(self, **fields: Any) -> None:
        """Add request fields to the log line of the call this thread serves."""
        self._calls.fields.update(fields)

    def _note_request(self, request: engine.StreamRequest | engine.MetadataRequest) -> None:
        if isinstance(request, engine.MetadataRequest):
            self._note(dataset=request.dataset, population=request.population, metadata=True)
        else:
            self._note(**request_fields(request.to_dict()))

    # -- discovery --------------------------------------------------------------

    @_flight_errors
    def list_flights(self, context: Any, criteria: bytes) -> list[flight.FlightInfo]:
        # A list, not a generator: errors must be raised inside the error mapping.
        return [self._dataset_info(name) for name in self.catalog.names()]

    @_flight_errors
    def get_flight_info(
        self, context: Any, descriptor: flight.FlightDescriptor
    ) -> flight.FlightInfo:
        return self._flight_info(descriptor)

    @_flight_errors
    def get_schema(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.SchemaResult:
        """The schema of what a descriptor names, without a stream: a dataset
        (a path) or a stream command (those of `get_flight_info`), or a metadata
        command ``{"dataset", "metadata": true, "population"?, "columns"?}``:
        the schema of that ticket's stream (`DatasetClient.scan_metadata` asks
        it, so that a scan opens no stream only to read its schema)."""
        if descriptor.descriptor_type == flight.DescriptorType.CMD:
            parsed = engine.parse_ticket(descriptor.command)
            if isinstance(parsed, engine.MetadataRequest):
                self._note_request(parsed)
                service = self.catalog.get(parsed.dataset)
                stream = service.metadata_stream(parsed.population, parsed.columns)
                reader = pa.RecordBatchReader.from_stream(stream)
                try:
                    return flight.SchemaResult(reader.schema)
                finally:
                    reader.close()
        return flight.SchemaResult(self._flight_info(descriptor).schema)

    def _flight_info(self, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        if descriptor.descriptor_type == flight.DescriptorType.PATH:
            if len(descriptor.path) != 1:
                raise ProtocolError("a path descriptor names one dataset: [NAME]")
            return self._dataset_info(_utf8(descriptor.path[0], "the dataset name"))
        request = engine.StreamRequest.from_command(descriptor.command)
        self._note_request(request)
        limit = self.limits.max_endpoints
        if request.world_size > limit:
            raise ProtocolError(
                f"world_size {request.world_size} asks for {request.world_size} endpoints; this "
                f"server answers at most {limit} (--max-endpoints {limit}). A ticket is the "
                "command plus 'rank', the same at any world size: ask with world_size 1 and "
                "write each rank's ticket from that endpoint's ticket"
            )
        service = self.catalog.get(request.dataset)
        pinned = service.pin(request)
        endpoints = [
            flight.FlightEndpoint(pinned.for_rank(rank).to_json(), self.locations)
            for rank in range(pinned.world_size)
        ]
        epoch_len = pinned.epoch_len or 0
        total_records = epoch_len if epoch_len <= INT64_MAX else -1
        return flight.FlightInfo(_schema(service, pinned), descriptor, endpoints, total_records, -1)

    def _dataset_info(self, name: str) -> flight.FlightInfo:
        service = self.catalog.get(name)
        active = service.active()
        request = service.pin(engine.StreamRequest(dataset=name, seed=0, epoch=0))
        metadata_ticket = json.dumps({"dataset": name, "metadata": True}).encode()
        return flight.FlightInfo(
            _schema(service, request),
            flight.FlightDescriptor.for_path(name),
            [flight.FlightEndpoint(metadata_ticket, self.locations)],
            active.rows,
            -1,
        )

    # -- data -------------------------------------------------------------------

    @_flight_errors
    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        parsed = engine.parse_ticket(ticket.ticket)
        self._note_request(parsed)
        service = self.catalog.get(parsed.dataset)
        # Admitted before any work: a refused stream costs nothing.
        slot = self.streams.admit(client_of(context))
        try:
            if isinstance(parsed, engine.MetadataRequest):
                # Slices of the mapped table, one at a time: never the table whole.
                stream = service.metadata_stream(parsed.population, parsed.columns)
            else:
                # Pinned here, so that the log names the population it reads even
                # when the ticket names none (the engine pins it alike).
                request = service.pin(parsed)
                self._note_request(request)
                # Large records go to gRPC lent from their shards, no copy:
                # gRPC only sends them and lets go.
                stream = service.stream(
                    request,
                    batch_size=self._batch_size,
                    prefetch_size=self._prefetch_size,
                    lend=True,
                )
            reader = pa.RecordBatchReader.from_stream(stream)
        except BaseException:
            slot.end()
            raise
        slot.attach(stream, self.metrics.stream(parsed.dataset, self._calls.fields))
        batches = _handed_to_grpc(reader, stream, slot, self.catalog.redact, parsed.dataset)
        # pyarrow may drop a generator it never started (the client left at
        # once): its `finally` never runs, so the slot is freed with it.
        weakref.finalize(batches, slot.end)
        return flight.GeneratorStream(reader.schema, batches)

    @_flight_errors
    def do_put(
        self,
        context: Any,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        require_admin(context, "do_put")
        if descriptor.descriptor_type != flight.DescriptorType.CMD:
            raise ProtocolError('do_put needs a command descriptor: {"dataset", "activate"?}')
        command = PutCommand.parse(descriptor.command)
        self._note(dataset=command.dataset, activate=command.activate)
        service = self.catalog.get(command.dataset)
        counted = _PutCounter()
        table = self._read_put(reader, counted)
        try:
            population, rows = service.put(table, command.activate)
        except Exception:
            # Refused at a limit: that is the error, not the engine's "cannot
            # read the Arrow stream" around it.
            if counted.refused is not None:
                raise counted.refused from None
            raise
        self._note(rows=counted.rows, bytes=counted.bytes, population=population)
        log.info("%s: stored population %s (%d rows)", command.dataset, population, rows)
        # An activation sets the epoch length to the table's rows: that is the
        # answer, not the active pointer, which a later put may have replaced.
        answer = {"population": population, "rows": rows, "epoch_len": rows}
        writer.write(pa.py_buffer(json.dumps(answer).encode()))

    def _read_put(
        self, reader: flight.MetadataRecordBatchReader, counted: _PutCounter
    ) -> pa.RecordBatchReader:
        """The put's batches as they arrive, for the engine to validate and
        write one at a time (it never holds the table), refused as soon as
        they pass ``--max-put-rows`` or ``--max-put-bytes``."""
        schema = reader.schema
        if len(schema) == 0:
            raise ProtocolError(
                "the table has no columns; a population table has 'cache_id', 'sample_id', "
                "'weight' and the stored columns (a metadata ticket returns one to edit)"
            )
        limits = self.limits

        def batches() -> Iterator[pa.RecordBatch]:
            for chunk in reader:
                if chunk.data is None:
                    continue
                counted.rows += chunk.data.num_rows
                counted.bytes += chunk.data.nbytes
                if counted.rows > limits.max_put_rows:
                    counted.refused = ProtocolError(
                        f"--max-put-rows {limits.max_put_rows}: the table has more than "
                        f"{limits.max_put_rows} rows, the most this server takes in one do_put"
                    )
                elif counted.bytes > limits.max_put_bytes:
                    counted.refused = ProtocolError(
                        f"--max-put-bytes {limits.max_put_bytes}: the table has more than "
                        f"{limits.max_put_bytes} bytes of Arrow data, the most this server "
                        "takes in one do_put"
                    )
                if counted.refused is not None:
                    raise counted.refused
                yield chunk.data

        return pa.RecordBatchReader.from_batches(schema, batches())

    # -- shutdown ---------------------------------------------------------------

    def stop(self, grace: float) -> bool:
        """Stop accepting calls, let those in flight finish for up to ``grace``
        seconds, then cancel the streams that remain (UNAVAILABLE: their clients
        resume on another replica). True when every call has ended.

        A stream blocked in a gRPC write to a client that stopped reading cannot
        be cancelled from Python: then this answers False, and the caller may
        exit the process anyway (which closes the connections)."""
        done = threading.Event()

        def shutdown() -> None:  # gRPC stops accepting calls at once, then waits for them
            self.shutdown()
            done.set()

        threading.Thread(target=shutdown, name="flight-shutdown", daemon=True).start()
        if done.wait(grace):
            return True
        self.streams.close("the server is shutting down; resume the stream on another replica")
        return done.wait(CANCEL_WAIT)

    # -- actions ----------------------------------------------------------------

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return list(ACTIONS.items())

    @_flight_errors
    def do_action(self, context: Any, action: flight.Action) -> list[bytes]:
        # A list, not a generator: errors must be raised inside the error mapping.
        body = action.body.to_pybytes() if action.body is not None else b""
        # The type is the client's text: logged (cut short), never a metric label.
        self._note(action=action.type[:64])
        match action.type:
            case "set_epoch_len":
                require_admin(context, "set_epoch_len")
                parsed = ActionBody.parse(body, dataset=True, epoch_len=True)
                self._note(dataset=parsed.dataset, epoch_len=parsed.epoch_len)
                service = self.catalog.require(parsed.dataset)
                epoch_len = service.set_epoch_len(parsed.epoch_len or 0)
                answer: Any = {"dataset": parsed.dataset, "epoch_len": epoch_len}
            case "remove_population":
                require_admin(context, "remove_population")
                parsed = ActionBody.parse(body, dataset=True, epoch_len=False, population=True)
                self._note(dataset=parsed.dataset, population=parsed.population)
                service = self.catalog.require(parsed.dataset)
                service.remove_population(parsed.population or "")
                log.info("%s: removed population %s", parsed.dataset, parsed.population)
                answer = {"dataset": parsed.dataset, "removed": parsed.population}
            case "list_populations":
                parsed = ActionBody.parse(body, dataset=True, epoch_len=False)
                self._note(dataset=parsed.dataset)
                service = self.catalog.require(parsed.dataset)
                active = service.active()
                answer = {
                    "dataset": parsed.dataset,
                    "active": {
                        "population": active.population,
                        "epoch_len": active.epoch_len,
                        "rows": active.rows,
                    },
                    "populations": service.populations(),
                }
            case "claim_run":
                run = RunAction.parse(body, claim=True)
                self._note(dataset=run.dataset, run=run.run)
                generation = self.catalog.require(run.dataset).claim_run(
                    run.run,
                    after=run.after,
                    epoch=run.epoch,
                    position=run.position,
                    fresh=run.fresh,
                )
                log.info("%s: run %s resumed as generation %d", run.dataset, run.run, generation)
                answer = {"dataset": run.dataset, "run": run.run, "generation": generation}
            case "check_run":
                run = RunAction.parse(body, claim=False)
                self._note(dataset=run.dataset, run=run.run)
                self.catalog.require(run.dataset).check_run(run.run, run.generation)
                answer = {"dataset": run.dataset, "run": run.run, "generation": run.generation}
            case "health":
                answer = {"status": "ok", "datasets": self.catalog.names()}
            case "stats":
                answer = {}
                for name in self.catalog.names():
                    service = self.catalog.get(name)
                    stats = service.stats()
                    answer[name] = {
                        "rows": service.active().rows,
                        "populations": len(service.populations()),
                        "streams": stats.streams,
                        "rows_sent": stats.rows_sent,
                        "bytes_sent": stats.bytes_sent,
                        "skipped_log_entries": stats.skipped_log_entries,
                        "group_column": self.group_column,
                        "served": service.served(),
                    }
            case other:
                raise ProtocolError(f"unknown action {other!r}; the actions are {sorted(ACTIONS)}")
        return [json.dumps(answer).encode()]


def _schema(service: engine.DatasetService, request: engine.StreamRequest) -> pa.Schema:
    """The stream's schema, checking on the way that the request can be served.

    Read through the Arrow C interface: ``pa.table`` of a foreign object asks
    whether it is a pandas DataFrame first, and that imports pandas (2 s) on a
    fresh server's first request (issue 47)."""
    return pa.RecordBatchReader.from_stream(service.schema(request)).schema


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"{what} is not UTF-8") from None


def _handed_to_grpc(
    reader: pa.RecordBatchReader,
    stream: engine.BatchStream,
    slot: Stream,
    redact: Callable[[str], str],
    dataset: str,
) -> Iterator[pa.RecordBatch]:
    """The reader's batches for a ``flight.GeneratorStream``, with no Python per
    batch: after the first (observed for the metrics), ``yield from`` hands
    each batch from the native reader to gRPC. Not `RecordBatchStream(reader)`:
    an error met inside a C stream reader would leave as INVALID_ARGUMENT or
    UNKNOWN; here it gets the status of its error class (INTERNAL for damage
    and internal failures, so that the client resumes on another replica), or
    the slot's own error when the slot cancelled the stream."""
    outcome: BaseException | None = DROPPED
    try:
        batches = iter(reader)
        for batch in batches:
            slot.first_batch()
            yield batch
            break
        yield from batches
        outcome = None
    except pa.ArrowException as error:
        outcome = slot.cancelled or _typed(error, stream, redact, dataset)
        raise outcome from None
    finally:
        reader.close()
        slot.end(outcome)


def _typed(
    error: pa.ArrowException,
    stream: engine.BatchStream,
    redact: Callable[[str], str],
    dataset: str,
) -> Exception:
    """The Flight error of a failure met while streaming (a corrupt record, a
    failed worker): its engine class when the native stream kept it."""
    try:
        stream.raise_failure()
    except Exception as typed:
        log.warning("do_get failed while streaming: %s", typed)
        return to_flight_error(typed, redact, dataset=dataset)
    log.warning("do_get failed while streaming: %s", error)
    internal: Exception = flight.FlightInternalError(f"the stream failed: {error}")
    return internal
