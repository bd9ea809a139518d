"""Flight epoch streams: our server against a raw pyarrow Flight server, and server RSS.

Run from the project root::

    uv run --no-sync python benchmarks/bench_flight.py            # full sizes (~2-4 minutes)
    uv run --no-sync python benchmarks/bench_flight.py --quick    # 4x less data, smoke test
    uv run --no-sync python benchmarks/bench_flight.py --json results.json

Two measurements, one run:

1. ``do_get`` throughput of one shuffled epoch from ``python -m flight_server`` (a
   cache written by ``dataset_rt``) against the ceiling: a minimal
   ``pyarrow.flight.FlightServerBase`` whose ``do_get`` answers
   ``flight.RecordBatchStream`` of an in-memory ``pa.Table`` holding the same
   payloads in batches of the same shape (``--raw-server`` mode of this file). At
   1 KiB, 64 KiB and 1 MiB payloads, with one client and with two concurrent
   clients (ranks 0 and 1 of a world of 2). Target: ours >= 0.8x raw everywhere.
2. The server's RSS (``/proc/<pid>/status`` every 100 ms) while one client streams a
   4 GiB epoch (512 MiB with ``--quick``). Target: peak VmRSS <= 512 MiB.

Servers and clients are separate processes (clients are ``multiprocessing`` spawn
workers), everything binds 127.0.0.1, and every wait is bounded.
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = BENCH_DIR.parent
HOST = "127.0.0.1"
DATASET = "bench"
SEED = 0
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
PAYLOAD_SIZES = (KIB, 64 * KIB, MIB)
# The shape of our server's batches (DatasetFlightServer: batch_size=1024 rows;
# the native stream closes a batch before it would pass 4 MiB of payload).
BATCH_ROWS = 1024
BATCH_BYTES = 4 * MIB
POOL_BYTES = 16 * MIB
CLIENT_COUNTS = (1, 2)
TARGET_RATIO = 0.8
TARGET_RSS = 512 * MIB
RSS_INTERVAL = 0.1
SERVER_START_TIMEOUT = 120.0
CLIENT_READY_TIMEOUT = 60.0
STREAM_TIMEOUT = 600.0
STOP_TIMEOUT = 10.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
PR_SET_PDEATHSIG = 1


class BenchError(RuntimeError):
    """A server or client did not behave as the benchmark expects."""


@dataclass(frozen=True)
class Scale:
    """Data volumes of one run."""

    name: str
    total_bytes: int  # payload bytes of one epoch per throughput measurement
    repeats: int  # best of N per (size, clients, server)
    rss_records: int  # 1 MiB records in the RSS test's cache
    rss_epoch_len: int  # samples in the RSS test's epoch

    @classmethod
    def of(cls, quick: bool) -> Scale:
        if quick:
            return cls("quick", 128 * MIB, 3, 256, 512)
        return cls("full", 512 * MIB, 5, 2048, 4096)


def log(message: str) -> None:
    print(f"[bench_flight] {message}", file=sys.stderr, flush=True)


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


# -- payloads (identical in the cache and in the raw server's table) --------------


def payload_pool() -> bytes:
    """Fixed-seed random bytes; payload ``i`` of a size is a slice at a fixed offset."""
    return random.Random(0).randbytes(POOL_BYTES)


def payload_offsets(count: int, size: int) -> list[int]:
    return random.Random(size).choices(range(POOL_BYTES - size + 1), k=count)


def batch_bounds(count: int, size: int) -> Iterator[tuple[int, int]]:
    """``[start, stop)`` of each batch: at most BATCH_ROWS rows and BATCH_BYTES bytes."""
    rows = max(1, min(BATCH_ROWS, BATCH_BYTES // size))
    for start in range(0, count, rows):
        yield start, min(count, start + rows)


# -- the raw ceiling: a minimal pyarrow Flight server (``--raw-server``) ----------


def raw_batches(count: int, size: int) -> list[Any]:
    """The same payloads as the cache, as ``position, cache_id, sample_id, payload``."""
    import pyarrow as pa

    pool = payload_pool()
    offsets = payload_offsets(count, size)
    batches = []
    for start, stop in batch_bounds(count, size):
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


def serve_raw(count: int, size: int) -> int:
    """Serve ``count`` payloads of ``size`` bytes from memory until SIGTERM."""
    import pyarrow as pa
    import pyarrow.flight as flight

    batches = raw_batches(count, size)
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


# -- processes --------------------------------------------------------------------


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


def start_ours(cache: Path, workdir: Path) -> ServerProcess:
    command = [sys.executable, "-m", "flight_server", "--port", "0"]
    # A fresh state directory per server: the population store is keyed by dataset
    # name, and a store left by another cache under the same name is not reusable.
    data_dir = tempfile.mkdtemp(prefix="server-data-", dir=workdir)
    command += ["--dataset", f"{DATASET}={cache}", "--data-dir", data_dir]
    command += ["--log-level", "WARNING"]
    return ServerProcess.start("ours", command, workdir)


def start_raw(count: int, size: int, workdir: Path) -> ServerProcess:
    command = [sys.executable, str(Path(__file__).resolve()), "--raw-server"]
    command += ["--count", str(count), "--payload-size", str(size)]
    return ServerProcess.start("raw", command, workdir)


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a whole process (including its exited threads)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of the live threads of ``pid``, by thread name (trailing digits cut)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError):
            text = (task / "stat").read_text()
            name = re.sub(r"[-_]?\d+$", "", text[text.index("(") + 1 : text.rindex(")")])
            fields = text[text.rindex(")") + 2 :].split()
            out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def read_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile and RssShmem of ``pid`` in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
            out[key] = int(value.split()[0]) * KIB
    return out


class RssSampler(threading.Thread):
    """Samples ``/proc/<pid>/status`` every RSS_INTERVAL seconds until stopped."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.samples: list[dict[str, float]] = []
        self._halt = threading.Event()
        self._t0 = time.monotonic()

    def sample(self) -> None:
        with contextlib.suppress(OSError):
            status: dict[str, float] = dict(read_status(self.pid))
            status["t"] = round(time.monotonic() - self._t0, 3)
            self.samples.append(status)

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(RSS_INTERVAL)

    def stop(self) -> None:
        self._halt.set()
        self.join(5.0)
        self.sample()

    def peak(self, key: str) -> int:
        return int(max((s.get(key, 0) for s in self.samples), default=0))


# -- clients: spawned worker processes, released together -------------------------


def client_worker(index: int, jobs: Any, results: Any, go: Any) -> None:
    """Stream each job's ticket to the end; report rows, payload bytes and times."""
    import pyarrow.compute as pc
    import pyarrow.flight as flight

    def payload_bytes(array: Any) -> int:
        return int(pc.sum(pc.binary_length(array)).as_py() or 0)

    parent = os.getppid()
    clients: dict[str, Any] = {}
    while True:
        try:
            job = jobs.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:
                return  # orphaned
            continue
        if job is None:
            return
        location, ticket = job
        try:
            if location not in clients:
                clients[location] = flight.connect(location)
            client = clients[location]
            results.put(("ready", index, None))
            if not go.wait(CLIENT_READY_TIMEOUT):
                results.put(("error", index, "never released"))
                continue
            rows = nbytes = batches = 0
            start = time.monotonic()
            first = None
            for chunk in client.do_get(flight.Ticket(ticket)):
                batch = chunk.data
                if first is None:
                    first = time.monotonic() - start
                rows += batch.num_rows
                nbytes += payload_bytes(batch.column("payload"))
                batches += 1
            end = time.monotonic()
            stats = {"rows": rows, "bytes": nbytes, "batches": batches}
            results.put(("done", index, stats | {"start": start, "end": end, "first": first}))
        except Exception as error:  # reported to the parent, which fails the run
            results.put(("error", index, f"{type(error).__name__}: {error}"))


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
        self, location: str, tickets: Sequence[bytes], on_start: Callable[[], None] | None = None
    ) -> list[dict[str, Any]]:
        self.go.clear()
        for job_queue, ticket in zip(self.jobs, tickets, strict=False):
            job_queue.put((location, ticket))
        self._collect("ready", len(tickets), CLIENT_READY_TIMEOUT)
        if on_start is not None:
            on_start()
        self.go.set()
        try:
            return self._collect("done", len(tickets), STREAM_TIMEOUT)
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
    """One epoch (all clients together): aggregate payload rate and server CPU."""

    seconds: float
    rows: int
    nbytes: int
    server_user: float
    server_sys: float
    threads: dict[str, float]
    clients: list[dict[str, Any]]

    @property
    def mib_s(self) -> float:
        return self.nbytes / self.seconds / MIB

    @property
    def samples_s(self) -> float:
        return self.rows / self.seconds

    @property
    def server_cpu(self) -> float:
        return self.server_user + self.server_sys

    @property
    def cpu_per_gib(self) -> float:
        return self.server_cpu / (self.nbytes / GIB)


@dataclass
class Measurement:
    server: str
    size: int
    clients: int
    runs: list[Run] = field(default_factory=list)

    @property
    def best(self) -> Run:
        return max(self.runs, key=lambda r: r.mib_s)


def our_tickets(location: str, world_size: int, epoch_len: int | None = None) -> list[bytes]:
    """One ticket per rank of epoch 0, shuffled, from ``get_flight_info``."""
    import pyarrow.flight as flight

    command: dict[str, Any] = {"dataset": DATASET, "seed": SEED, "epoch": 0, "shuffle": True}
    command["world_size"] = world_size
    if epoch_len is not None:
        command["epoch_len"] = epoch_len
    client = flight.connect(location)
    try:
        info = client.get_flight_info(flight.FlightDescriptor.for_command(json.dumps(command)))
    finally:
        client.close()
    return [bytes(endpoint.ticket.ticket) for endpoint in info.endpoints]


def raw_tickets(world_size: int) -> list[bytes]:
    return [json.dumps({"rank": r, "world_size": world_size}).encode() for r in range(world_size)]


def timed_epoch(
    pool: ClientPool, server: ServerProcess, tickets: Sequence[bytes], expect: tuple[int, int]
) -> Run:
    pid = server.proc.pid
    before: dict[str, Any] = {}

    def mark() -> None:
        before.update(cpu=cpu_seconds(pid), threads=thread_cpu(pid))

    results = pool.run(server.location, tickets, on_start=mark)
    (user0, sys0), (user1, sys1) = before["cpu"], cpu_seconds(pid)
    user, system = user1 - user0, sys1 - sys0
    threads = thread_cpu(pid)
    deltas = {k: round(v - before["threads"].get(k, 0.0), 3) for k, v in threads.items()}
    rows, nbytes = sum(r["rows"] for r in results), sum(r["bytes"] for r in results)
    if (rows, nbytes) != expect:
        raise BenchError(f"{server.name}: got {rows} rows / {nbytes} B, expected {expect}")
    seconds = max(r["end"] for r in results) - min(r["start"] for r in results)
    threads_used = {k: v for k, v in deltas.items() if v > 0}
    return Run(seconds, rows, nbytes, user, system, threads_used, results)


class CacheSource:
    """``count`` records of ``size`` bytes: the same payloads as `raw_batches`."""

    def __init__(self, drt: Any, count: int, size: int) -> None:
        self.name = f"bench_{size}"
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


def write_cache(count: int, size: int, root: Path) -> tuple[Path, float]:
    import dataset_rt as drt

    started = time.perf_counter()
    runtime = drt.DatasetRuntime(num_workers=2)
    config = drt.WriterConfig(show_progress=False)
    [result] = runtime.write_cache(CacheSource(drt, count, size), root, writer_config=config)
    if not isinstance(result, drt.CacheWriteSuccess):
        raise BenchError(f"write_cache failed: {result!r}")
    return Path(result.path), time.perf_counter() - started


def measure_size(
    size: int, scale: Scale, pool: ClientPool, workdir: Path
) -> tuple[list[Measurement], float]:
    """Ours and raw at one payload size, 1 and 2 clients, repeats interleaved."""
    count = scale.total_bytes // size
    log(f"{human_bytes(size)}: writing a cache of {count} records ({human_bytes(count * size)})")
    cache, write_seconds = write_cache(count, size, workdir / f"cache-{size}")
    servers: list[ServerProcess] = []
    try:
        servers = [start_ours(cache, workdir), start_raw(count, size, workdir)]
        for server in servers:
            server.wait_location()
        ours = servers[0]
        out = []
        for clients in CLIENT_COUNTS:
            tickets = {"ours": our_tickets(ours.location, clients), "raw": raw_tickets(clients)}
            pair = {s.name: Measurement(s.name, size, clients) for s in servers}
            for repeat in range(scale.repeats):
                # Alternate who goes first so that background load hits both alike.
                for server in servers if repeat % 2 == 0 else servers[::-1]:
                    run = timed_epoch(pool, server, tickets[server.name], (count, count * size))
                    pair[server.name].runs.append(run)
                    log(
                        f"  {human_bytes(size)} x{clients} {server.name:4}: "
                        f"{run.mib_s:8,.0f} MiB/s ({run.seconds:.2f} s, "
                        f"server CPU {run.cpu_per_gib:.2f} s/GiB)"
                    )
            out += [pair["ours"], pair["raw"]]
        return out, write_seconds
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(cache.parent, ignore_errors=True)


@dataclass
class RssResult:
    records: int
    epoch_len: int
    nbytes: int
    seconds: float
    before: dict[str, int]
    peak_rss: int
    peak_anon: int
    peak_file: int
    hwm: int
    samples: list[dict[str, float]]


def measure_rss(scale: Scale, pool: ClientPool, workdir: Path) -> RssResult:
    """Peak server RSS while one client streams a long epoch of 1 MiB records."""
    size, count, epoch_len = MIB, scale.rss_records, scale.rss_epoch_len
    log(f"RSS: writing {count} x 1 MiB; one client streams {human_bytes(epoch_len * size)}")
    cache, _ = write_cache(count, size, workdir / "cache-rss")
    server = start_ours(cache, workdir)
    try:
        server.wait_location()
        tickets = our_tickets(server.location, 1, epoch_len)
        before = read_status(server.proc.pid)
        sampler = RssSampler(server.proc.pid)
        sampler.start()
        try:
            run = timed_epoch(pool, server, tickets, (epoch_len, epoch_len * size))
        finally:
            sampler.stop()
        return RssResult(
            count,
            epoch_len,
            run.nbytes,
            run.seconds,
            before,
            sampler.peak("VmRSS"),
            sampler.peak("RssAnon"),
            sampler.peak("RssFile"),
            read_status(server.proc.pid)["VmHWM"],
            sampler.samples,
        )
    finally:
        server.stop()
        shutil.rmtree(cache.parent, ignore_errors=True)


# -- report -----------------------------------------------------------------------


def render(header: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]

    def fmt(line: Sequence[str]) -> str:
        first = line[0].ljust(widths[0])
        rest = [text.rjust(width) for text, width in zip(line[1:], widths[1:], strict=True)]
        return " | ".join([first, *rest]).rstrip()

    rule = "-+-".join("-" * width for width in widths)
    return "\n".join([fmt(header), rule, *(fmt(line) for line in lines)])


def throughput_table(measurements: Sequence[Measurement]) -> list[dict[str, Any]]:
    table = []
    by_key = {(m.server, m.size, m.clients): m for m in measurements}
    for size in PAYLOAD_SIZES:
        for clients in CLIENT_COUNTS:
            ours, raw = by_key.get(("ours", size, clients)), by_key.get(("raw", size, clients))
            if ours is None or raw is None:
                continue
            a, b = ours.best, raw.best
            ratio = a.mib_s / b.mib_s
            table.append(
                {
                    "size": size,
                    "clients": clients,
                    "ours_mib_s": a.mib_s,
                    "ours_samples_s": a.samples_s,
                    "raw_mib_s": b.mib_s,
                    "raw_samples_s": b.samples_s,
                    "ratio": ratio,
                    "ours_cpu_s_per_gib": a.cpu_per_gib,
                    "raw_cpu_s_per_gib": b.cpu_per_gib,
                    "verdict": "ok" if ratio >= TARGET_RATIO else "BELOW",
                }
            )
    return table


def print_report(
    scale: Scale,
    table: Sequence[dict[str, Any]],
    measurements: Sequence[Measurement],
    rss: RssResult | None,
    elapsed: float,
    load: tuple[tuple[float, ...], tuple[float, ...]],
) -> None:
    print(f"\nFlight epoch-stream benchmark ({scale.name} sizes, {elapsed:.0f} s)\n")
    lines = []
    for row in table:
        clients = "1 client" if row["clients"] == 1 else f"{row['clients']} clients"
        lines.append(
            [
                f"do_get {human_bytes(row['size'])} payloads, {clients}",
                f"{row['ours_mib_s']:,.0f} MiB/s, {human_count(row['ours_samples_s'])}/s",
                f"{row['raw_mib_s']:,.0f} MiB/s, {human_count(row['raw_samples_s'])}/s",
                f"{row['ratio']:.2f}x",
                f">= {TARGET_RATIO:g}x",
                row["verdict"],
                f"{row['ours_cpu_s_per_gib']:.2f} / {row['raw_cpu_s_per_gib']:.2f}",
            ]
        )
    if rss is not None:
        rss_ok = "ok" if rss.peak_rss <= TARGET_RSS else "ABOVE"
        anon_ok = "ok" if rss.peak_anon <= TARGET_RSS else "ABOVE"
        epoch = f"{human_bytes(rss.nbytes)} epoch"
        lines += [
            [
                f"server peak VmRSS, 1 client, {epoch}",
                human_bytes(rss.peak_rss),
                "",
                "",
                f"<= {human_bytes(TARGET_RSS)}",
                rss_ok,
                "",
            ],
            [
                "  of which RssAnon (private) peak",
                human_bytes(rss.peak_anon),
                "",
                "",
                f"<= {human_bytes(TARGET_RSS)}",
                anon_ok,
                "",
            ],
            [
                "  of which RssFile (mapped cache) peak",
                human_bytes(rss.peak_file),
                "",
                "",
                "",
                "",
                "",
            ],
            ["  VmHWM at the end", human_bytes(rss.hwm), "", "", "", "", ""],
            [
                "  VmRSS before the stream",
                human_bytes(rss.before.get("VmRSS", 0)),
                "",
                "",
                "",
                "",
                "",
            ],
        ]
    header = ["workload", "ours", "raw pyarrow", "ratio", "target", "", "server CPU s/GiB"]
    print(render(header, lines))
    print()
    per_epoch = human_bytes(scale.total_bytes)
    print(
        f"ratio = ours / raw throughput of payload bytes (MiB/s = 2**20 B/s); best of "
        f"{scale.repeats} epochs of {per_epoch} each, ours and raw interleaved. Two clients "
        "stream ranks 0 and 1 of world_size 2 at once; their rate is total bytes over the "
        "span from the first start to the last end."
    )
    print(
        "ours: python -m flight_server (DatasetFlightServer, --num-workers 2) over a "
        f"dataset_rt cache, seed {SEED}, shuffle=True, epoch 0. raw: pyarrow FlightServerBase, "
        "do_get -> RecordBatchStream(in-memory pa.Table) of the same payloads in batches of "
        f"<= {BATCH_ROWS} rows and <= {human_bytes(BATCH_BYTES)}. Clients: spawned processes."
    )
    if rss is not None:
        print(
            f"RSS: /proc/<pid>/status every {RSS_INTERVAL * 1000:.0f} ms while one client "
            f"streamed {rss.epoch_len} samples over a cache of {rss.records} x 1 MiB in "
            f"{rss.seconds:.1f} s ({len(rss.samples)} samples). VmRSS counts the resident "
            "pages of the memory-mapped cache shards (RssFile); RssAnon is the server's own "
            "memory."
        )
    print("server CPU by thread (ours, best run):")
    for m in measurements:
        if m.server == "ours":
            best = m.best
            parts = sorted(best.threads.items(), key=lambda kv: -kv[1])
            text = ", ".join(f"{name} {sec:.2f}s" for name, sec in parts[:5])
            print(
                f"  {human_bytes(m.size):>7} x{m.clients}: {best.server_cpu:.2f}s "
                f"(sys {best.server_sys:.2f}s) in {best.seconds:.2f}s wall: {text}"
            )
    print(
        f"load average at start {load[0][0]:.2f} / end {load[1][0]:.2f} on {os.cpu_count()} "
        "CPUs: with other work on the machine the figures move by tens of percent."
    )


# -- command line -----------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="128 MiB epochs, 512 MiB RSS epoch")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also dump raw results here")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=BENCH_DIR / ".bench-data",
        help="where temporary caches go (default benchmarks/.bench-data, removed afterwards)",
    )
    parser.add_argument("--skip-rss", action="store_true", help="only the throughput table")
    parser.add_argument("--raw-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--payload-size", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.raw_server:
        return serve_raw(args.count, args.payload_size)
    scale = Scale.of(args.quick)
    # SIGTERM unwinds like Ctrl-C, so that the `finally` below stops servers and clients.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.perf_counter()
    load_start = os.getloadavg()
    args.data_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="flight-", dir=args.data_dir))
    pool: ClientPool | None = None
    measurements: list[Measurement] = []
    writes: dict[int, float] = {}
    rss = None
    try:
        pool = ClientPool(max(CLIENT_COUNTS))
        for size in PAYLOAD_SIZES:
            found, writes[size] = measure_size(size, scale, pool, workdir)
            measurements += found
        if not args.skip_rss:
            rss = measure_rss(scale, pool, workdir)
    finally:
        if pool is not None:
            pool.close()
        shutil.rmtree(workdir, ignore_errors=True)
        with contextlib.suppress(OSError):
            args.data_dir.rmdir()  # only when empty
    elapsed = time.perf_counter() - started
    table = throughput_table(measurements)
    print_report(scale, table, measurements, rss, elapsed, (load_start, os.getloadavg()))
    if args.json:
        dump = {
            "scale": asdict(scale),
            "elapsed_seconds": elapsed,
            "load_average": {"start": load_start, "end": os.getloadavg()},
            "cpus": os.cpu_count(),
            "cache_write_seconds": writes,
            "table": table,
            "measurements": [
                {
                    "server": m.server,
                    "size": m.size,
                    "clients": m.clients,
                    "runs": [asdict(r) for r in m.runs],
                }
                for m in measurements
            ],
            "rss": asdict(rss) if rss is not None else None,
        }
        args.json.write_text(json.dumps(dump, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
