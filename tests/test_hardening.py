"""Hardening of the engine (issue 10): duplicate columns are refused, leftovers of
killed writers are cleaned, concurrent activations follow their acknowledgements,
and populations that are not active can be removed.

The crash tests run writers in subprocesses and kill them with SIGKILL; a writer
stopped with SIGSTOP stands for a live writer in another process (it keeps its
locks). Every wait is bounded in time and in attempts.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from conftest import ListSource, make_records, write

import dataset_rt as drt
from dataset_rt.service import DatasetService, StreamRequest
from flight_client import DatasetClient
from flight_server import Catalog, DatasetFlightServer, DatasetSpec

N = 12
NAME = "hard"
WAIT_SECONDS = 30.0
POLL_SECONDS = 0.001


# -- helpers -------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("hardening"), ListSource("pop", make_records(N)))


def open_service(runtime: drt.DatasetRuntime, cache: Path, state: Path) -> DatasetService:
    """A service over ``state``: another one over the same directory is a replica."""
    return DatasetService(runtime.native, NAME, [str(cache)], str(state))


def active_table(service: DatasetService) -> pa.Table:
    return pa.table(service.metadata())


def reweighted(table: pa.Table, weight: float) -> pa.Table:
    at = table.schema.get_field_index("weight")
    return table.set_column(at, "weight", pa.array([weight] * table.num_rows, pa.float64()))


def with_second_weight(table: pa.Table) -> pa.Table:
    """The attack: a valid ``weight`` column, then another one of -5.0."""
    return table.append_column("weight", pa.array([-5.0] * table.num_rows, pa.float64()))


def wait_for(condition: Callable[[], bool], what: str, seconds: float = WAIT_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds} s waiting for {what}")
        time.sleep(POLL_SECONDS)


def start(script: str, *args: str) -> subprocess.Popen[str]:
    """A Python subprocess that prints ``ready`` once it is about to work."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line == "ready\n", (line, proc.stderr.read() if proc.stderr else "")
    return proc


def kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL (also ends a stopped process) and reap."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=WAIT_SECONDS)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def is_locked(path: Path) -> bool:
    """Whether another open file holds ``path``'s flock (a file or a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also lets go of a lock taken here
    return False


def stop_while(proc: subprocess.Popen[str], present: Callable[[], list[Path]]) -> list[Path]:
    """Stop ``proc`` (SIGSTOP) while it holds the temporary entries ``present()`` finds.

    The entry may be renamed into place between seeing it and stopping the
    writer, or be caught in the instant between its creation and its lock:
    then the writer continues and we try again (bounded in time).
    """
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            stderr = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"the writer ended early: {stderr}")
        if present():
            os.kill(proc.pid, signal.SIGSTOP)
            found = present()
            if found and all(is_locked(p) for p in found):
                return found
            os.kill(proc.pid, signal.SIGCONT)
        time.sleep(POLL_SECONDS)
    raise AssertionError(f"no locked temporary entry seen in {WAIT_SECONDS} s")


# -- item 6: duplicate columns -------------------------------------------------------


def test_update_metadata_refuses_a_duplicate_column(
    runtime: drt.DatasetRuntime, cache_path: Path
) -> None:
    dataset = runtime.cached_dataset([cache_path], reader_config=drt.ReaderConfig(seed=1))
    before = dataset.get_metadata()
    with pytest.raises(drt.InvalidPopulationError) as caught:
        dataset.update_metadata(with_second_weight(before.to_arrow()))
    assert caught.value.column == "weight"
    message = str(caught.value)
    assert "column 'weight' appears 2 times" in message, message
    assert "column names must be unique" in message, message
    assert dataset.get_metadata().equals(before)


def test_service_put_refuses_duplicate_columns_and_changes_nothing(
    runtime: drt.DatasetRuntime, cache_path: Path, tmp_path: Path
) -> None:
    service = open_service(runtime, cache_path, tmp_path)
    active = service.active().population
    stored = service.populations()
    table = active_table(service)
    noted = table.append_column("note", pa.array(["a"] * N))
    for bad, column in [
        (with_second_weight(table), "weight"),
        (table.append_column("label", table.column("label")), "label"),
        (noted.append_column("note", pa.array(["b"] * N)), "note"),
    ]:
        for activate in (True, False):
            with pytest.raises(drt.InvalidPopulationError, match=f"'{column}' appears 2 times"):
                service.put(bad, activate)
    assert service.active().population == active
    assert service.populations() == stored
    assert active_table(service).equals(table)


@contextmanager
def serve(tmp_path: Path, runtime: drt.DatasetRuntime, cache: Path) -> Iterator[str]:
    catalog = Catalog([DatasetSpec(NAME, (cache,))], tmp_path / "state", runtime)
    with DatasetFlightServer(catalog, "grpc://127.0.0.1:0") as server:
        yield server.location


def test_do_put_refuses_a_duplicate_column_with_invalid_argument(
    runtime: drt.DatasetRuntime, cache_path: Path, tmp_path: Path
) -> None:
    with serve(tmp_path, runtime, cache_path) as location, DatasetClient(location) as client:
        before = client.get_metadata(NAME)
        with pytest.raises(pa.ArrowInvalid, match="column 'weight' appears 2 times"):
            client.update_metadata(NAME, with_second_weight(before.to_arrow()))
        # Every client still reads the active population.
        assert client.get_metadata(NAME).equals(before)


# -- item 7: leftovers of killed writers ---------------------------------------------

CACHE_WRITER = """
    import sys, time
    import dataset_rt as drt

    base, name = sys.argv[1], sys.argv[2]

    class SlowSource:
        name = sys.argv[2]

        def __iter__(self):
            for i in range(100_000):  # far more than a test waits for
                time.sleep(0.01)
                yield drt.CacheInput(bytes(64), {"i": i})

    print("ready", flush=True)
    drt.DatasetRuntime(num_workers=1).write_cache(
        SlowSource(), base, writer_config=drt.WriterConfig(show_progress=False)
    )
"""


def test_abandoned_partial_caches_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    base = tmp_path / "caches"

    def partials() -> list[Path]:
        return sorted(base.glob(".victim.partial-*")) if base.exists() else []

    writer = start(CACHE_WRITER, str(base), "victim")
    try:
        (partial,) = stop_while(writer, partials)
        # A live (stopped) writer keeps its lock: the next write leaves it alone.
        write(base, ListSource("next_1", make_records(2)))
        assert partials() == [partial]
    finally:
        kill(writer)
    # In a container every writer is pid 1, as this process may be to the next:
    # name the leftover with our pid, which must not make it look alive.
    reused = partial.with_name(f".victim.partial-{os.getpid()}-0")
    partial.rename(reused)
    write(base, ListSource("next_2", make_records(2)))
    assert partials() == []
    assert sorted(p.name for p in base.iterdir()) == ["next_1", "next_2"]


POPULATION_WRITER = """
    import sys
    import pyarrow as pa
    import dataset_rt as drt
    from dataset_rt.service import DatasetService

    cache, state, name, rows = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    runtime = drt.DatasetRuntime(num_workers=1)
    service = DatasetService(runtime.native, name, [cache], state)
    base = pa.table(service.metadata())
    big = base.take(pa.array([i % base.num_rows for i in range(rows)]))
    at = big.schema.get_field_index("weight")
    print("ready", flush=True)
    for i in range(1000):  # each table is new, so each put writes a file
        weights = pa.array([1.0 + i] * rows, pa.float64())
        service.put(big.set_column(at, "weight", weights), False)
"""


def test_abandoned_population_temp_files_are_removed_and_live_ones_kept(
    runtime: drt.DatasetRuntime, cache_path: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    service = open_service(runtime, cache_path, state)
    active = service.active().population

    def temps() -> list[Path]:
        return sorted(state.glob(f"{NAME}/*/populations/.tmp-*"))

    writer = start(POPULATION_WRITER, str(cache_path), str(state), NAME, "400000")
    try:
        leftovers = stop_while(writer, temps)
        # The writer is alive (stopped, holding its lock): opening the store
        # and writing to it leave its temporary file alone.
        replica = open_service(runtime, cache_path, state)
        replica.put(reweighted(active_table(replica), 2.0), False)
        assert temps() == leftovers
    finally:
        kill(writer)
    assert temps() == leftovers  # killed mid-write: the file stays until the next operation
    open_service(runtime, cache_path, state)
    assert temps() == []
    assert service.active().population == active
    active_table(service)  # the store still reads


# -- item 9: concurrent activations ----------------------------------------------


def test_the_last_acknowledged_activation_is_active_after_reopening(
    runtime: drt.DatasetRuntime, cache_path: Path, tmp_path: Path
) -> None:
    """Threads activate at once; the one acknowledged last must be active.

    A race needs two activations to overlap at the very end of a round, so
    there are many short rounds (before the fix about 1 in 25 rounds failed).
    """
    state = tmp_path / "state"
    service = open_service(runtime, cache_path, state)
    base = active_table(service)

    def activate(mine: list[pa.Table], acknowledged: list[str]) -> None:
        for table in mine:
            population, _ = service.put(table, True)
            acknowledged.append(population)  # right after the acknowledgement

    wrong = []
    for round_ in range(200):
        acknowledged: list[str] = []
        weights = [[1.0 + round_ * 100 + t * 10 + i for i in range(2)] for t in range(8)]
        threads = [
            threading.Thread(
                target=activate, args=([reweighted(base, w) for w in mine], acknowledged)
            )
            for mine in weights
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_SECONDS)
            assert not thread.is_alive()
        assert len(acknowledged) == 16
        if open_service(runtime, cache_path, state).active().population != acknowledged[-1]:
            wrong.append(round_)
    assert wrong == [], f"another population was active after rounds {wrong}"


ACTIVATOR = """
    import os, sys
    import pyarrow as pa
    import dataset_rt as drt
    from dataset_rt.service import DatasetService

    cache, state, name, log, me = sys.argv[1:6]
    me = int(me)
    runtime = drt.DatasetRuntime(num_workers=1)
    service = DatasetService(runtime.native, name, [cache], state)
    base = pa.table(service.metadata())
    at = base.schema.get_field_index("weight")
    out = os.open(log, os.O_WRONLY | os.O_APPEND)

    def record(line):
        os.write(out, (line + "\\n").encode())  # one append per line

    print("ready", flush=True)
    for i in range(100_000):
        weight = 1.0 + me * 1_000_000 + i  # the population names its activation
        table = base.set_column(at, "weight", pa.array([weight] * base.num_rows, pa.float64()))
        record(f"start {me} {i}")
        service.put(table, True)
        record(f"ack {me} {i}")
"""


def test_activations_across_killed_processes_follow_their_acknowledgements(
    runtime: drt.DatasetRuntime, cache_path: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    open_service(runtime, cache_path, state)  # the store exists before the writers start
    log = tmp_path / "log"
    log.touch()
    args = (str(cache_path), str(state), NAME, str(log))
    procs = [start(ACTIVATOR, *args, str(me)) for me in range(3)]
    try:

        def acks() -> int:
            return log.read_text().count("ack ")

        wait_for(lambda: acks() >= 60, "60 acknowledged activations")
    finally:
        for proc in procs:
            kill(proc)

    lines = [tuple(line.split()) for line in log.read_text().splitlines()]
    started = {(int(p), int(i)): n for n, (kind, p, i) in enumerate(lines) if kind == "start"}
    acked = {(int(p), int(i)): n for n, (kind, p, i) in enumerate(lines) if kind == "ack"}
    weight = active_table(open_service(runtime, cache_path, state)).column("weight")[0].as_py()
    # Reopening also removed what the killed writers left half written.
    assert list(state.glob(f"{NAME}/*/.tmp-*")) + list(state.glob(f"{NAME}/*/*/.tmp-*")) == []
    me, i = divmod(int(weight) - 1, 1_000_000)
    assert (me, i) in started, f"the active population {weight} was never activated"
    if (me, i) in acked:
        # An activation that began after this one was acknowledged, and was
        # acknowledged itself, took effect later: it would have to be active.
        later = [key for key, n in started.items() if n > acked[(me, i)] and key in acked]
        assert later == [], f"active is {(me, i)}, but {later} were acknowledged after it"
    else:
        # Cut off by the kill before its acknowledgement: it may have taken
        # effect, but only as its process's last activation.
        assert (me, i + 1) not in started
        assert i == 0 or (me, i - 1) in acked


# -- item 5: removing populations --------------------------------------------------


def test_remove_population(runtime: drt.DatasetRuntime, cache_path: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    service = open_service(runtime, cache_path, state)
    replica = open_service(runtime, cache_path, state)
    active = service.active().population
    other, _ = service.put(reweighted(active_table(service), 3.0), False)
    pinned = StreamRequest(dataset=NAME, seed=1, epoch=0, population=other, epoch_len=N)
    replica.schema(pinned)  # loaded and kept in the replica's memory
    (stored,) = state.glob(f"{NAME}/*/populations/{other}.arrow")

    with pytest.raises(drt.InvalidArgumentError, match="is the active population") as caught:
        service.remove_population(active)
    assert "activate another population first" in str(caught.value)
    with pytest.raises(drt.NotFoundError, match="is not in the store"):
        service.remove_population("0" * 32)
    with pytest.raises(drt.InvalidArgumentError, match="32 lowercase hex digits"):
        service.remove_population("../active")

    service.remove_population(other)
    assert not stored.exists()
    for engine in (service, replica):
        assert engine.populations() == [active]
        with pytest.raises(drt.NotFoundError):
            engine.schema(pinned)
        with pytest.raises(drt.NotFoundError):
            engine.stream(pinned.for_rank(0))
        with pytest.raises(drt.NotFoundError):
            engine.metadata(other)
    with pytest.raises(drt.NotFoundError):
        replica.remove_population(other)
    assert service.active().population == active


def test_a_removed_population_is_not_found_over_flight(
    runtime: drt.DatasetRuntime, cache_path: Path, tmp_path: Path
) -> None:
    with serve(tmp_path, runtime, cache_path) as location, DatasetClient(location) as client:
        other = client.update_metadata(
            NAME, reweighted(client.get_metadata(NAME).to_arrow(), 5.0), activate=False
        )
        assert len(client.get_metadata(NAME, other)) == N
        # An operator removes it through another engine over the same store.
        open_service(runtime, cache_path, tmp_path / "state").remove_population(other)
        with pytest.raises(pa.ArrowKeyError, match="is not in the store"):
            client.get_metadata(NAME, other)
        ticket = {
            "dataset": NAME,
            "seed": 1,
            "epoch": 0,
            "population": other,
            "epoch_len": N,
            "rank": 0,
        }
        with flight.connect(location) as raw, pytest.raises(pa.ArrowKeyError):
            raw.do_get(flight.Ticket(json.dumps(ticket).encode())).read_all()
