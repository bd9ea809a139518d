"""`DatasetClient`: metadata round trips, epoch partitions, resume and failover.

Everything here is plain ``pyarrow.flight`` (see docs/flight-protocol.md); the
client adds ergonomics: Polars in and out, per-sample iteration, and resuming a
broken stream on the next location with the offset it has reached, so the
delivered sequence is the same as an uninterrupted one.

Every call that talks to a server runs inside `_server_errors`: a server's
refusal is raised as the library's class (``flight_client.errors``, also the
pyarrow class it arrived as) with the server's one-line message (docs/errors.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, NamedTuple

import polars as pl
import pyarrow as pa
import pyarrow.flight as flight

from dataset_rt.config import ShuffleMode
from dataset_rt.errors import InvalidArgumentError
from dataset_rt.lazy import StreamedTable, scan_batches, streamed
from dataset_rt.partition import Partition, as_partition
from dataset_rt.progress import Bar, progress_bar, shows
from dataset_rt.service import BASE_COLUMNS, StreamRequest, parse_ticket
from flight_client.errors import server_error
from flight_client.substreams import MAX_STREAMS, interleaved

# Statuses after which another location (or the same one, later) can serve the
# ticket. INVALID_ARGUMENT, NOT_FOUND and auth errors are final.
RETRYABLE = (flight.FlightUnavailableError, flight.FlightTimedOutError, flight.FlightInternalError)

# A streamed put is sent in messages of at most this many Arrow bytes (a batch
# larger than it is sliced): gRPC messages stay bounded.
PUT_MESSAGE_BYTES = 4 << 20


class EveryLocationFailedError(ConnectionError):
    """No location could serve a call or a stream within the retry budget; its
    ``__cause__`` is the last location's error (a library class when the server
    named one: ``StoreUnavailableError``, ``CorruptCacheError``, ...)."""


class EpochSample(NamedTuple):
    cache_id: int
    sample_id: int
    payload: bytes | None  # None in an ids-only stream (payload=False)
    metadata: dict[str, Any]
    position: int


class DatasetClient:
    """A client of one DatasetRT Flight service (one location or several replicas).

    ``location`` is a URI (``grpc://host:8815``, ``grpc+tls://...``) or a list of
    replica URIs. ``token`` is a bearer token; ``tls_root_certs`` PEM bytes to
    trust. ``retries`` bounds how many times each location is tried for one
    stream, with exponential backoff from ``backoff`` up to ``max_backoff``
    seconds.
    """

    def __init__(
        self,
        location: str | Sequence[str],
        token: str | None = None,
        tls_root_certs: bytes | None = None,
        *,
        retries: int = 3,
        backoff: float = 0.1,
        max_backoff: float = 2.0,
    ) -> None:
        self.locations = [location] if isinstance(location, str) else list(location)
        if not self.locations:
            raise ValueError("at least one location is required")
        if retries < 1:
            raise ValueError(f"retries must be >= 1, got {retries}")
        headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self._options = flight.FlightCallOptions(headers=headers)
        self._tls_root_certs = tls_root_certs
        self._clients: dict[str, flight.FlightClient] = {}
        self._retries = retries
        self._backoff = backoff
        self._max_backoff = max_backoff
        #: (time.monotonic(), location, error) of every stream that broke and was
        #: retried elsewhere: what happened, for logs and failover measurements.
        self.failovers: list[tuple[float, str, str]] = []
        #: Each stream failover in words (where it broke, at which offset, where it
        #: resumed): what a training loader logs at WARNING in the trainer.
        self.failover_notes: list[str] = []

    def _client(self, location: str) -> flight.FlightClient:
        if location not in self._clients:
            kwargs: dict[str, Any] = {}
            if self._tls_root_certs is not None:
                kwargs["tls_root_certs"] = self._tls_root_certs
            self._clients[location] = flight.connect(location, **kwargs)
        return self._clients[location]

    def _call(self, method: str, *args: Any, lazy: bool = False) -> Any:
        """Run a call on the first location that answers.

        ``lazy`` results (``list_flights``, ``do_action``) are iterators that fail
        only when read, so they are read here, inside the failover loop.
        """
        errors: list[str] = []
        last: BaseException | None = None
        for location in self.locations:
            try:
                with _server_errors():
                    result = getattr(self._client(location), method)(*args, options=self._options)
                    return list(result) if lazy else result
            except RETRYABLE as error:
                errors.append(f"{location}: {type(error).__name__}: {error}")
                last = error
                self._clients.pop(location, None)
        raise EveryLocationFailedError("every location failed: " + "; ".join(errors)) from last

    def _action(self, kind: str, body: dict[str, Any] | None = None) -> Any:
        payload = json.dumps(body).encode() if body is not None else b""
        results = self._call("do_action", flight.Action(kind, payload), lazy=True)
        return json.loads(results[0].body.to_pybytes())

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def __enter__(self) -> DatasetClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- datasets and populations ----------------------------------------------

    def datasets(self) -> list[str]:
        infos = self._call("list_flights", lazy=True)
        return [info.descriptor.path[0].decode() for info in infos]

    def health(self) -> dict[str, Any]:
        return dict(self._action("health"))

    def stats(self) -> dict[str, Any]:
        return dict(self._action("stats"))

    def populations(self, dataset: str) -> dict[str, Any]:
        return dict(self._action("list_populations", {"dataset": dataset}))

    def get_metadata(
        self, dataset: str, population: str | None = None, *, show_progress: bool = True
    ) -> pl.DataFrame:
        """A stored population (the active one by default) as a Polars DataFrame.
        While it arrives, a progress bar of the rows read is drawn on stderr when
        it is a terminal (``show_progress=False``: never)."""
        ticket: dict[str, Any] = {"dataset": dataset, "metadata": True}
        if population is not None:
            ticket["population"] = population
        reader = self._call("do_get", flight.Ticket(json.dumps(ticket).encode()))
        with _server_errors():
            if not shows(show_progress):
                return pl.DataFrame(reader.read_all())
            batches = []

            def total() -> int | None:
                return self._population_rows(dataset, population)

            with progress_bar(f"read {dataset}", total) as advance:
                for chunk in reader:
                    if chunk.data is not None:
                        batches.append(chunk.data)
                        advance(chunk.data.num_rows)
            return pl.DataFrame(pa.Table.from_batches(batches, schema=reader.schema))

    def scan_metadata(
        self, dataset: str, population: str | None = None, *, show_progress: bool = True
    ) -> pl.LazyFrame:
        """A stored population (the active one by default) as a Polars LazyFrame.

        The population is pinned now (the active one's id is asked for), so the
        frame always reads the same rows, and its schema is the metadata stream's,
        read without rows. Every query streams the metadata ticket and applies its
        filter, projection and row limit batch by batch as the batches arrive (a
        broken stream resumes on the next location, after the rows it delivered);
        ``scan_metadata(d).collect()`` equals ``get_metadata(d)``. A query is
        sent only the columns it reads (its projection and its filter's): the
        ticket names them. While a query reads, a progress bar of the rows read
        is drawn on stderr when it is a terminal (``show_progress=False``: never).
        """
        rows: int | None = None
        if population is None:
            active = self.populations(dataset)["active"]
            population, rows = str(active["population"]), int(active["rows"])
        body: dict[str, Any] = {"dataset": dataset, "metadata": True, "population": population}
        schema = self._metadata_schema(json.dumps(body).encode())

        def open_batches(columns: list[str] | None) -> Iterator[pa.RecordBatch]:
            query = body if columns is None else {**body, "columns": columns}
            return self._metadata_batches(flight.Ticket(json.dumps(query).encode()))

        pinned = population

        def total() -> int | None:
            return rows if rows is not None else self._population_rows(dataset, pinned)

        return scan_batches(
            schema,
            open_batches,
            name=f"flight population {dataset}/{population}",
            progress=(f"scan {dataset}", total) if show_progress else None,
        )

    def _population_rows(self, dataset: str, population: str | None) -> int | None:
        """The rows of ``population`` (None: the active one) when the server says
        them (it does for the active population only): a progress bar's total."""
        active = self.populations(dataset)["active"]
        return int(active["rows"]) if population in (None, active["population"]) else None

    def _metadata_schema(self, command: bytes) -> pa.Schema:
        """The schema of a metadata ticket's stream, asked with ``get_schema``:
        no stream is opened only to be cancelled (the server would log the
        request CANCELLED, a fenced run's status).

        When ``get_schema`` fails, the stream is opened for its schema instead,
        as before: pyarrow raises ``get_schema``'s failures without their Flight
        class (a bare ``OSError`` or ``ArrowException``), while ``do_get`` raises
        them with it (UNAVAILABLE goes on to the next location, a user error
        does not), and a server older than ``get_schema`` answers UNIMPLEMENTED."""
        errors: list[str] = []
        last: BaseException | None = None
        descriptor = flight.FlightDescriptor.for_command(command)
        for location in self.locations:
            try:
                client = self._client(location)
                with suppress(OSError, pa.ArrowException):
                    return client.get_schema(descriptor, options=self._options).schema
                with _server_errors():
                    reader = client.do_get(flight.Ticket(command), options=self._options)
                    try:
                        return reader.schema
                    finally:
                        with suppress(flight.FlightError, pa.ArrowException):
                            reader.cancel()
            except RETRYABLE as error:
                errors.append(f"{location}: {type(error).__name__}: {error}")
                last = error
                self._clients.pop(location, None)
        raise EveryLocationFailedError("every location failed: " + "; ".join(errors)) from last

    def _metadata_batches(self, ticket: flight.Ticket) -> Iterator[pa.RecordBatch]:
        """A (pinned) metadata ticket's batches as they arrive; after a failure the
        stream is read again on the next location and the rows already delivered
        are skipped (a stored population is immutable)."""
        delivered = 0
        failures: list[str] = []
        last: BaseException | None = None
        attempts = self._retries * len(self.locations)
        for attempt in range(attempts):
            location = self.locations[attempt % len(self.locations)]
            reader = None
            try:
                with _server_errors():
                    reader = self._client(location).do_get(ticket, options=self._options)
                    skip = delivered
                    for chunk in reader:
                        batch = chunk.data
                        if skip >= batch.num_rows:
                            skip -= batch.num_rows
                            continue
                        batch, skip = batch.slice(skip), 0
                        delivered += batch.num_rows
                        yield batch
                    reader = None
                    return
            except RETRYABLE as error:
                failures.append(f"{location}: {type(error).__name__}: {error}")
                last = error
                self.failovers.append((time.monotonic(), location, _status(error)))
                self._clients.pop(location, None)
                reader = None
                if attempt + 1 < attempts:
                    time.sleep(
                        min(
                            self._backoff * 2 ** (attempt // len(self.locations)), self._max_backoff
                        )
                    )
            finally:
                if reader is not None:  # the query stopped early: free the server's stream
                    with suppress(flight.FlightError, pa.ArrowException):
                        reader.cancel()
        raise EveryLocationFailedError(
            f"every location failed after {attempts} attempts: " + "; ".join(failures[-5:])
        ) from last

    def update_metadata(
        self, dataset: str, table: Any, *, activate: bool = True, show_progress: bool = True
    ) -> str:
        """Validate and store ``table`` on the server; returns the population id.

        ``table`` is any Arrow stream exporter (a Polars DataFrame, a pyarrow
        Table), a Polars LazyFrame, or the path of a Parquet file or directory.
        A LazyFrame runs on Polars' streaming engine and each batch is written to
        the ``do_put`` stream as it comes; a Parquet path is read and sent batch
        by batch: neither is collected here. If it fails midway, its error is
        raised and the server stores nothing. A put is not retried once its
        table is being sent (it may be a stream that cannot be read twice): a
        refusal is raised as its library class, such as ``InvalidPopulationError``.
        While the table is sent, and the server validates and stores it, a
        progress bar of the rows sent is drawn on stderr when it is a terminal
        (``show_progress=False``: never).
        """
        descriptor = flight.FlightDescriptor.for_command(
            json.dumps({"dataset": dataset, "activate": activate})
        )
        label = f"put {dataset}"
        source = streamed(table, nullable=True)
        if source is not None:
            with progress_bar(label, source.rows, enabled=show_progress) as sent:
                return self._put_streamed(descriptor, source, sent, label)
        arrow = pa.table(table)
        writer, reader = self._call("do_put", descriptor, arrow.schema)
        # Closing the writer (leaving the ``with``) raises the server's refusal;
        # ``reader.read()`` then answered nothing.
        with (
            progress_bar(label, lambda: arrow.num_rows, enabled=show_progress) as sent,
            _server_errors(),
            writer,
        ):
            # In bounded messages, as a streamed put: a DataFrame is often one
            # chunk, and one message of the whole table would be held whole by
            # gRPC on both ends (a 10^7-row table: 320 MB).
            for batch in arrow.to_batches():
                for piece in _bounded(batch, PUT_MESSAGE_BYTES):
                    writer.write_batch(piece)
                    sent(piece.num_rows)
            sent.describe(f"{label}: sent; the server stores it")
            writer.done_writing()
            answer = reader.read()
        return str(json.loads(answer.to_pybytes())["population"])

    def put(
        self, dataset: str, table: Any, *, activate: bool = True, show_progress: bool = True
    ) -> str:
        """Alias of `update_metadata` (the name of ``LocalSource.put``)."""
        return self.update_metadata(dataset, table, activate=activate, show_progress=show_progress)

    def _put_streamed(
        self, descriptor: flight.FlightDescriptor, source: StreamedTable, sent: Bar, label: str
    ) -> str:
        writer, reader = self._call("do_put", descriptor, source.schema)
        batches = source.batches()
        with _server_errors():
            try:
                for batch in batches:
                    for piece in _bounded(batch, PUT_MESSAGE_BYTES):
                        writer.write_batch(piece)
                        sent(piece.num_rows)
                sent.describe(f"{label}: sent; the server stores it")
                writer.done_writing()
                answer = reader.read()
            except BaseException:
                _abandon_put(writer, source.schema)
                raise
            writer.close()  # raises the server's refusal (then ``answer`` is None)
        return str(json.loads(answer.to_pybytes())["population"])

    def set_epoch_len(self, dataset: str, epoch_len: int) -> int:
        answer = self._action("set_epoch_len", {"dataset": dataset, "epoch_len": epoch_len})
        return int(answer["epoch_len"])

    def claim_run(
        self, dataset: str, run: str, *, after: int, epoch: int, position: int, fresh: bool = False
    ) -> int:
        """The generation a resume of training run ``run`` gets (recorded by the
        server in the store its replicas share); see docs/training.md, "Fencing"."""
        body = {"dataset": dataset, "run": run, "after": after}
        body |= {"epoch": epoch, "position": position, "fresh": fresh}
        return int(self._action("claim_run", body)["generation"])

    def check_run(self, dataset: str, run: str, generation: int) -> None:
        """``FencedError`` when a newer generation of training run ``run`` exists."""
        self._action("check_run", {"dataset": dataset, "run": run, "generation": generation})

    def remove_population(self, dataset: str, population: str) -> None:
        """Delete a stored population that is not active (admin); tickets that
        pin it get NOT_FOUND from then on."""
        self._action("remove_population", {"dataset": dataset, "population": population})

    # -- epochs -----------------------------------------------------------------

    def epoch_info(
        self,
        dataset: str,
        seed: int,
        epoch: int,
        partition: Partition | None = None,
        *,
        epoch_len: int | None = None,
        shuffle: ShuffleMode = True,
        population: str | None = None,
        columns: Sequence[str] = (),
        payload: bool = True,
        **partition_keys: int | None,
    ) -> flight.FlightInfo:
        """The epoch's `FlightInfo`: one self-contained ticket per rank (of
        ``partition``'s world size, range and block; its rank and offset are the
        tickets'). The keyword arguments ``world_size=``, ``start=``, ``stop=``
        and ``block=`` are deprecated: they still build the partition for one
        release, with a `DeprecationWarning`."""
        chosen = as_partition(
            partition,
            partition_keys,
            method="DatasetClient.epoch_info",
            takes=("world_size", "start", "stop", "block"),
        )
        keys = chosen.to_dict()
        del keys["rank"], keys["offset"]
        request = StreamRequest(
            dataset=dataset,
            seed=seed,
            epoch=epoch,
            shuffle=shuffle,
            **keys,
            columns=list(columns),
            epoch_len=epoch_len,
            population=population,
            payload=payload,
        )
        return self.flight_info(request)

    def flight_info(self, request: StreamRequest) -> flight.FlightInfo:
        """``get_flight_info`` of a `StreamRequest` (a command: no rank or offset)."""
        descriptor = flight.FlightDescriptor.for_command(request.to_json())
        return self._call("get_flight_info", descriptor)

    def pin(self, request: StreamRequest) -> tuple[StreamRequest, list[str]]:
        """``request`` as the server pins it (its population and epoch length
        filled in), as rank 0's ticket, and the locations that serve it.

        The server is asked at world size 1 and the ticket rewritten to the
        request's world size: a ticket is the command plus its rank at any world
        size, so the answer stays one endpoint however many ranks the job has
        (a server answers at most ``--max-endpoints``, and every rank asking for
        every rank's endpoint would cost the server the square of the ranks)."""
        command = request.replace(rank=None, offset=None, world_size=1)
        info = self.flight_info(command)
        endpoint = info.endpoints[0]
        ticket = parse_ticket(endpoint.ticket.ticket)
        if not isinstance(ticket, StreamRequest) or ticket.population is None:
            raise EveryLocationFailedError(f"the server answered with an unpinned {ticket!r}")
        pinned = ticket.replace(world_size=request.world_size)
        locations = [
            loc.uri.decode() if isinstance(loc.uri, bytes) else str(loc.uri)
            for loc in endpoint.locations
        ]
        return pinned, locations

    def epoch(
        self,
        dataset: str,
        seed: int,
        epoch: int,
        partition: Partition | None = None,
        *,
        columns: Sequence[str] = (),
        batches: bool = False,
        epoch_len: int | None = None,
        shuffle: ShuffleMode = True,
        population: str | None = None,
        payload: bool = True,
        streams: int = 1,
        **partition_keys: int | None,
    ) -> Iterator[Any]:
        """One rank's samples of ``epoch`` (record batches with ``batches=True``).

        ``partition`` (a `dataset_rt.Partition`; the whole epoch when None) says
        which, as in docs/flight-protocol.md; ``payload=False`` streams ids and
        columns only. The population and epoch length are pinned when the
        iteration starts; a stream broken by a lost server resumes on the next
        location from the offset reached. The partition's keys as keyword
        arguments (``rank=``, ``world_size=``, ``start=``, ``stop=``,
        ``block=``, ``offset=``) are deprecated: they still build the partition
        for one release, with a `DeprecationWarning`.

        ``streams=K`` reads the rank's stream as K interleaved sub-streams, each
        from the next of the endpoint's locations and each resumed on another
        after a failure, merged back in order (`flight_client.substreams`): the
        same rows as one stream, over K connections.
        """
        if isinstance(streams, bool) or not isinstance(streams, int):
            raise InvalidArgumentError(
                f"'streams' must be an integer from 1 to {MAX_STREAMS}, got {streams!r}"
            )
        if not 1 <= streams <= MAX_STREAMS:
            raise InvalidArgumentError(
                f"'streams' must be from 1 to {MAX_STREAMS} (sub-streams of one rank), "
                f"got {streams}"
            )
        # The partition's rules (rank < world_size, ...) are checked here, in
        # the engine, before anything is sent.
        chosen = as_partition(partition, partition_keys, method="DatasetClient.epoch")
        request = StreamRequest(
            dataset=dataset,
            seed=seed,
            epoch=epoch,
            shuffle=shuffle,
            **chosen.to_dict(),
            columns=list(columns),
            epoch_len=epoch_len,
            population=population,
            payload=payload,
        )
        pinned, advertised = self.pin(request)
        ticket = pinned.for_rank(chosen.rank).resumed(chosen.offset)
        # The endpoint's replicas first, then the client's own locations.
        locations = list(dict.fromkeys(advertised + self.locations))
        # Spread ranks over the replicas: rank r starts at location r mod n.
        first = chosen.rank % len(locations)
        locations = locations[first:] + locations[:first]
        stream = interleaved(self.stream_ticket, ticket, streams, locations)
        return stream if batches else _samples(stream)

    def stream_ticket(
        self, ticket: StreamRequest | dict[str, Any], locations: Sequence[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Stream a ticket, resuming on another location after a failure.

        ``ticket`` is a `StreamRequest` with a rank (an endpoint's ticket, parsed
        with ``dataset_rt.service.parse_ticket``) or the same keys as a dict.
        """
        if isinstance(ticket, dict):
            ticket = StreamRequest(**{"rank": 0, **ticket})
        locations = list(locations or self.locations)
        delivered = 0
        failures: list[str] = []
        last: BaseException | None = None
        attempts = self._retries * len(locations)
        for attempt in range(attempts):
            location = locations[attempt % len(locations)]
            resumed = ticket.resumed(ticket.offset + delivered)
            try:
                with _server_errors():
                    reader = self._client(location).do_get(
                        flight.Ticket(resumed.to_json()), options=self._options
                    )
                    for chunk in reader:
                        batch = chunk.data
                        delivered += batch.num_rows
                        yield batch
                    return
            except RETRYABLE as error:
                failures.append(f"{location}: {type(error).__name__}: {error}")
                last = error
                self.failovers.append((time.monotonic(), location, _status(error)))
                self._clients.pop(location, None)
                if attempt + 1 < attempts:
                    self.failover_notes.append(
                        f"rank {ticket.rank}'s stream from {location} broke "
                        f"({type(error).__name__}) at offset {ticket.offset + delivered}; "
                        f"resuming there on {locations[(attempt + 1) % len(locations)]}"
                    )
                    time.sleep(
                        min(self._backoff * 2 ** (attempt // len(locations)), self._max_backoff)
                    )
        raise EveryLocationFailedError(
            f"every location failed after {attempts} attempts: " + "; ".join(failures[-5:])
        ) from last


@contextmanager
def _server_errors() -> Iterator[None]:
    """Raise a pyarrow error of a call as `flight_client.errors.server_error`
    makes it: the library's class the server named, with the server's message.
    The classes stay subclasses of the pyarrow ones, so the failover's
    ``except RETRYABLE`` sees the same statuses."""
    try:
        yield
    except (flight.FlightError, pa.ArrowException) as error:
        translated = server_error(error)
        if translated is error:
            raise
        raise translated from None


def _status(error: BaseException) -> str:
    """The name of the pyarrow class (the status) ``error`` arrived as."""
    return next(
        cls.__name__
        for cls in type(error).__mro__
        if cls.__module__.startswith("pyarrow") or cls is BaseException
    )


def _bounded(batch: pa.RecordBatch, max_bytes: int) -> Iterator[pa.RecordBatch]:
    """``batch`` in slices of about ``max_bytes`` Arrow bytes at most."""
    if batch.nbytes <= max_bytes or batch.num_rows <= 1:
        yield batch
        return
    rows = max(1, batch.num_rows * max_bytes // batch.nbytes)
    for start in range(0, batch.num_rows, rows):
        yield batch.slice(start, rows)


def _abandon_put(writer: flight.FlightStreamWriter, schema: pa.Schema) -> None:
    """End a put whose table failed midway so that the server stores nothing.

    pyarrow cannot cancel a ``do_put``: closing or dropping its writer ends the
    stream cleanly, and the server would store the rows sent so far. So the
    stream ends with one row whose identities are null, which the server refuses
    with the whole table (null identities are never valid: docs/flight-protocol.md,
    "Populations"); the caller raises the source's own error. Failures here (the
    server already refused the put, the connection is gone) change nothing.
    """
    with suppress(Exception):
        writer.write_batch(
            pa.RecordBatch.from_arrays([pa.nulls(1, field.type) for field in schema], schema=schema)
        )
        writer.done_writing()
    with suppress(Exception):
        writer.close()


def _samples(batches: Iterator[pa.RecordBatch]) -> Iterator[EpochSample]:
    for batch in batches:
        columns = batch.to_pydict()
        names = [n for n in batch.schema.names if n not in BASE_COLUMNS]
        for i in range(batch.num_rows):
            yield EpochSample(
                cache_id=columns["cache_id"][i],
                sample_id=columns["sample_id"][i],
                payload=columns["payload"][i] if "payload" in columns else None,
                metadata={name: columns[name][i] for name in names},
                position=columns["position"][i],
            )
