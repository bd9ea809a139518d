"""Flight epoch streams: our server against a raw pyarrow Flight server, and server RSS.

Run from the project root::

    uv run --no-sync python benchmarks/bench_flight.py            # full sizes (~2-4 minutes)
    uv run --no-sync python benchmarks/bench_flight.py --quick    # 4x less data, smoke test
    uv run --no-sync python benchmarks/bench_flight.py --json results.json

Two measurements, one run:

1. ``do_get`` throughput of one shuffled epoch from ``python -m flight_server`` (a
   cache written by ``dataset_rt``) against two references. The Flight floor
   (``raw``): a minimal
   ``pyarrow.flight.FlightServerBase`` whose ``do_get`` answers
   ``flight.RecordBatchStream`` of an in-memory ``pa.Table`` holding the same
   payloads in batches of the same shape (``--raw-server`` mode of this file). The
   sampling floor (``--sampling-server``): a pyarrow server that reads the same
   records from a file at random positions with ``pread`` and hashes each with
   xxh3, the least work of a sampled, verified stream. At
   1 KiB, 64 KiB and 1 MiB payloads, with one client and with two concurrent
   clients (ranks 0 and 1 of a world of 2). Targets: ours >= 0.85x raw throughput
   everywhere, and server CPU per GiB <= 2.0x raw at 1 KiB, <= 1.5x above.
2. The server's RSS (``/proc/<pid>/status`` every 100 ms) while one client streams a
   4 GiB epoch (512 MiB with ``--quick``). Target: peak VmRSS <= 512 MiB.
3. Time to first batch (``_ttfb.py``): ``get_flight_info`` + the first batch of
   ``do_get``, p50 and p99 over 200 requests (50 with ``--quick``) at stream
   positions 0 and 10^12, which must cost the same.

With ``--floor`` (needs ``cargo``: it builds ``native/examples/read_floor.rs``),
each size's CPU row also shows the floor of the CPU ratio on this machine: the raw
server's CPU per GiB plus the least per-record work a verified sampled stream
keeps, timed by ``read_floor`` on the same cache in the same run (each record read
at a random position and hashed, and copied into its batch below the size the
server lends). Our server does that work and also sends what the raw server
sends, so whatever its code its CPU ratio cannot go far below the floor: a target
under it is out of reach on that machine.

Servers and clients are separate processes (clients are ``multiprocessing`` spawn
workers), everything binds 127.0.0.1, and every wait is bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _flight_common as common  # the benchmarks directory is not a package
import _ttfb
from _flight_common import (
    BATCH_BYTES,
    BATCH_ROWS,
    GIB,
    KIB,
    MIB,
    SEED,
    human_bytes,
    human_count,
    render,
)

DATASET = "bench"
PAYLOAD_SIZES = (KIB, 64 * KIB, MIB)
CLIENT_COUNTS = (1, 2)
TARGET_RATIO = 0.85
# Server CPU seconds per GiB served, ours / raw: what decides how many trainers one
# server core feeds (benchmarks/README.md, capacity).
TARGET_RSS = 512 * MIB


def target_cpu_ratio(size: int) -> float:
    """Issue 23's bound on our server CPU per GiB over the raw server's."""
    return 2.0 if size < 64 * KIB else 1.5


RSS_INTERVAL = 0.1
FLOOR_PASSES = 5  # read_floor's passes over ~1 GiB of draws, the median taken
FLOOR_BUILD_TIMEOUT = 1800.0
FLOOR_RUN_TIMEOUT = 600.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Scale(common.Scale):
    """Data volumes of one run."""

    rss_records: int  # 1 MiB records in the RSS test's cache
    rss_epoch_len: int  # samples in the RSS test's epoch

    QUICK = (128 * MIB, 3, 256, 512)  # total_bytes, repeats, rss_records, rss_epoch_len
    FULL = (512 * MIB, 5, 2048, 4096)


log = common.make_log("bench_flight")


# -- processes --------------------------------------------------------------------


def start_ours(cache: Path, workdir: Path) -> common.ServerProcess:
    command = [sys.executable, "-m", "flight_server", "--port", "0"]
    # A fresh state directory per server: the population store is keyed by dataset
    # name, and a store left by another cache under the same name is not reusable.
    data_dir = tempfile.mkdtemp(prefix="server-data-", dir=workdir)
    command += ["--dataset", f"{DATASET}={cache}", "--data-dir", data_dir]
    command += ["--log-level", "WARNING"]
    return common.ServerProcess.start("ours", command, workdir)


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


# -- measurements -----------------------------------------------------------------


@dataclass
class ServerRun(common.Run):
    """One epoch (all clients together): aggregate payload rate and server CPU."""

    server_user: float
    server_sys: float
    threads: dict[str, float]
    clients: list[dict[str, Any]]

    @property
    def server_cpu(self) -> float:
        return self.server_user + self.server_sys

    @property
    def cpu_per_gib(self) -> float:
        return self.server_cpu / (self.nbytes / GIB)

    @property
    def client_cpu_per_gib(self) -> float:
        """The clients' CPU seconds (all their threads) per GiB they received."""
        return sum(float(c.get("cpu", 0.0)) for c in self.clients) / (self.nbytes / GIB)


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


def server_epoch(
    pool: common.ClientPool,
    server: common.ServerProcess,
    tickets: Sequence[bytes],
    expect: tuple[int, int],
) -> ServerRun:
    """One epoch of ``tickets`` (a client each) and the server's CPU time meanwhile."""
    pid = server.proc.pid
    before: dict[str, Any] = {}

    def mark() -> None:
        before.update(cpu=cpu_seconds(pid), threads=thread_cpu(pid))

    jobs = [common.TicketJob(server.location, ticket) for ticket in tickets]
    run, results = common.timed_epoch(pool, jobs, expect, server.name, on_start=mark)
    (user0, sys0), (user1, sys1) = before["cpu"], cpu_seconds(pid)
    user, system = user1 - user0, sys1 - sys0
    threads = thread_cpu(pid)
    deltas = {k: round(v - before["threads"].get(k, 0.0), 3) for k, v in threads.items()}
    threads_used = {k: v for k, v in deltas.items() if v > 0}
    return ServerRun(run.seconds, run.rows, run.nbytes, user, system, threads_used, results)


def build_read_floor() -> Path:
    """Build ``native/examples/read_floor.rs`` (release); the program's path."""
    cargo = shutil.which("cargo")
    if cargo is None:
        raise common.BenchError("--floor builds a Rust example: put cargo on PATH")
    log("building native/examples/read_floor.rs (release)")
    example = ["-p", "dataset_rt_native", "--example", "read_floor"]
    subprocess.run(
        [cargo, "build", "--release", "--quiet", *example],
        cwd=common.PROJECT_ROOT,
        check=True,
        timeout=FLOOR_BUILD_TIMEOUT,
    )
    meta = subprocess.run(
        [cargo, "metadata", "--format-version", "1", "--no-deps"],
        cwd=common.PROJECT_ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return Path(json.loads(meta.stdout)["target_directory"]) / "release/examples/read_floor"


def read_floor(program: Path, cache: Path) -> float:
    """The least CPU seconds per GiB of a verified read of ``cache``'s records drawn at
    random (one thread), as ``read_floor`` prints it: the hash of records the server
    lends, else the lesser of a hash plus a plain copy and the engine's own read."""
    done = subprocess.run(
        [str(program), str(cache), str(FLOOR_PASSES)],
        capture_output=True,
        text=True,
        timeout=FLOOR_RUN_TIMEOUT,
    )
    if done.returncode != 0:
        raise common.BenchError(
            f"read_floor exited with code {done.returncode} on {cache}:\n{done.stderr[-2000:]}"
        )
    found = re.search(r"^\s+floor\s+\d+ ns/record\s+([\d.]+) CPU s/GiB", done.stdout, re.MULTILINE)
    if found is None:
        raise common.BenchError(f"read_floor printed no floor line:\n{done.stdout}")
    return float(found.group(1))


def measure_size(
    size: int,
    scale: Scale,
    pool: common.ClientPool,
    workdir: Path,
    floor: Path | None,
    big_batch_bytes: int | None = None,
) -> tuple[list[common.Measurement[ServerRun]], float, float | None]:
    """Ours, raw and the sampling floor at one payload size, 1 and 2 clients, repeats
    interleaved; with ``floor`` (the ``read_floor`` program), the verified read's
    CPU floor of the same cache too; with ``big_batch_bytes``, a second raw server
    ("raw-big") holding the payloads in batches of that many bytes."""
    count = scale.total_bytes // size
    log(f"{human_bytes(size)}: writing a cache of {count} records ({human_bytes(count * size)})")
    cache, write_seconds = common.write_cache(
        f"bench_{size}", count, size, workdir / f"cache-{size}"
    )
    servers: list[common.ServerProcess] = []
    try:
        servers = [
            start_ours(cache, workdir),
            common.start_raw(count, size, workdir),
            common.start_sampling(count, size, workdir),
        ]
        if big_batch_bytes is not None:
            servers.append(common.start_raw(count, size, workdir, big_batch_bytes, "raw-big"))
        for server in servers:
            server.wait_location()
        ours = servers[0]
        # One epoch each first, not counted: a cache just written (around the
        # page cache) is read from the disk the first time.
        for server in servers:
            tickets = our_tickets(ours.location, 1) if server is ours else common.raw_tickets(1)
            run = server_epoch(pool, server, tickets, (count, count * size))
            log(f"  {human_bytes(size)} warm-up {server.name:8}: {run.mib_s:8,.0f} MiB/s")
        out = []
        for clients in CLIENT_COUNTS:
            tickets = {
                "ours": our_tickets(ours.location, clients),
                "raw": common.raw_tickets(clients),
                "sampling": common.raw_tickets(clients),
                "raw-big": common.raw_tickets(clients),
            }
            pair = {s.name: common.Measurement(s.name, size, clients) for s in servers}
            for repeat in range(scale.repeats):
                # Alternate who goes first so that background load hits both alike.
                for server in servers if repeat % 2 == 0 else servers[::-1]:
                    run = server_epoch(pool, server, tickets[server.name], (count, count * size))
                    pair[server.name].runs.append(run)
                    log(
                        f"  {human_bytes(size)} x{clients} {server.name:8}: "
                        f"{run.mib_s:8,.0f} MiB/s ({run.seconds:.2f} s, "
                        f"server CPU {run.cpu_per_gib:.2f} s/GiB)"
                    )
            out += list(pair.values())
        floor_s_gib = None
        if floor is not None:
            floor_s_gib = read_floor(floor, cache)
            log(f"  {human_bytes(size)} verified-read floor: {floor_s_gib:.3f} CPU s/GiB")
        return out, write_seconds, floor_s_gib
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


def measure_rss(scale: Scale, pool: common.ClientPool, workdir: Path) -> RssResult:
    """Peak server RSS while one client streams a long epoch of 1 MiB records."""
    size, count, epoch_len = MIB, scale.rss_records, scale.rss_epoch_len
    log(f"RSS: writing {count} x 1 MiB; one client streams {human_bytes(epoch_len * size)}")
    cache, _ = common.write_cache(f"bench_{size}", count, size, workdir / "cache-rss")
    server = start_ours(cache, workdir)
    try:
        server.wait_location()
        tickets = our_tickets(server.location, 1, epoch_len)
        before = read_status(server.proc.pid)
        sampler = RssSampler(server.proc.pid)
        sampler.start()
        try:
            run = server_epoch(pool, server, tickets, (epoch_len, epoch_len * size))
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


def measure_ttfb(scale: Scale, workdir: Path) -> _ttfb.TtfbResult:
    """p50/p99 of get_flight_info + first batch, at positions 0 and 10^12."""
    requests = 50 if scale.name == "quick" else 200
    log(f"time to first batch: {requests} requests at each of {_ttfb.POSITIONS}")
    cache, _ = common.write_cache(f"bench_ttfb_{KIB}", 20_000, KIB, workdir / "cache-ttfb")
    server = start_ours(cache, workdir)
    try:
        server.wait_location()
        return _ttfb.measure(server.location, DATASET, requests=requests, seed=SEED)
    finally:
        server.stop()
        shutil.rmtree(cache.parent, ignore_errors=True)


# -- report -----------------------------------------------------------------------


def cpu_per_gib(runs: Sequence[ServerRun]) -> float:
    """The server's CPU seconds per GiB sent over all of ``runs``."""
    return sum(r.server_cpu for r in runs) / (sum(r.nbytes for r in runs) / GIB)


def throughput_table(
    measurements: Sequence[common.Measurement[ServerRun]], floors: dict[int, float]
) -> list[dict[str, Any]]:
    table = []
    by_key = {(m.server, m.size, m.clients): m for m in measurements}
    for size in sorted({m.size for m in measurements}):
        for clients in CLIENT_COUNTS:
            ours, raw = by_key.get(("ours", size, clients)), by_key.get(("raw", size, clients))
            sampling = by_key.get(("sampling", size, clients))
            if ours is None or raw is None or sampling is None:
                continue
            a, b, floor = ours.median, raw.median, sampling.median
            ratio = a.mib_s / b.mib_s
            # CPU over every epoch, not the best one: the clock ticks of one
            # short epoch (10 ms each) leave its figure uncertain by +-15%.
            ours_cpu, raw_cpu = cpu_per_gib(ours.runs), cpu_per_gib(raw.runs)
            cpu_ratio = ours_cpu / raw_cpu
            read_floor_cpu = floors.get(size)
            big = by_key.get(("raw-big", size, clients))
            big_cpu = None if big is None else cpu_per_gib(big.runs)
            table.append(
                {
                    "size": size,
                    "clients": clients,
                    "ours_mib_s": a.mib_s,
                    "ours_samples_s": a.samples_s,
                    "raw_mib_s": b.mib_s,
                    "raw_samples_s": b.samples_s,
                    "ratio": ratio,
                    "sampling_mib_s": floor.mib_s,
                    "sampling_ratio": a.mib_s / floor.mib_s,
                    "sampling_cpu_s_per_gib": cpu_per_gib(sampling.runs),
                    "ours_cpu_s_per_gib": ours_cpu,
                    "raw_cpu_s_per_gib": raw_cpu,
                    "ours_client_cpu_s_per_gib": a.client_cpu_per_gib,
                    "cpu_ratio": cpu_ratio,
                    "read_floor_s_per_gib": read_floor_cpu,
                    "cpu_floor_ratio": (
                        None if read_floor_cpu is None else (raw_cpu + read_floor_cpu) / raw_cpu
                    ),
                    "raw_big_mib_s": None if big is None else big.median.mib_s,
                    "raw_big_cpu_s_per_gib": big_cpu,
                    "cpu_ratio_big": None if big_cpu is None else ours_cpu / big_cpu,
                    "cpu_floor_ratio_big": (
                        None
                        if big_cpu is None or read_floor_cpu is None
                        else (big_cpu + read_floor_cpu) / big_cpu
                    ),
                    "verdict": "ok" if ratio >= TARGET_RATIO else "BELOW",
                    "cpu_verdict": "ok" if cpu_ratio <= target_cpu_ratio(size) else "ABOVE",
                }
            )
    return table


def print_floor_table(table: Sequence[dict[str, Any]]) -> None:
    """Our CPU against the floor, over each raw server: the one batched like our
    server and, if it ran, the one of large batches (``--raw-batch-mib``)."""
    rows = [row for row in table if row["cpu_floor_ratio"] is not None]
    if not rows:
        return
    big = any(row["cpu_floor_ratio_big"] is not None for row in rows)
    header = ["workload", "ours / floor (raw batched as ours)"]
    if big:
        header += ["raw-big CPU s/GiB", "CPU ratio vs raw-big", "its floor", "ours / floor"]
    lines = []
    for row in rows:
        clients = "1 client" if row["clients"] == 1 else f"{row['clients']} clients"
        line = [
            f"{human_bytes(row['size'])}, {clients}",
            f"{row['cpu_ratio'] / row['cpu_floor_ratio']:.2f}",
        ]
        if big and row["cpu_floor_ratio_big"] is not None:
            line += [
                f"{row['raw_big_cpu_s_per_gib']:.2f}",
                f"{row['cpu_ratio_big']:.2f}x",
                f"{row['cpu_floor_ratio_big']:.2f}x",
                f"{row['cpu_ratio_big'] / row['cpu_floor_ratio_big']:.2f}",
            ]
        lines.append(line + [""] * (len(header) - len(line)))
    print("Our server's CPU per GiB over the floor (target <= 1.1 in every row):")
    print(render(header, lines))
    print()


def print_report(
    scale: Scale,
    table: Sequence[dict[str, Any]],
    measurements: Sequence[common.Measurement[ServerRun]],
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
                f"{row['sampling_mib_s']:,.0f} MiB/s ({row['sampling_ratio']:.2f}x)",
                f"{row['ours_cpu_s_per_gib']:.2f} / {row['raw_cpu_s_per_gib']:.2f}",
                f"{row['cpu_ratio']:.2f}x",
                f"<= {target_cpu_ratio(row['size']):g}x",
                row["cpu_verdict"],
                "" if row["cpu_floor_ratio"] is None else f"{row['cpu_floor_ratio']:.2f}x",
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
    header = [
        "workload",
        "ours",
        "raw pyarrow",
        "ratio",
        "target",
        "",
        "sampling floor (ours/it)",
        "server CPU s/GiB",
        "CPU ratio",
        "target",
        "",
        "CPU floor",
    ]
    # The RSS rows leave the CPU columns empty.
    print(render(header, [line + [""] * (len(header) - len(line)) for line in lines]))
    print()
    print_floor_table(table)
    per_epoch = human_bytes(scale.total_bytes)
    print(
        f"ratio = ours / raw throughput of payload bytes (MiB/s = 2**20 B/s); median of "
        f"{scale.repeats} epochs of {per_epoch} each, the servers interleaved. Two clients "
        "stream ranks 0 and 1 of world_size 2 at once; their rate is total bytes over the "
        "span from the first start to the last end. CPU ratio = the server's CPU seconds "
        "(all threads, user + system) per GiB served, ours / raw, over all the epochs."
    )
    print(
        "ours: python -m flight_server (DatasetFlightServer, --num-workers 2) over a "
        f"dataset_rt cache, seed {SEED}, shuffle=True, epoch 0. raw: pyarrow FlightServerBase, "
        "do_get -> RecordBatchStream(in-memory pa.Table) of the same payloads in batches of "
        f"<= {BATCH_ROWS} rows and <= {human_bytes(BATCH_BYTES)}. sampling floor: the same "
        "payloads in one flat file; a pyarrow server draws positions with replacement, reads "
        "each record with os.pread, hashes it with xxh3 and sends the batch (GeneratorStream): "
        "the least work of a sampled, verified stream. Clients: spawned processes."
    )
    if any(row["cpu_floor_ratio"] is not None for row in table):
        print(
            "CPU floor = (raw CPU + the verified read's floor) / raw CPU: "
            "native/examples/read_floor.rs on the same cache, one thread, each record "
            "drawn at random and hashed with xxh3 where it is mapped, and, below the size "
            "the server lends from, also copied into a batch buffer (the lesser of a "
            "plain copy and the engine's read). Our server does this and also sends what "
            "the raw server sends, so its CPU ratio cannot go below this line by much (only "
            "where a lent record's send reads it from the cache its hash left it in)."
        )
    if rss is not None:
        print(
            f"RSS: /proc/<pid>/status every {RSS_INTERVAL * 1000:.0f} ms while one client "
            f"streamed {rss.epoch_len} samples over a cache of {rss.records} x 1 MiB in "
            f"{rss.seconds:.1f} s ({len(rss.samples)} samples). VmRSS counts the resident "
            "pages of the memory-mapped cache shards (RssFile); RssAnon is the server's own "
            "memory."
        )
    print("server CPU by thread (ours, median run):")
    for m in measurements:
        if m.server == "ours":
            median = m.median
            parts = sorted(median.threads.items(), key=lambda kv: -kv[1])
            text = ", ".join(f"{name} {sec:.2f}s" for name, sec in parts[:5])
            print(
                f"  {human_bytes(m.size):>7} x{m.clients}: {median.server_cpu:.2f}s "
                f"(sys {median.server_sys:.2f}s) in {median.seconds:.2f}s wall: {text}; "
                f"clients {median.client_cpu_per_gib:.2f} CPU s/GiB"
            )
    print(
        common.load_line(
            load, "with other work on the machine the figures move by tens of percent."
        )
    )


# -- command line -----------------------------------------------------------------


def payload_sizes(text: str) -> tuple[int, ...]:
    """``"1,64"`` -> (1024, 65536): the payload sizes of ``--sizes``."""
    try:
        sizes = tuple(int(part) * KIB for part in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) <= 0:
        raise argparse.ArgumentTypeError(f"expected KiB counts like 1,64,1024, got {text!r}")
    return sizes


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = common.base_parser(__doc__.splitlines()[0], "128 MiB epochs, 512 MiB RSS epoch")
    parser.add_argument("--skip-rss", action="store_true", help="no RSS measurement")
    parser.add_argument("--skip-ttfb", action="store_true", help="no time-to-first-batch")
    parser.add_argument(
        "--sizes",
        type=payload_sizes,
        default=PAYLOAD_SIZES,
        metavar="KIB,...",
        help="payload sizes in KiB, comma-separated (default 1,64,1024)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        metavar="N",
        help="epochs per (size, clients, server), the median shown (default 5; 3 with --quick)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also time the verified read's CPU floor (builds a Rust example with cargo)",
    )
    parser.add_argument(
        "--raw-batch-mib",
        type=float,
        metavar="MIB",
        help="also run a raw server holding the payloads in batches of MIB MiB whatever "
        "their rows (an independent setup used 8), and the floor over it",
    )
    parser.add_argument("--raw-batch-bytes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--raw-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sampling-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--payload-size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.raw_server:
        return common.serve_raw(args.count, args.payload_size, args.raw_batch_bytes)
    if args.sampling_server:
        return common.serve_sampling(args.count, args.payload_size, args.workdir)
    scale = Scale.of(args.quick)
    if args.repeats is not None:
        scale = replace(scale, repeats=args.repeats)
    # SIGTERM unwinds like Ctrl-C, so that the `finally` below stops servers and clients.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.perf_counter()
    load_start = os.getloadavg()
    measurements: list[common.Measurement[ServerRun]] = []
    writes: dict[int, float] = {}
    floors: dict[int, float] = {}
    floor_program = build_read_floor() if args.floor else None
    big_batch_bytes = None if args.raw_batch_mib is None else int(args.raw_batch_mib * MIB)
    rss = None
    ttfb = None
    with common.scratch_dir(args.data_dir, "flight-") as workdir:
        pool = common.ClientPool(max(CLIENT_COUNTS))
        try:
            for size in args.sizes:
                found, writes[size], floor = measure_size(
                    size, scale, pool, workdir, floor_program, big_batch_bytes
                )
                measurements += found
                if floor is not None:
                    floors[size] = floor
            if not args.skip_rss:
                rss = measure_rss(scale, pool, workdir)
            if not args.skip_ttfb:
                ttfb = measure_ttfb(scale, workdir)
        finally:
            pool.close()
    elapsed = time.perf_counter() - started
    table = throughput_table(measurements, floors)
    print_report(scale, table, measurements, rss, elapsed, (load_start, os.getloadavg()))
    if ttfb is not None:
        print(f"\nTime to first batch, {ttfb.requests} requests per position, one client, 1 KiB:")
        print(render(["request", "p50", "p99"], _ttfb.report_rows(ttfb)))
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
            "ttfb_seconds": ttfb.seconds if ttfb is not None else None,
        }
        args.json.write_text(json.dumps(dump, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
