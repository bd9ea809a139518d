"""What ``bench_flight.py`` and ``bench_cluster.py`` share.

- the payloads: one fixed-seed 16 MiB random pool, sliced at fixed-seed offsets, and
  the ``dataset_rt`` caches written from them;
- the raw ceiling: a minimal pyarrow Flight server serving the same payloads from
  memory (run as ``bench_flight.py --raw-server``) and `ServerProcess`, which starts
  a server subprocess and reads the location it prints;
- the clients: `ClientPool`, spawned worker processes that stream one job each
  (a ticket, or a ``DatasetClient`` epoch) and are released together, and
  `timed_epoch`, one epoch over all of them;
- `Run`, `Measurement` and `Scale`, the report helpers (`render`, `human_bytes`,
  ...) and the command-line options and scratch directory both scripts have.

The benchmarks directory is not a package: the scripts import this module by name,
and their spawned clients find it on the ``sys.path`` they inherit.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import multiprocessing as mp
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Self, TypeVar

BENCH_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = BENCH_DIR.parent
RAW_SERVER_SCRIPT = BENCH_DIR / "bench_flight.py"  # its ``--raw-server`` mode runs `serve_raw`
HOST = "127.0.0.1"
SEED = 0
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
POOL_BYTES = 16 * MIB
# The shape of our server's batches (DatasetFlightServer: batch_size=1024 rows;
# the native stream closes a batch before it would pass 4 MiB of payload).
BATCH_ROWS = 1024
BATCH_BYTES = 4 * MIB
SERVER_START_TIMEOUT = 120.0
CLIENT_READY_TIMEOUT = 60.0
STREAM_TIMEOUT = 600.0
STOP_TIMEOUT = 10.0
PR_SET_PDEATHSIG = 1


class BenchError(RuntimeError):
    """A server or client did not behave as the benchmark expects."""


@dataclass(frozen=True)
class Scale:
    """Data volumes of one run; a subclass adds its fields and sets QUICK and FULL."""

    name: str
    total_bytes: int  # payload bytes of one epoch per throughput measurement (all clients)
    repeats: int  # epochs per throughput measurement

    QUICK: ClassVar[tuple[int, ...]] = ()  # the fields after ``name`` with --quick
    FULL: ClassVar[tuple[int, ...]] = ()  # ... and without

    @classmethod
    def of(cls, quick: bool) -> Self:
        return cls("quick", *cls.QUICK) if quick else cls("full", *cls.FULL)


def make_log(name: str) -> Callable[[str], None]:
    """A ``log(message)`` that prints ``[name] message`` to stderr."""

    def log(message: str) -> None:
        print(f"[{name}] {message}", file=sys.stderr, flush=True)

    return log


def human_bytes(size: float) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size:.0f} B"


def human_count(value: float) -> str:
    for suffix, scale in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


# -- payloads (identical in the caches and in the raw server's table) --------------


def payload_pool() -> bytes:
    """Fixed-seed random bytes; payload ``i`` of a size is a slice at a fixed offset."""
    return random.Random(0).randbytes(POOL_BYTES)


def payload_offsets(count: int, size: int) -> list[int]:
    return random.Random(size).choices(range(POOL_BYTES - size + 1), k=count)


def batch_bounds(
    count: int, size: int, batch_bytes: int | None = None
) -> Iterator[tuple[int, int]]:
    """``[start, stop)`` of each batch: our server's shape (at most BATCH_ROWS rows
    and BATCH_BYTES bytes), or batches of about ``batch_bytes`` whatever their rows."""
    if batch_bytes is None:
        rows = max(1, min(BATCH_ROWS, BATCH_BYTES // size))
    else:
        rows = max(1, batch_bytes // size)
    for start in range(0, count, rows):
        yield start, min(count, start + rows)


class CacheSource:
    """``count`` records of ``size`` bytes: the same payloads as `raw_batches`."""

    def __init__(self, drt: Any, name: str, count: int, size: int) -> None:
        self.name = name
        self._drt, self._count, self._size = drt, count, size

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Any]:
        pool = memoryview(payload_pool())
        size = self._size
        for i, offset in enumerate(payload_offsets(self._count, size)):
            yield self._drt.CacheInput(
                data=pool[offset : offset + size], metadata={"label": i % 10}
            )


def write_cache(name: str, count: int, size: int, root: Path) -> tuple[Path, float]:
    """Write a cache named ``name`` under ``root``; returns its path and the seconds taken."""
    import dataset_rt as drt

    started = time.perf_counter()
    runtime = drt.DatasetRuntime(num_workers=2)
    config = drt.WriterConfig(show_progress=False)
    [result] = runtime.write_cache(CacheSource(drt, name, count, size), root, writer_config=config)
    if not isinstance(result, drt.CacheWriteSuccess):
        raise BenchError(f"write_cache failed: {result!r}")
    return Path(result.path), time.perf_counter() - started


# -- the raw ceiling: a minimal pyarrow Flight server (``--raw-server``) ----------


def raw_batches(count: int, size: int, batch_bytes: int | None = None) -> list[Any]:
    """The same payloads as the cache, as ``position, cache_id, sample_id, payload``,
    in batches of `batch_bounds`."""
    import pyarrow as pa

    pool = payload_pool()
    offsets = payload_offsets(count, size)
    batches = []
    for start, stop in batch_bounds(count, size, batch_bytes):
        n = stop - start
        values = b"".join(pool[o : o + size] for o in offsets[start:stop])
        ends = pa.array(range(0, (n + 1) * size, size), type=pa.int64())
        payload = pa.LargeBinaryArray.from_buffers(
            pa.large_binary(), n, [None, ends.buffers()[1], pa.py_buffer(values)]
        )
        ids = pa.array(range(start, stop), type=pa.uint64())
        zeros = pa.array([0] * n, type=pa.uint64())
        batches.append(
            pa.RecordBatch.from_arrays(
                [ids, zeros, ids, payload], names=["position", "cache_id", "sample_id", "payload"]
            )
        )
    return batches


def serve_raw(count: int, size: int, batch_bytes: int | None = None) -> int:
    """Serve ``count`` payloads of ``size`` bytes from memory until SIGTERM."""
    import pyarrow as pa
    import pyarrow.flight as flight

    batches = raw_batches(count, size, batch_bytes)
    schema = batches[0].schema

    class RawServer(flight.FlightServerBase):  # type: ignore[misc]
        def do_get(self, context: Any, ticket: Any) -> Any:
            body = json.loads(ticket.ticket)
            rank, world = int(body["rank"]), int(body["world_size"])
            return flight.RecordBatchStream(pa.Table.from_batches(batches[rank::world], schema))

    server = RawServer(f"grpc://{HOST}:0")
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"raw serving at grpc://{HOST}:{server.port}", flush=True)
    server.serve()
    return 0


def serve_sampling(count: int, size: int, workdir: Path) -> int:
    """The sampling floor (``--sampling-server``): the least work a sampled stream
    does, in a plain pyarrow server. The same payloads are written to one flat
    file; each batch draws its positions with replacement (seeded by rank), reads
    each record with ``os.pread`` at its offset, hashes it with xxh3 (as our reader
    verifies every record) and sends the batch. No index, no population, no
    checksum comparison: what is left is I/O, hashing and Flight."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.flight as flight
    import xxhash

    pool, offsets = payload_pool(), payload_offsets(count, size)
    path = workdir / f"sampling-{size}-{os.getpid()}.bin"
    with open(path, "wb") as out:
        for offset in offsets:
            out.write(pool[offset : offset + size])
    fd = os.open(path, os.O_RDONLY)
    schema = raw_batches(1, size)[0].schema
    bounds = list(batch_bounds(count, size))

    def batches(rank: int, world: int) -> Iterator[Any]:
        draws = np.random.default_rng(rank)
        for start, stop in bounds[rank::world]:
            n = stop - start
            picks = draws.integers(0, count, n, dtype=np.uint64)
            records = [os.pread(fd, size, int(i) * size) for i in picks]
            digest = 0
            for record in records:
                digest ^= xxhash.xxh3_64_intdigest(record)
            ends = pa.array(range(0, (n + 1) * size, size), type=pa.int64())
            payload = pa.LargeBinaryArray.from_buffers(
                pa.large_binary(), n, [None, ends.buffers()[1], pa.py_buffer(b"".join(records))]
            )
            ids = pa.array(picks, type=pa.uint64())
            positions = pa.array(range(start, stop), type=pa.uint64())
            zeros = pa.array(np.zeros(n, dtype=np.uint64))
            yield pa.RecordBatch.from_arrays([positions, zeros, ids, payload], schema=schema)

    class SamplingServer(flight.FlightServerBase):  # type: ignore[misc]
        def do_get(self, context: Any, ticket: Any) -> Any:
            body = json.loads(ticket.ticket)
            rank, world = int(body["rank"]), int(body["world_size"])
            return flight.GeneratorStream(schema, batches(rank, world))

    server = SamplingServer(f"grpc://{HOST}:0")
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"sampling serving at grpc://{HOST}:{server.port}", flush=True)
    try:
        server.serve()
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return 0


def raw_tickets(world_size: int) -> list[bytes]:
    """The raw server's ticket of each rank: it serves batches ``rank::world_size``."""
    return [json.dumps({"rank": r, "world_size": world_size}).encode() for r in range(world_size)]


# -- server processes ---------------------------------------------------------------


_LIBC = ctypes.CDLL(None)  # loaded here: a preexec_fn must not dlopen after fork


def die_with_parent() -> None:
    """``preexec_fn``: the child gets SIGTERM when this process dies, even by SIGKILL."""
    with contextlib.suppress(AttributeError):
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class ServerProcess:
    """A server subprocess whose stdout/stderr go to files; ``location`` once started."""

    name: str
    proc: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    location: str = ""

    @classmethod
    def start(cls, name: str, command: Sequence[str], workdir: Path) -> ServerProcess:
        stdout, stderr = workdir / f"{name}.out", workdir / f"{name}.err"
        with stdout.open("wb") as out, stderr.open("wb") as err:
            proc = subprocess.Popen(
                list(command),
                cwd=PROJECT_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # a Ctrl-C reaches only us; `finally` stops it
                preexec_fn=die_with_parent,
            )
        return cls(name, proc, stdout, stderr)

    def wait_location(self, timeout: float = SERVER_START_TIMEOUT) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(r"grpc://\S+", self.stdout.read_text(errors="replace"))
            if found:
                self.location = found.group(0)
                return self.location
            if self.proc.poll() is not None:
                raise BenchError(
                    f"{self.name} server exited with code {self.proc.returncode}:\n"
                    + self.stderr.read_text(errors="replace")[-2000:]
                )
            time.sleep(0.05)
        raise BenchError(f"{self.name} server printed no location within {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT)


def start_raw(
    count: int, size: int, workdir: Path, batch_bytes: int | None = None, name: str = "raw"
) -> ServerProcess:
    command = [sys.executable, str(RAW_SERVER_SCRIPT), "--raw-server"]
    command += ["--count", str(count), "--payload-size", str(size)]
    if batch_bytes is not None:
        command += ["--raw-batch-bytes", str(batch_bytes)]
    return ServerProcess.start(name, command, workdir)


def start_sampling(count: int, size: int, workdir: Path) -> ServerProcess:
    command = [sys.executable, str(RAW_SERVER_SCRIPT), "--sampling-server"]
    command += ["--count", str(count), "--payload-size", str(size), "--workdir", str(workdir)]
    return ServerProcess.start("sampling", command, workdir)


# -- clients: spawned worker processes, released together -------------------------


@dataclass(frozen=True)
class TicketJob:
    """``do_get`` of one ticket; ``reuse`` keeps the connection for the worker's next job."""

    location: str
    ticket: bytes
    reuse: bool = True

    def open(self, connections: dict[str, Any]) -> tuple[Iterator[Any], Any]:
        """The stream of record batches (``do_get`` is called on the first ``next``)
        and what to close after it (None for a kept connection)."""
        import pyarrow.flight as flight

        if not self.reuse:
            client = flight.connect(self.location)
            return self._batches(client), client
        if self.location not in connections:
            connections[self.location] = flight.connect(self.location)
        return self._batches(connections[self.location]), None

    def _batches(self, client: Any) -> Iterator[Any]:
        import pyarrow.flight as flight

        for chunk in client.do_get(flight.Ticket(self.ticket)):
            yield chunk.data


@dataclass(frozen=True)
class EpochJob:
    """Rank ``rank`` of ``world_size`` of epoch 0 (seed SEED) with a fresh
    ``DatasetClient(locations).epoch(..., batches=True)``."""

    locations: tuple[str, ...]
    dataset: str
    rank: int
    world_size: int

    def open(self, connections: dict[str, Any]) -> tuple[Iterator[Any], Any]:
        from dataset_rt import Partition
        from flight_client import DatasetClient

        client = DatasetClient(list(self.locations))
        try:
            share = Partition(rank=self.rank, world_size=self.world_size)
            stream = client.epoch(self.dataset, SEED, 0, partition=share, batches=True)
        except BaseException:
            client.close()
            raise
        return stream, client


def client_worker(index: int, jobs: Any, results: Any, go: Any) -> None:
    """Stream each job to the end; report rows, payload bytes, batches and times."""
    import pyarrow.compute as pc

    def payload_bytes(array: Any) -> int:
        return int(pc.sum(pc.binary_length(array)).as_py() or 0)

    parent = os.getppid()
    connections: dict[str, Any] = {}
    while True:
        try:
            job = jobs.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:
                return  # orphaned
            continue
        if job is None:
            return
        closer: Any = None
        try:
            stream, closer = job.open(connections)
            results.put(("ready", index, None))
            if not go.wait(CLIENT_READY_TIMEOUT):
                results.put(("error", index, "never released"))
                continue
            rows = nbytes = batches = 0
            # This process's CPU (every thread: gRPC's too) while it streams: what
            # a client costs per GiB, for sizing hosts (benchmarks/README.md).
            cpu_start = time.process_time()
            start = time.monotonic()
            first = None
            for batch in stream:
                if first is None:
                    first = time.monotonic() - start
                rows += batch.num_rows
                nbytes += payload_bytes(batch.column("payload"))
                batches += 1
            end = time.monotonic()
            cpu = time.process_time() - cpu_start
            stats = {"rows": rows, "bytes": nbytes, "batches": batches, "cpu": cpu}
            results.put(("done", index, stats | {"start": start, "end": end, "first": first}))
        except Exception as error:  # reported to the parent, which fails the run
            results.put(("error", index, f"{type(error).__name__}: {error}"))
        finally:
            if closer is not None:
                with contextlib.suppress(Exception):
                    closer.close()


class ClientPool:
    """``size`` spawned client processes; `run` releases several at the same instant."""

    def __init__(self, size: int) -> None:
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.go = ctx.Event()
        self.jobs = [ctx.Queue() for _ in range(size)]
        self.procs = [
            ctx.Process(target=client_worker, args=(i, q, self.results, self.go), daemon=True)
            for i, q in enumerate(self.jobs)
        ]
        for proc in self.procs:
            proc.start()

    def _collect(self, kind: str, count: int, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        got: dict[int, dict[str, Any]] = {}
        while len(got) < count:
            try:
                state, index, body = self.results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                missing = count - len(got)
                raise BenchError(f"clients: {missing} not {kind} in {timeout:.0f} s") from None
            if state == "error":
                raise BenchError(f"client {index}: {body}")
            if state == kind:
                got[index] = body
        return [got[i] for i in sorted(got)]

    def run(
        self, jobs: Sequence[TicketJob | EpochJob], on_start: Callable[[], None] | None = None
    ) -> list[dict[str, Any]]:
        """Job ``i`` on client ``i``; ``on_start`` runs when all are ready, just before
        they are released. Returns each client's stats, in job order."""
        if len(jobs) > len(self.jobs):
            raise BenchError(f"{len(jobs)} jobs for {len(self.jobs)} clients")
        self.go.clear()
        for job_queue, job in zip(self.jobs, jobs, strict=False):
            job_queue.put(job)
        self._collect("ready", len(jobs), CLIENT_READY_TIMEOUT)
        if on_start is not None:
            on_start()
        self.go.set()
        try:
            return self._collect("done", len(jobs), STREAM_TIMEOUT)
        finally:
            self.go.clear()

    def close(self) -> None:
        for job_queue in self.jobs:
            with contextlib.suppress(Exception):
                job_queue.put(None)
        for proc in self.procs:
            proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)


# -- measurements -----------------------------------------------------------------


@dataclass
class Run:
    """One epoch (all clients together): aggregate payload rate."""

    seconds: float
    rows: int
    nbytes: int

    @property
    def mib_s(self) -> float:
        return self.nbytes / self.seconds / MIB

    @property
    def samples_s(self) -> float:
        return self.rows / self.seconds


RunT = TypeVar("RunT", bound=Run)


@dataclass
class Measurement(Generic[RunT]):
    """The runs of one (server, payload size, client count)."""

    server: str
    size: int
    clients: int
    runs: list[RunT] = field(default_factory=list)

    @property
    def best(self) -> RunT:
        return max(self.runs, key=lambda r: r.mib_s)

    @property
    def median(self) -> RunT:
        """The middle run by throughput (the lower middle of an even count)."""
        ordered = sorted(self.runs, key=lambda r: r.mib_s)
        return ordered[(len(ordered) - 1) // 2]


def timed_epoch(
    pool: ClientPool,
    jobs: Sequence[TicketJob | EpochJob],
    expect: tuple[int, int],
    who: str,
    on_start: Callable[[], None] | None = None,
) -> tuple[Run, list[dict[str, Any]]]:
    """Stream ``jobs`` at once; the span from the first start to the last end, checked
    against the expected ``(rows, payload bytes)``; also each client's stats."""
    results = pool.run(jobs, on_start=on_start)
    rows, nbytes = sum(r["rows"] for r in results), sum(r["bytes"] for r in results)
    if (rows, nbytes) != expect:
        raise BenchError(
            f"{who}: got {rows} rows / {nbytes} B, expected {expect[0]} rows / {expect[1]} B"
        )
    seconds = max(r["end"] for r in results) - min(r["start"] for r in results)
    return Run(seconds, rows, nbytes), results


# -- report and command line ------------------------------------------------------


def render(header: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]

    def fmt(line: Sequence[str]) -> str:
        first = line[0].ljust(widths[0])
        rest = [text.rjust(width) for text, width in zip(line[1:], widths[1:], strict=True)]
        return " | ".join([first, *rest]).rstrip()

    rule = "-+-".join("-" * width for width in widths)
    return "\n".join([fmt(header), rule, *(fmt(line) for line in lines)])


def load_line(load: tuple[Sequence[float], Sequence[float]], caveat: str) -> str:
    """The load average at start and end, then ``caveat``."""
    return (
        f"load average at start {load[0][0]:.2f} / end {load[1][0]:.2f} on {os.cpu_count()} "
        f"CPUs: {caveat}"
    )


def base_parser(description: str, quick_help: str) -> argparse.ArgumentParser:
    """``--quick``, ``--json`` and ``--data-dir``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--json", type=Path, metavar="PATH", help="also dump raw results here")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=BENCH_DIR / ".bench-data",
        help="where temporary caches go (default benchmarks/.bench-data, removed afterwards)",
    )
    return parser


@contextlib.contextmanager
def scratch_dir(data_dir: Path, prefix: str) -> Iterator[Path]:
    """A fresh directory under ``data_dir``, removed afterwards (``data_dir`` too if empty)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=prefix, dir=data_dir)).resolve()
    try:
        yield workdir
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        with contextlib.suppress(OSError):
            data_dir.rmdir()  # only when empty
