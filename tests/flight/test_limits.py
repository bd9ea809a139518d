"""What one request, one stream or one client may cost (issue 10): the endpoint
limit of ``get_flight_info``, the stream limits (total, per client, the idle
deadline), the put limits, and a shutdown that does not wait for idle clients.

Every loop is bounded in count and time; idle streams are cancelled and their
clients closed before a server shuts down.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from conftest import ListSource, make_records, write

from dataset_rt import Partition
from dataset_rt.service import StreamRequest
from flight_client import DatasetClient, FlightSource
from flight_server import Catalog, cli
from flight_server.auth import TokenFile
from flight_server.limits import Limits, peer_address
from flight_server.server import _PutCounter

from .conftest import DATASET, ROWS, active, command, message, metadata, populations, put, serve
from .conftest import ticket as make_ticket
from .test_server_cli import ServerProcess, run_cli

WAIT = 30.0  # the most any one step below may take
LONG = {"dataset": DATASET, "seed": 7, "epoch": 0, "epoch_len": 10**7}  # never read to the end
EPOCH = {"dataset": DATASET, "seed": 7, "epoch": 1, "epoch_len": 3000}


def options(token: str | None = None) -> flight.FlightCallOptions:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return flight.FlightCallOptions(timeout=WAIT, headers=headers)


class IdleClient:
    """A client that opens streams, takes one batch of each and then reads nothing."""

    def __init__(self, location: str, token: str | None = None) -> None:
        self.client = flight.connect(location)
        self.options = options(token)
        self.readers: list[flight.FlightStreamReader] = []

    def open(self, body: dict[str, Any] = LONG) -> flight.FlightStreamReader:
        reader = self.client.do_get(make_ticket(body), options=self.options)
        assert reader.read_chunk().data.num_rows > 0
        self.readers.append(reader)
        return reader

    def close(self) -> None:
        for reader in self.readers:
            reader.cancel()
        self.readers.clear()
        self.client.close()


class IdleClients:
    """The idle clients of a test: inside ``with serve(...)``, so that they are
    closed (their streams cancelled) before the server shuts down, which waits
    for them."""

    def __init__(self) -> None:
        self._made: list[IdleClient] = []

    def new(self, location: str, token: str | None = None) -> IdleClient:
        self._made.append(IdleClient(location, token))
        return self._made[-1]

    def __enter__(self) -> IdleClients:
        return self

    def __exit__(self, *exc: object) -> None:
        for idle in self._made:
            idle.close()


def timed_epoch(location: str, token: str | None = None) -> float:
    """Seconds a fresh client takes to read ``EPOCH`` whole."""
    began = time.monotonic()
    with flight.connect(location) as client:
        table = client.do_get(make_ticket(EPOCH), options=options(token)).read_all()
    assert table.num_rows == EPOCH["epoch_len"]
    return time.monotonic() - began


def read_at_most(reader: flight.FlightStreamReader, batches: int) -> None:
    for _ in range(batches):
        reader.read_chunk()


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.1)


# -- get_flight_info: the endpoint limit ---------------------------------------------


def test_world_size_beyond_the_endpoint_limit_is_invalid_argument(catalog: Catalog) -> None:
    with (
        serve(catalog, limits=Limits(max_endpoints=8)) as server,
        flight.connect(server.location) as raw,
    ):
        body = {"dataset": DATASET, "seed": 1, "epoch": 0, "world_size": 8}
        assert len(raw.get_flight_info(command(body)).endpoints) == 8
        with pytest.raises(pa.ArrowInvalid) as error:
            raw.get_flight_info(command(body | {"world_size": 9}))
        text = message(error.value)
        assert "world_size 9" in text
        assert "--max-endpoints 8" in text
        assert "world_size 1" in text  # how to get tickets for more ranks


@pytest.mark.parametrize("world_size", [10**6, 2**32])
def test_a_huge_world_size_is_refused_before_any_work(
    raw: flight.FlightClient, world_size: int
) -> None:
    body = {"dataset": DATASET, "seed": 1, "epoch": 0, "world_size": world_size}
    began = time.monotonic()
    with pytest.raises(pa.ArrowInvalid, match="--max-endpoints 65536"):
        raw.get_flight_info(command(body), options=options())
    assert time.monotonic() - began < WAIT  # it took 37 s and 1.5 GiB for 10**6


def test_a_rank_beyond_the_endpoint_limit_streams_from_a_ticket_written_by_the_client(
    catalog: Catalog,
) -> None:
    """The documented way around the limit: a world_size 1 ticket, with the rank's keys."""
    with (
        serve(catalog, limits=Limits(max_endpoints=2)) as server,
        flight.connect(server.location) as raw,
    ):
        body = {"dataset": DATASET, "seed": 1, "epoch": 0}
        (endpoint,) = raw.get_flight_info(command(body)).endpoints
        keys = json.loads(endpoint.ticket.ticket)
        ranks = [
            raw.do_get(make_ticket(keys | {"world_size": 3, "rank": r})).read_all()
            for r in range(3)
        ]
        positions = sorted(p for t in ranks for p in t.column("position").to_pylist())
        assert positions == list(range(ROWS // 3 * 3))


def test_the_client_streams_any_rank_of_any_world_size_from_one_endpoint(
    catalog: Catalog,
) -> None:
    """`DatasetClient.epoch` and `FlightSource` ask at world size 1 (one endpoint),
    so a job's size is not bounded by --max-endpoints, and the stream is the
    one a full answer's endpoint would give."""
    base = {"dataset": DATASET, "seed": 1, "epoch": 0}
    body = base | {"world_size": 3}
    with (
        serve(catalog, limits=Limits(max_endpoints=3)) as server,
        flight.connect(server.location) as raw,
        DatasetClient(server.location) as client,
    ):
        full = [
            raw.do_get(e.ticket).read_all() for e in raw.get_flight_info(command(body)).endpoints
        ]
        for rank, expected in enumerate(full):
            third = Partition(rank=rank, world_size=3)
            got = pa.Table.from_batches(list(client.epoch(**base, partition=third, batches=True)))
            assert got.equals(expected.select(got.column_names))
        huge = {"dataset": DATASET, "seed": 1, "epoch": 0, "epoch_len": 2**40}
        for rank in (0, 2**20 - 1):
            share = Partition(rank=rank, world_size=2**20)
            batches = client.epoch(**huge, partition=share, batches=True)
            first = next(iter(batches))
            assert first.column("position")[0].as_py() == rank
            batches.close()  # type: ignore[attr-defined]
        source = FlightSource(server.location)
        pinned = source.resolve(StreamRequest(**huge, world_size=2**20))
        assert (pinned.world_size, pinned.rank, pinned.epoch_len) == (2**20, 0, 2**40)


# -- do_get: stream slots ------------------------------------------------------------


def test_streams_beyond_the_per_client_limit_are_unavailable(catalog: Catalog) -> None:
    """Without tokens a client is its address: every loopback client is one client."""
    limits = Limits(max_streams=10, max_streams_per_client=3, stream_idle_timeout=60)
    with serve(catalog, limits=limits) as server, IdleClients() as clients:
        idle = clients.new(server.location)
        for _ in range(3):
            idle.open()
        with pytest.raises(flight.FlightUnavailableError) as error:
            idle.open()
        assert "--max-streams-per-client 3" in message(error.value)
        other = clients.new(server.location)  # another connection, the same address
        with pytest.raises(flight.FlightUnavailableError):
            other.open({"dataset": DATASET, "metadata": True})
        assert server.streams.counts() == {"open": 3, "stalled": 0}
        # Unary calls are not streams: still answered.
        assert active(other.client)["rows"] == ROWS


TOKENS = {name: f"{name}-token-0123456789abcdef" for name in ("a", "b", "c", "d", "e")}


def test_idle_streams_are_bounded_refused_and_freed_at_their_deadline(catalog: Catalog) -> None:
    """Clients that open streams and never read them: over-limit streams are refused
    (per client = per token, and in total), a normal client is still served, and
    after the idle deadline the server's slots are free again (an idle client's
    own slots stay taken until it reads or leaves)."""
    idle_timeout = 2.0
    limits = Limits(max_streams=8, max_streams_per_client=3, stream_idle_timeout=idle_timeout)
    tokens = TokenFile(tuple((token, "read") for token in TOKENS.values()))
    with serve(catalog, tokens=tokens, limits=limits) as server, IdleClients() as clients:
        location = server.location
        alone = timed_epoch(location, TOKENS["c"])

        a, b, d, e = (clients.new(location, TOKENS[name]) for name in "abde")
        for _ in range(3):
            b.open()
        refused = []
        for _ in range(10):
            try:
                a.open()
            except flight.FlightUnavailableError as error:
                refused.append(message(error))
        assert len(a.readers) == 3
        assert len(refused) == 7
        assert all("--max-streams-per-client 3" in text for text in refused)
        assert server.streams.counts()["open"] == 6

        # A normal client is served while six streams sit idle (both timings are
        # printed; only a generous bound is asserted, never a ratio).
        loaded = timed_epoch(location, TOKENS["c"])
        print(f"an epoch alone: {alone:.3f} s; beside 6 idle streams: {loaded:.3f} s")
        assert loaded < WAIT

        d.open()
        d.open()
        with pytest.raises(flight.FlightUnavailableError) as total:
            timed_epoch(location, TOKENS["c"])
        assert "--max-streams 8" in message(total.value)

        # The idle deadline cancels all eight and frees the server's slots.
        wait_until(
            lambda: server.streams.counts() == {"open": 0, "stalled": 8},
            idle_timeout + WAIT,
            "the idle streams were not cancelled",
        )
        timed_epoch(location, TOKENS["c"])

        # A cancelled stream's client, reading again, gets what was sent and
        # then DEADLINE_EXCEEDED (flight_client resumes it from its offset);
        # that ends the stream, and the client may stream again. (Before any
        # new idle stream is opened: one would be cancelled too after 2 s,
        # and change the count this waits for on a slow machine.)
        with pytest.raises(flight.FlightTimedOutError) as deadline:
            read_at_most(b.readers[0], 1_000)
        assert "--stream-idle-timeout" in message(deadline.value)
        wait_until(
            lambda: server.streams.counts()["stalled"] == 7, WAIT, "the read stream did not end"
        )
        b.open()

        for _ in range(3):
            e.open()
        # The idle clients' own slots stay taken while they do not read.
        with pytest.raises(flight.FlightUnavailableError, match="--max-streams-per-client 3"):
            a.open()


def test_a_stalled_stream_ends_when_its_client_leaves(catalog: Catalog) -> None:
    limits = Limits(max_streams=4, max_streams_per_client=4, stream_idle_timeout=1.0)
    with serve(catalog, limits=limits) as server, IdleClients() as clients:
        idle = clients.new(server.location)
        idle.open()
        idle.open()
        wait_until(
            lambda: server.streams.counts() == {"open": 0, "stalled": 2},
            WAIT,
            "the idle streams were not cancelled",
        )
        idle.close()
        wait_until(
            lambda: server.streams.counts() == {"open": 0, "stalled": 0},
            WAIT,
            "the cancelled streams did not end with their client",
        )


def test_a_stream_read_to_the_end_or_refused_frees_its_slot(catalog: Catalog) -> None:
    limits = Limits(max_streams=1, max_streams_per_client=1)
    with serve(catalog, limits=limits) as server, flight.connect(server.location) as raw:
        for _ in range(3):
            assert raw.do_get(make_ticket(EPOCH)).read_all().num_rows == EPOCH["epoch_len"]
            assert len(metadata(raw)) == ROWS
            with pytest.raises(pa.ArrowInvalid):
                raw.do_get(make_ticket(EPOCH | {"columns": ["nope"]})).read_all()
        wait_until(lambda: server.streams.counts()["open"] == 0, WAIT, "a slot stayed taken")


@pytest.mark.parametrize(
    ("peer", "client"),
    [
        ("ipv4:127.0.0.1:51234", "ipv4:127.0.0.1"),
        ("ipv6:[::1]:51234", "ipv6:[::1]"),
        ("ipv6:%5B::1%5D:443", "ipv6:%5B::1%5D"),
        ("unix:/tmp/socket", "unix:/tmp/socket"),
    ],
)
def test_a_client_is_its_address_without_the_port(peer: str, client: str) -> None:
    assert peer_address(peer) == client


@pytest.mark.parametrize(
    "field", ["max_endpoints", "max_streams", "max_streams_per_client", "max_put_rows"]
)
@pytest.mark.parametrize("value", [0, -1])
def test_limits_must_be_positive(field: str, value: int) -> None:
    with pytest.raises(ValueError, match="--" + field.replace("_", "-")):
        Limits(**{field: value})


def test_help_describes_the_limits() -> None:
    result = run_cli(["--help"])
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    for option, default in [
        ("--max-endpoints", "65536"),
        ("--max-streams", "64"),
        ("--max-streams-per-client", "16"),
        ("--stream-idle-timeout", "60"),
        ("--max-put-rows", "4294967295"),
        ("--max-put-bytes", "1099511627776"),
        ("--shutdown-grace", "5"),
    ]:
        described = text[text.rindex(f"{option} ") :][:300]  # its entry, after the usage
        assert f"(default {default}" in described, described


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--max-endpoints", "0"),
        ("--max-streams", "-1"),
        ("--stream-idle-timeout", "0"),
        ("--max-put-bytes", "0"),
        ("--shutdown-grace", "-1"),
    ],
)
def test_cli_refuses_a_bad_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    code = cli.main(["--data-dir", str(tmp_path / "data"), "--port", "0", option, value])
    err = capsys.readouterr().err
    assert code == 2, err
    assert option in err, err
    assert not (tmp_path / "data" / "caches").exists()  # refused before building anything


# -- do_put: the size limits ---------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "option"),
    [
        (Limits(max_put_rows=100), "--max-put-rows 100"),
        (Limits(max_put_bytes=4096), "--max-put-bytes 4096"),
    ],
)
def test_a_put_over_the_limit_is_refused_and_changes_nothing(
    catalog: Catalog, limits: Limits, option: str
) -> None:
    with serve(catalog, limits=limits) as server, flight.connect(server.location) as raw:
        before = (active(raw), populations(raw))
        table = metadata(raw)
        with pytest.raises(pa.ArrowInvalid) as error:
            put(raw, table)
        assert option in message(error.value)
        assert (active(raw), populations(raw)) == before
        put(raw, table.head(50))  # under the limits: taken


class Chunk(NamedTuple):
    """What a do_put reader yields (`flight.FlightStreamChunk`'s fields)."""

    data: pa.RecordBatch
    app_metadata: pa.Buffer | None = None


class CountingReader:
    """A do_put reader over ``batches`` that counts how many were read."""

    def __init__(self, batches: list[pa.RecordBatch]) -> None:
        self.schema = batches[0].schema
        self._batches = batches
        self.read = 0

    def __iter__(self) -> Iterator[Chunk]:
        for batch in self._batches:
            self.read += 1
            yield Chunk(batch)


def test_a_put_is_refused_as_soon_as_it_passes_the_limit(catalog: Catalog) -> None:
    """The put is read batch by batch and refused at the first batch over the limit,
    not after reading it whole."""
    with serve(catalog, limits=Limits(max_put_rows=100)) as server:
        batch = pa.record_batch({"cache_id": pa.array(range(30), pa.uint64())})
        reader = CountingReader([batch] * 1000)
        with pytest.raises(ValueError, match="--max-put-rows 100"):
            server._read_put(reader, _PutCounter()).read_all()
        assert reader.read == 4


def test_an_empty_put_schema_is_invalid(raw: flight.FlightClient) -> None:
    before = active(raw)
    with pytest.raises(pa.ArrowInvalid, match="no columns"):
        put(raw, pa.table({}))
    assert active(raw) == before


# -- shutdown ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("small"), ListSource("small", make_records(400)))


def server_args(tmp_path: Path, cache: Path, *extra: str) -> list[str]:
    return ["--port", "0", "--data-dir", str(tmp_path), "--dataset", f"small={cache}", *extra]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_shutdown_with_idle_streams_exits_0_after_the_grace(
    tmp_path: Path, small_cache: Path, sig: int
) -> None:
    grace = 1.0
    args = server_args(tmp_path, small_cache, "--shutdown-grace", str(grace))
    body = {"dataset": "small", "seed": 1, "epoch": 0, "epoch_len": 10**7}
    with ServerProcess(args) as server:
        idle = IdleClient(server.location())
        try:
            for _ in range(4):
                idle.open(body)
            began = time.monotonic()
            code = server.stop(sig, timeout=grace + 15.0)  # it took 69.5 s with 64 streams
            took = time.monotonic() - began
        finally:
            idle.close()
        assert code == 0, server.output()
        print(f"stopped with 4 idle streams in {took:.2f} s (grace {grace} s)")
        assert "stopping" in server.output()


def test_a_signal_right_after_startup_stops_the_server(tmp_path: Path, small_cache: Path) -> None:
    """The signal may come before the main thread waits for it: it stays pending
    (it used to be lost when it came as the server started serving)."""
    for attempt in range(3):
        with ServerProcess(server_args(tmp_path / str(attempt), small_cache)) as server:
            server.location()
            assert server.stop(signal.SIGTERM) == 0, server.output()


def test_a_draining_server_lets_a_reading_client_finish(catalog: Catalog) -> None:
    """Calls in flight finish within the grace; the server then stops cleanly."""
    with serve(catalog) as server:
        raw = flight.connect(server.location)
        reader = raw.do_get(make_ticket(EPOCH))
        first = reader.read_chunk().data.num_rows
        stopped: list[bool] = []
        stopper = threading.Thread(target=lambda: stopped.append(server.stop(WAIT)))
        stopper.start()
        rest = sum(chunk.data.num_rows for chunk in reader)
        stopper.join(WAIT)
        raw.close()
        assert first + rest == EPOCH["epoch_len"]
        assert stopped == [True]
