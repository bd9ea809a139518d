"""Flight replicas in containers: aggregate throughput, replica startup and failover.

Run from the project root::

    uv run --no-sync python benchmarks/bench_cluster.py            # full sizes (~1-3 minutes)
    uv run --no-sync python benchmarks/bench_cluster.py --quick    # 4x less data, smoke test
    uv run --no-sync python benchmarks/bench_cluster.py --json results.json

Three measurements, one run (issue 4, "Measure"):

1. Aggregate throughput of 1, 2 and 3 replicas of ``python -m flight_server``, each a
   container of ``dataset-rt-flight:e2e``, serving 4 ranks (4 client processes, rank r
   of world_size 4, each a ``flight_client.DatasetClient`` given every replica, so the
   ranks spread over the replicas) at 1 MiB and 16 KiB payloads, against one raw
   pyarrow Flight server on the host serving the same payloads from memory to the
   same 4 clients (``bench_flight.py --raw-server``).
2. Replica startup on a 1M-sample cache (1M x 16 B records): from ``docker run`` to
   the first successful ``health`` action.
3. Failover: one client streams a long epoch from replica A of two; ``docker kill A``;
   the time from the kill until the client's next batch (from replica B).

Containers bind 127.0.0.1 only, every wait is bounded, and containers and temporary
directories are removed at the end, on errors and on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _flight_common as common  # the benchmarks directory is not a package
from _flight_common import HOST, KIB, MIB, SEED, BenchError, human_bytes, human_count, render

IMAGE = os.environ.get("DATASET_RT_BENCH_IMAGE", "dataset-rt-flight:e2e")
BASE_IMAGE = "dataset-rt-base:local"
PAYLOAD_SIZES = (MIB, 16 * KIB)
REPLICA_COUNTS = (1, 2, 3)
RANKS = 4
STARTUP_RECORDS = 1_000_000
STARTUP_SIZE = 16
FAILOVER_EPOCH_LEN = 1_000_000  # samples: far longer than the stream is let run
FAILOVER_KILL_AFTER = 1.0  # seconds of streaming before the kill
FAILOVER_AFTER_BATCHES = 3  # batches read after the failover before stopping
HEALTH_TIMEOUT = 180.0
DOCKER_TIMEOUT = 120.0
LABEL = "dataset-rt-bench-cluster"


@dataclass(frozen=True)
class Scale(common.Scale):
    """Data volumes of one run; ``total_bytes`` is shared by the 4 ranks."""

    startup_repeats: int
    failover_repeats: int

    QUICK = (64 * MIB, 2, 1, 1)  # total_bytes, repeats, startup_repeats, failover_repeats
    FULL = (256 * MIB, 3, 3, 3)


log = common.make_log("bench_cluster")


def dataset_name(size: int) -> str:
    return f"bench{size}"


# -- caches written on the host -----------------------------------------------------


def write_host_cache(name: str, count: int, size: int, root: Path) -> tuple[str, float]:
    """Write a cache under ``root``; returns its path relative to ``root`` and seconds."""
    path, seconds = common.write_cache(name, count, size, root)
    return str(path.resolve().relative_to(root.resolve())), seconds


def make_world_readable(root: Path) -> None:
    root.chmod(0o755)
    for top, dirs, files in os.walk(root):
        for d in dirs:
            (Path(top) / d).chmod(0o755)
        for f in files:
            (Path(top) / f).chmod(0o644)


# -- containers -----------------------------------------------------------------------


def docker(*args: str, check: bool = True, timeout: float = DOCKER_TIMEOUT) -> str:
    done = subprocess.run(
        ["docker", *args], capture_output=True, text=True, check=False, timeout=timeout
    )
    if check and done.returncode != 0:
        raise BenchError(f"docker {' '.join(args[:2])} failed: {done.stderr.strip()[-1000:]}")
    return done.stdout.strip()


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class Containers:
    """Every container this run started, removed by `remove_all` (also on SIGTERM)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.names: list[str] = []
        self._count = 0

    def run(
        self,
        port: int,
        cache_root: Path,
        state_dir: Path,
        datasets: dict[str, str],
        advertise: Sequence[str],
    ) -> tuple[str, float]:
        """``docker run -d``; returns the name and the monotonic time just before it."""
        self._count += 1
        name = f"bench-cluster-{self.run_id}-{self._count}"
        self.names.append(name)
        command = ["run", "-d", "--rm", "--name", name, "--label", LABEL]
        command += ["-p", f"{HOST}:{port}:8815"]
        command += ["-v", f"{cache_root}:/caches:ro", "-v", f"{state_dir}:/state", IMAGE]
        for dataset, relative in datasets.items():
            command += ["--dataset", f"{dataset}=/caches/{relative}"]
        command += ["--state-dir", "/state", "--log-level", "WARNING"]
        for uri in advertise:
            command += ["--advertise", uri]
        started = time.monotonic()
        docker(*command)
        return name, started

    def logs(self, name: str) -> str:
        return docker("logs", "--tail", "30", name, check=False, timeout=30)

    def remove(self, names: Sequence[str]) -> None:
        if names:
            docker("rm", "-f", *names, check=False, timeout=60)
        for name in names:
            with contextlib.suppress(ValueError):
                self.names.remove(name)

    def remove_all(self) -> None:
        self.remove(list(self.names))


def wait_healthy(location: str, name: str, containers: Containers) -> float:
    """Poll the ``health`` action until it answers ok; returns the monotonic time."""
    import pyarrow.flight as flight

    deadline = time.monotonic() + HEALTH_TIMEOUT
    options = flight.FlightCallOptions(timeout=2.0)
    last = ""
    checked = time.monotonic()
    while time.monotonic() < deadline:
        try:
            with flight.connect(location) as client:
                [answer] = list(client.do_action(flight.Action("health", b""), options=options))
            if json.loads(answer.body.to_pybytes()).get("status") == "ok":
                return time.monotonic()
        except Exception as error:  # not up yet: connection refused, unavailable, ...
            last = f"{type(error).__name__}: {str(error)[:200]}"
        if time.monotonic() - checked > 5.0:
            checked = time.monotonic()
            state = docker("inspect", "-f", "{{.State.Running}}", name, check=False, timeout=30)
            if state != "true":
                raise BenchError(f"container {name} is not running:\n{containers.logs(name)}")
        time.sleep(0.02)
    raise BenchError(
        f"{name} not healthy within {HEALTH_TIMEOUT:.0f} s ({last}):\n{containers.logs(name)}"
    )


@dataclass
class Replicas:
    names: list[str]
    locations: list[str]
    startup: list[float]  # seconds from docker run to the first health answer


def start_replicas(
    count: int,
    containers: Containers,
    cache_root: Path,
    workdir: Path,
    datasets: dict[str, str],
) -> Replicas:
    """``count`` replicas sharing one state directory, each advertising all of them."""
    state = Path(tempfile.mkdtemp(prefix="state-", dir=workdir))
    state.chmod(0o777)  # the container runs as uid 10001
    ports = free_ports(count)
    locations = [f"grpc://{HOST}:{port}" for port in ports]
    started = [containers.run(port, cache_root, state, datasets, locations) for port in ports]
    startup = []
    for (name, t0), location in zip(started, locations, strict=True):
        startup.append(wait_healthy(location, name, containers) - t0)
    return Replicas([name for name, _ in started], locations, startup)


# -- measurements ---------------------------------------------------------------------


def replica_epoch(
    pool: common.ClientPool, kind: str, locations: Sequence[str], size: int, count: int
) -> common.Run:
    """One epoch of RANKS ranks at once: ``kind`` "ours" streams each rank with a
    DatasetClient given every replica, "raw" asks the raw server at ``locations[0]``."""
    if kind == "ours":
        dataset = dataset_name(size)
        jobs: list[common.TicketJob | common.EpochJob] = [
            common.EpochJob(tuple(locations), dataset, rank, RANKS) for rank in range(RANKS)
        ]
    else:
        jobs = [
            common.TicketJob(locations[0], ticket, reuse=False)
            for ticket in common.raw_tickets(RANKS)
        ]
    run, _ = common.timed_epoch(pool, jobs, (count, count * size), kind)
    return run


def measure_throughput(
    scale: Scale,
    pool: common.ClientPool,
    containers: Containers,
    cache_root: Path,
    caches: dict[int, str],
    workdir: Path,
) -> tuple[list[common.Measurement[common.Run]], dict[int, list[float]]]:
    counts = {size: scale.total_bytes // size for size in PAYLOAD_SIZES}
    raw_servers: dict[int, common.ServerProcess] = {}
    measurements: dict[tuple[str, int], common.Measurement[common.Run]] = {}
    startups: dict[int, list[float]] = {}
    try:
        for size in PAYLOAD_SIZES:
            raw_servers[size] = common.start_raw(counts[size], size, workdir)
            raw_servers[size].wait_location()
        datasets = {dataset_name(size): caches[size] for size in PAYLOAD_SIZES}
        for replicas in REPLICA_COUNTS:
            label = f"{replicas} replica" + ("s" if replicas > 1 else "")
            group = start_replicas(replicas, containers, cache_root, workdir, datasets)
            startups[replicas] = group.startup
            log(f"{label} up: " + ", ".join(f"{s:.1f} s" for s in group.startup))
            try:
                for size in PAYLOAD_SIZES:
                    ours = measurements.setdefault(
                        (label, size), common.Measurement(label, size, RANKS)
                    )
                    raw = measurements.setdefault(
                        ("raw", size), common.Measurement("raw", size, RANKS)
                    )
                    for repeat in range(scale.repeats):
                        order = [("ours", group.locations), ("raw", [raw_servers[size].location])]
                        for kind, locations in order if repeat % 2 == 0 else order[::-1]:
                            run = replica_epoch(pool, kind, locations, size, counts[size])
                            (ours if kind == "ours" else raw).runs.append(run)
                            log(
                                f"  {human_bytes(size):>7} {label if kind == 'ours' else 'raw':10}"
                                f" {run.mib_s:8,.0f} MiB/s ({run.seconds:.2f} s)"
                            )
            finally:
                containers.remove(group.names)
    finally:
        for server in raw_servers.values():
            server.stop()
    return list(measurements.values()), startups


def measure_startup(
    scale: Scale, containers: Containers, cache_root: Path, relative: str, workdir: Path
) -> list[float]:
    out = []
    for _ in range(scale.startup_repeats):
        group = start_replicas(1, containers, cache_root, workdir, {"big": relative})
        try:
            out += group.startup
            log(f"startup on {STARTUP_RECORDS} samples: {group.startup[0]:.2f} s")
        finally:
            containers.remove(group.names)
    return out


@dataclass
class Failover:
    batches_before: int
    kill_seconds: float  # how long `docker kill` took to return
    to_error: float  # kill -> the client saw the broken stream (failovers entry)
    to_next_batch: float  # kill -> the first batch after the failover
    error: str


def measure_failover(
    scale: Scale, containers: Containers, cache_root: Path, caches: dict[int, str], workdir: Path
) -> list[Failover]:
    from flight_client import DatasetClient

    out = []
    datasets = {dataset_name(MIB): caches[MIB]}
    for trial in range(scale.failover_repeats):
        group = start_replicas(2, containers, cache_root, workdir, datasets)
        try:
            client = DatasetClient(group.locations)
            stream = client.epoch(
                dataset_name(MIB), SEED, trial, epoch_len=FAILOVER_EPOCH_LEN, batches=True
            )
            # Rank 0 of world 1 starts at the first advertised location: kill that one.
            victim = group.names[0]
            times: list[float] = []
            killed: dict[str, float] = {}
            deadline = time.monotonic() + common.STREAM_TIMEOUT
            for _batch in stream:
                now = time.monotonic()
                times.append(now)
                if not killed and len(times) > 1 and now - times[0] >= FAILOVER_KILL_AFTER:
                    killed["before"] = time.monotonic()
                    docker("kill", victim)
                    killed["after"] = time.monotonic()
                if client.failovers:
                    after = [t for t in times if t > client.failovers[0][0]]
                    if len(after) >= FAILOVER_AFTER_BATCHES:
                        break
                if now > deadline:
                    raise BenchError("failover: the stream did not fail over in time")
            with contextlib.suppress(Exception):
                stream.close()  # type: ignore[attr-defined]
            client.close()
            if not killed or not client.failovers:
                raise BenchError(f"failover: killed={bool(killed)}, failovers={client.failovers}")
            failed_at, _location, error = client.failovers[0]
            next_batch = min(t for t in times if t > failed_at)
            before = sum(1 for t in times if t < killed["before"])
            result = Failover(
                before,
                killed["after"] - killed["before"],
                failed_at - killed["before"],
                next_batch - killed["before"],
                error,
            )
            log(
                f"failover {trial + 1}: next batch {result.to_next_batch * 1000:.0f} ms after the "
                f"kill (error seen after {result.to_error * 1000:.0f} ms: {error})"
            )
            out.append(result)
        finally:
            containers.remove(group.names)
    return out


# -- report ---------------------------------------------------------------------------


def throughput_table(
    measurements: Sequence[common.Measurement[common.Run]],
) -> list[dict[str, Any]]:
    by_key = {(m.server, m.size): m for m in measurements}
    table = []
    for size in PAYLOAD_SIZES:
        raw = by_key.get(("raw", size))
        one = by_key.get(("1 replica", size))
        for m in [by_key.get((s, size)) for s in ("1 replica", "2 replicas", "3 replicas")]:
            if m is None or not m.runs:
                continue
            best = m.best
            table.append(
                {
                    "size": size,
                    "server": m.server,
                    "mib_s": best.mib_s,
                    "samples_s": best.samples_s,
                    "vs_raw": best.mib_s / raw.best.mib_s if raw and raw.runs else None,
                    "vs_1_replica": best.mib_s / one.best.mib_s if one and one.runs else None,
                }
            )
        if raw is not None and raw.runs:
            table.append(
                {
                    "size": size,
                    "server": "raw",
                    "mib_s": raw.best.mib_s,
                    "samples_s": raw.best.samples_s,
                    "vs_raw": 1.0,
                    "vs_1_replica": raw.best.mib_s / one.best.mib_s if one and one.runs else None,
                }
            )
    return table


def stats(values: Sequence[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    median = ordered[len(ordered) // 2]
    if len(values) == 1:
        return f"{median:.2f} s"
    return f"{median:.2f} s (min {ordered[0]:.2f}, max {ordered[-1]:.2f}, n={len(values)})"


def print_report(
    scale: Scale,
    table: Sequence[dict[str, Any]],
    startup_big: Sequence[float],
    startup_small: dict[int, list[float]],
    failovers: Sequence[Failover],
    elapsed: float,
    load: tuple[tuple[float, ...], tuple[float, ...]],
) -> None:
    print(f"\nFlight replicas in containers ({scale.name} sizes, {elapsed:.0f} s)\n")
    lines = []
    for row in table:
        server = "raw pyarrow, 1 server" if row["server"] == "raw" else row["server"]
        lines.append(
            [
                f"{human_bytes(row['size'])} payloads, {server}, {RANKS} ranks",
                f"{row['mib_s']:,.0f}",
                human_count(row["samples_s"]),
                f"{row['vs_raw']:.2f}x" if row["vs_raw"] is not None else "",
                f"{row['vs_1_replica']:.2f}x" if row["vs_1_replica"] is not None else "",
            ]
        )
    print(render(["aggregate throughput", "MiB/s", "samples/s", "vs raw", "vs 1 replica"], lines))
    print()
    small = [s for values in startup_small.values() for s in values]
    to_next = [f.to_next_batch for f in failovers]
    to_error = [f.to_error for f in failovers]
    other = [
        [
            f"replica startup, {human_count(STARTUP_RECORDS)} x {STARTUP_SIZE} B cache",
            stats(startup_big),
        ],
        [
            f"replica startup, throughput caches ({len(PAYLOAD_SIZES)} datasets)",
            stats(small),
        ],
        ["failover: kill -> next batch", stats(to_next)],
        ["failover: kill -> client sees the broken stream", stats(to_error)],
    ]
    print(render(["", "time"], other))
    print()
    print(
        f"Throughput: payload bytes of one epoch ({human_bytes(scale.total_bytes)}) streamed by "
        f"{RANKS} client processes (rank r of world_size {RANKS}) at once, over the span from "
        f"the first rank's start to the last rank's end; best of {scale.repeats} (raw: best of "
        f"{scale.repeats * len(REPLICA_COUNTS)}, interleaved with every replica count). Ours: "
        f"DatasetClient(replica locations).epoch(seed {SEED}, epoch 0, shuffle, batches=True); "
        f"rank r starts at replica r mod n (3 replicas: 2/1/1 ranks). Replicas are containers "
        f"of {IMAGE} (2 worker threads each) on one shared state directory. Raw: "
        "bench_flight.py --raw-server on the host, same payloads from memory."
    )
    print(
        "Startup: docker run -d to the first ok answer of the health action (polled every "
        "20 ms). Failover: 2 replicas, one client streams a 1 MiB-payload epoch of "
        f"{FAILOVER_EPOCH_LEN} samples from replica 1, `docker kill` after "
        f"{FAILOVER_KILL_AFTER:g} s; times from just before `docker kill`; the client's retry "
        "backoff (0.1 s on the first retry) is included."
    )
    for i, f in enumerate(failovers):
        print(
            f"  failover {i + 1}: {f.batches_before} batches before the kill, docker kill took "
            f"{f.kill_seconds * 1000:.0f} ms, error {f.error} after {f.to_error * 1000:.0f} ms, "
            f"next batch after {f.to_next_batch * 1000:.0f} ms"
        )
    caveat = (
        "containers, clients and the raw server share these CPUs, and other work on the "
        "machine moves the figures by tens of percent."
    )
    print(common.load_line(load, caveat))


# -- command line ---------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = common.base_parser(__doc__.splitlines()[0], "64 MiB epochs, fewer repeats")
    return parser.parse_args(argv)


def ensure_image() -> None:
    done = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, check=False)
    if done.returncode != 0:
        log(f"building {IMAGE} (docker/build-image.sh)")
        subprocess.run(
            ["bash", "docker/build-image.sh", IMAGE, BASE_IMAGE],
            cwd=common.PROJECT_ROOT,
            check=True,
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    scale = Scale.of(args.quick)
    # SIGTERM unwinds like Ctrl-C, so that the `finally` below removes containers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.perf_counter()
    load_start = os.getloadavg()
    ensure_image()
    containers = Containers(uuid.uuid4().hex[:8])
    pool: common.ClientPool | None = None
    writes: dict[str, float] = {}
    with common.scratch_dir(args.data_dir, "cluster-") as workdir:
        try:
            cache_root = workdir / "caches"
            cache_root.mkdir()
            caches: dict[int, str] = {}
            for size in PAYLOAD_SIZES:
                count = scale.total_bytes // size
                log(f"writing {count} x {human_bytes(size)}")
                caches[size], writes[str(size)] = write_host_cache(
                    dataset_name(size), count, size, cache_root
                )
            log(f"writing {STARTUP_RECORDS} x {STARTUP_SIZE} B")
            big, writes["startup"] = write_host_cache(
                "big", STARTUP_RECORDS, STARTUP_SIZE, cache_root
            )
            make_world_readable(cache_root)
            pool = common.ClientPool(RANKS)
            measurements, startup_small = measure_throughput(
                scale, pool, containers, cache_root, caches, workdir
            )
            pool.close()
            pool = None
            startup_big = measure_startup(scale, containers, cache_root, big, workdir)
            failovers = measure_failover(scale, containers, cache_root, caches, workdir)
        finally:
            containers.remove_all()
            if pool is not None:
                pool.close()
    elapsed = time.perf_counter() - started
    load_end = os.getloadavg()
    table = throughput_table(measurements)
    print_report(
        scale, table, startup_big, startup_small, failovers, elapsed, (load_start, load_end)
    )
    if args.json:
        dump = {
            "scale": asdict(scale),
            "image": IMAGE,
            "elapsed_seconds": elapsed,
            "load_average": {"start": load_start, "end": load_end},
            "cpus": os.cpu_count(),
            "cache_write_seconds": writes,
            "table": table,
            "measurements": [
                {"server": m.server, "size": m.size, "runs": [asdict(r) for r in m.runs]}
                for m in measurements
            ],
            "startup_seconds": {"1m_samples": startup_big, "throughput_caches": startup_small},
            "failovers": [asdict(f) for f in failovers],
        }
        args.json.write_text(json.dumps(dump, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
