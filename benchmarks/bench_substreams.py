"""One rank read as K sub-streams (``DatasetClient.epoch(streams=K)``) from three
replicas on loopback, K = 1, 2, 4 (issue 49, deliverable 5).

Run from the project root::

    uv run --no-sync python benchmarks/bench_substreams.py            # 8000 x 64 KiB
    uv run --no-sync python benchmarks/bench_substreams.py --quick    # 2000 x 64 KiB

Three ``python -m flight_server`` processes serve one local cache, each advertising
all three; one client reads one rank's shuffled epoch with ``batches=True`` and
``streams=K``, the K values alternated, ``--reps`` times (median, min-max). On one
2-core machine the servers, the client and the merge share the cores, so this
measures what K costs and whether the merge keeps up, not the network gain K
brings where one flow is the limit (AWS caps a flow at 5 Gbps).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import _flight_common as common  # noqa: E402  (the benchmarks directory is not a package)

DATASET = "bench"
MIB = 1 << 20
REPLICAS = 3


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def epoch(locations: list[str], streams: int, number: int, count: int) -> tuple[float, int]:
    """Seconds and payload bytes of one rank's epoch read with ``streams`` sub-streams."""
    from flight_client import DatasetClient

    with DatasetClient(locations) as client:
        started = time.perf_counter()
        rows = nbytes = 0
        for batch in client.epoch(DATASET, 1, number, batches=True, streams=streams):
            rows += batch.num_rows
            nbytes += batch.column("payload").nbytes
        seconds = time.perf_counter() - started
    if rows != count:
        raise common.BenchError(f"streams={streams}: {rows} rows, not {count}")
    return seconds, nbytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2000 records instead of 8000")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per K")
    parser.add_argument("--record-kib", type=int, default=64, help="payload size (KiB)")
    args = parser.parse_args(argv)
    count = 2000 if args.quick else 8000
    size = args.record_kib * 1024
    ks = (1, 2, 4)
    seconds: dict[int, list[float]] = {k: [] for k in ks}
    with tempfile.TemporaryDirectory(prefix="bench-substreams-") as tmp:
        root = Path(tmp)
        cache, _ = common.write_cache(DATASET, count, size, root / "caches")
        ports = [free_port() for _ in range(REPLICAS)]
        servers = []
        try:
            for i in range(REPLICAS):
                command = [
                    sys.executable, "-m", "flight_server", "--port", str(ports[i]),
                    "--log-level", "WARNING", "--dataset", f"{DATASET}={cache}",
                    "--state-dir", str(root / "state"), "--data-dir", str(root / f"data-{i}"),
                ]  # fmt: skip
                for port in ports:
                    command += ["--advertise", f"grpc://127.0.0.1:{port}"]
                server = common.ServerProcess.start(f"replica-{i}", command, root)
                server.wait_location()
                servers.append(server)
            locations = [s.location for s in servers]
            epoch(locations, 1, 0, count)  # warm the page cache and the servers
            nbytes = 0
            for rep in range(args.reps):
                for k in ks if rep % 2 == 0 else reversed(ks):
                    taken, nbytes = epoch(locations, k, 1 + rep, count)
                    seconds[k].append(taken)
        finally:
            for server in servers:
                server.stop()
    base = statistics.median(seconds[1])
    rows = []
    for k in ks:
        rates = [nbytes / MIB / s for s in seconds[k]]
        rows.append(
            [
                str(k),
                f"{statistics.median(rates):.0f} ({min(rates):.0f}-{max(rates):.0f})",
                f"{base / statistics.median(seconds[k]):.2f}x",
            ]
        )
    print(f"one rank, {count} x {args.record_kib} KiB shuffled, {REPLICAS} replicas, "
          f"median of {args.reps}")  # fmt: skip
    print(common.render(["streams K", "MiB/s (min-max)", "vs K=1"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
