"""Failover: a stream broken by a lost server resumes on a replica at the right offset.

Two real server processes (``python -m flight_server``) serve the same cache with
the same ``--state-dir``, so they hold the same populations and a ticket pinned by
one is served identically by the other. The epoch is 4000 records of 16 KiB (the
server sends batches of 256 rows, ~4 MiB each, and gRPC flow control keeps it from
running far ahead of a reader that pauses), so killing the server after the first
batches really breaks the stream mid-way.

Which server the client reads from: ``DatasetClient([loc1, loc2])`` asks ``loc1``
(the first location that answers) for the FlightInfo, and rank 0's ``epoch`` starts
at the first location (rank ``r`` starts at location ``r mod n``), so the stream
begins on ``loc1``. The tests check that with the servers' ``stats`` action: after
the first batches ``loc1`` has sent rows and ``loc2`` none; after the kill ``loc2``
sent only the remainder of the epoch (it resumed at an offset, not from the start).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import ListSource, payload

import dataset_rt as drt
from flight_client import DatasetClient, EveryLocationFailedError

from .conftest import make_catalog, serve
from .test_server_cli import ServerProcess

pytestmark = pytest.mark.timeout(120)

DATASET = "toy"
RECORDS = 4000
PAYLOAD_BYTES = 16 * 1024
SEED = 9
BATCHES_BEFORE_KILL = 3

Triple = tuple[int, int, int]


@pytest.fixture(scope="module")
def big_cache(tmp_path_factory: pytest.TempPathFactory, runtime: drt.DatasetRuntime) -> Path:
    """4000 records of 16 KiB (64 MiB), written once for the module."""
    records = [
        drt.CacheInput(data=payload(i, PAYLOAD_BYTES), metadata={"label": i % 5})
        for i in range(RECORDS)
    ]
    config = drt.WriterConfig(show_progress=False)
    root = tmp_path_factory.mktemp("failover")
    (result,) = runtime.write_cache(ListSource("big", records), root, writer_config=config)
    assert isinstance(result, drt.CacheWriteSuccess), result
    return result.path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def dead_location() -> str:
    """A loopback port nobody listens on (bound once, then released)."""
    return f"grpc://127.0.0.1:{free_port()}"


@contextmanager
def two_servers(cache: Path, root: Path, *, advertise: bool) -> Iterator[list[ServerProcess]]:
    """Two server processes over ``cache`` sharing ``root / "state"``, started together.

    With ``advertise`` both ports are chosen up front and each server lists both
    locations in its FlightInfo endpoints; without it each server advertises only
    itself and the client must fall back on the locations it was given.
    """
    ports = [free_port(), free_port()] if advertise else [0, 0]
    extra: list[str] = []
    if advertise:
        for port in ports:
            extra += ["--advertise", f"grpc://127.0.0.1:{port}"]
    with ExitStack() as stack:
        servers = [
            stack.enter_context(
                ServerProcess(
                    [
                        "--port",
                        str(port),
                        "--dataset",
                        f"{DATASET}={cache}",
                        "--state-dir",
                        str(root / "state"),
                        "--data-dir",
                        str(root / f"data-{i}"),
                        *extra,
                    ]
                )
            )
            for i, port in enumerate(ports)
        ]
        yield servers


def triples(batch: pa.RecordBatch) -> list[Triple]:
    return list(
        zip(
            batch.column("position").to_pylist(),
            batch.column("cache_id").to_pylist(),
            batch.column("sample_id").to_pylist(),
            strict=True,
        )
    )


def fast_client(locations: list[str]) -> DatasetClient:
    """A client that gives up quickly: two tries per location, backoff <= 0.2 s."""
    return DatasetClient(locations, retries=2, backoff=0.05, max_backoff=0.2)


def rows_sent(location: str) -> int:
    with DatasetClient(location, retries=1) as client:
        return int(client.stats()[DATASET]["rows_sent"])


# -- a server killed mid-stream ---------------------------------------------------


@pytest.mark.parametrize(
    "advertise",
    [False, True],
    ids=["client-locations", "advertised-replicas"],
)
def test_a_killed_server_is_resumed_on_the_other_at_the_right_offset(
    big_cache: Path, tmp_path: Path, advertise: bool
) -> None:
    with two_servers(big_cache, tmp_path, advertise=advertise) as (first, second):
        loc1, loc2 = first.location(), second.location()

        # The uninterrupted run, from the second replica.
        with DatasetClient(loc2) as reference_client:
            expected = [
                t
                for b in reference_client.epoch(DATASET, SEED, 0, batches=True)
                for t in triples(b)
            ]
        assert len(expected) == RECORDS
        assert [p for p, _, _ in expected] == list(range(RECORDS))
        sent1, sent2 = rows_sent(loc1), rows_sent(loc2)

        delivered: list[Triple] = []
        with fast_client([loc1, loc2]) as client:
            stream = client.epoch(
                DATASET, SEED, 0, partition=drt.Partition(rank=0, world_size=1), batches=True
            )
            for _ in range(BATCHES_BEFORE_KILL):
                delivered += triples(next(stream))
            # The stream is on loc1: it has sent rows, loc2 has not.
            assert rows_sent(loc1) - sent1 >= len(delivered)
            assert rows_sent(loc2) == sent2
            first.kill()
            started = time.monotonic()
            for batch in stream:
                delivered += triples(batch)
            assert time.monotonic() - started < 30.0

        assert len(delivered) == RECORDS
        assert delivered == expected
        resumed = rows_sent(loc2) - sent2
        assert 0 < resumed <= RECORDS - BATCHES_BEFORE_KILL * 256, resumed


def test_sub_streams_resume_on_the_other_replica_and_merge_to_the_single_stream(
    big_cache: Path, tmp_path: Path
) -> None:
    """``streams=2``: sub-stream 0 starts on one replica, sub-stream 1 on the other;
    one replica is killed mid-epoch, and what it was sending resumes on the other at
    its offset. The merged rows are the uninterrupted single stream's."""
    with two_servers(big_cache, tmp_path, advertise=True) as (first, second):
        loc1, loc2 = first.location(), second.location()
        # Long enough that each sub-stream is far from its end at the kill.
        epoch_len = 4 * RECORDS
        with DatasetClient(loc2) as reference_client:
            expected = [
                t
                for b in reference_client.epoch(DATASET, SEED, 0, batches=True, epoch_len=epoch_len)
                for t in triples(b)
            ]
        sent1, sent2 = rows_sent(loc1), rows_sent(loc2)
        delivered: list[Triple] = []
        with fast_client([loc1, loc2]) as client:
            stream = client.epoch(DATASET, SEED, 0, batches=True, epoch_len=epoch_len, streams=2)
            while len(delivered) < 3 * 256:
                delivered += triples(next(stream))
            assert rows_sent(loc1) > sent1, "sub-stream 0 is on the first replica"
            assert rows_sent(loc2) > sent2, "sub-stream 1 on the second"
            first.kill()
            started = time.monotonic()
            for batch in stream:
                delivered += triples(batch)
            assert time.monotonic() - started < 30.0
            assert any("resuming" in note for note in client.failover_notes)
        assert delivered == expected


def test_every_location_dying_mid_stream_raises_within_bounded_time(
    big_cache: Path, tmp_path: Path
) -> None:
    with two_servers(big_cache, tmp_path, advertise=False) as servers:
        locations = [server.location() for server in servers]
        delivered = 0
        with fast_client(locations) as client:
            stream = client.epoch(DATASET, SEED, 0, batches=True)
            delivered += next(stream).num_rows
            for server in servers:
                server.kill()
            started = time.monotonic()
            with pytest.raises(EveryLocationFailedError, match="every location failed"):
                delivered += sum(batch.num_rows for batch in stream)
            assert time.monotonic() - started < 15.0
        assert 0 < delivered < RECORDS


# -- every location dead from the start ----------------------------------------------


def test_an_epoch_with_every_location_dead_raises_within_bounded_time() -> None:
    locations = [dead_location(), dead_location()]
    started = time.monotonic()
    with (
        fast_client(locations) as client,
        pytest.raises(EveryLocationFailedError) as raised,
    ):
        list(client.epoch(DATASET, SEED, 0))
    assert time.monotonic() - started < 15.0
    for location in locations:
        assert location in str(raised.value)


UNARY_CALLS: dict[str, Callable[[DatasetClient], object]] = {
    "datasets": lambda client: client.datasets(),
    "health": lambda client: client.health(),
    "stats": lambda client: client.stats(),
    "populations": lambda client: client.populations(DATASET),
    "get_metadata": lambda client: client.get_metadata(DATASET),
}


@pytest.mark.parametrize("call", list(UNARY_CALLS))
def test_unary_calls_with_every_location_dead_raise_every_location_failed(call: str) -> None:
    started = time.monotonic()
    with (
        fast_client([dead_location(), dead_location()]) as client,
        pytest.raises(EveryLocationFailedError),
    ):
        UNARY_CALLS[call](client)
    assert time.monotonic() - started < 15.0


@pytest.mark.parametrize(
    "call", ["datasets", "health", "stats", "populations", "get_metadata", "set_epoch_len"]
)
def test_unary_calls_skip_a_dead_first_location(
    tmp_path: Path, runtime: drt.DatasetRuntime, call: str
) -> None:
    with (
        serve(make_catalog(tmp_path, runtime)) as live,
        fast_client([dead_location(), live.location]) as client,
    ):
        answers = {
            "datasets": lambda: client.datasets() == [DATASET],
            "health": lambda: client.health()["status"] == "ok",
            "stats": lambda: DATASET in client.stats(),
            "populations": lambda: len(client.populations(DATASET)["populations"]) == 1,
            "get_metadata": lambda: client.get_metadata(DATASET).height == 300,
            "set_epoch_len": lambda: client.set_epoch_len(DATASET, 40) == 40,
        }
        assert answers[call]()
