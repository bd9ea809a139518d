"""Serving from object storage (issue 24): cold and warm epochs of a replica that has
only the bucket, against the same server over the local cache directory; the
object store's requests per GiB served; the time for an activation to reach
another replica.

Run from the project root (needs Ceph from Debian's packages, as .ci/run installs)::

    uv run --no-sync python benchmarks/bench_object_store.py            # 256 MiB of 64 KiB records
    uv run --no-sync python benchmarks/bench_object_store.py --quick    # 64 MiB

One run, on one machine: a one-node Ceph radosgw (memstore OSD, loopback) started
for the run (tests/ceph_s3.py), the cache uploaded with ``python -m dataset_rt
upload``, then three ``python -m flight_server`` processes: ``local`` (the cache
directory, a local state dir), and replicas ``a`` and ``b`` (``--dataset
bench=s3://...``, ``--state-dir s3://...``, each an empty mirror of its own). Each
epoch is one plain ``pyarrow.flight`` ``do_get`` of the whole shuffled epoch
(``shuffle: true``, as many draws as records). The store's requests are radosgw's
own counters (``perf dump``). Loopback radosgw on the same 2 cores is far faster
than a remote store: the cold figure is a ceiling for real networks.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent / "tests"))

import _flight_common as common  # noqa: E402  (the benchmarks directory is not a package)
from ceph_s3 import CephS3  # noqa: E402

DATASET = "bench"
ACTIVATIONS = 5
MIB = 1 << 20


def rgw_requests(ceph: CephS3) -> int:
    """Requests radosgw has answered (its ``rgw.req`` counter)."""
    out = subprocess.run(
        ["ceph", "-c", str(ceph.root / "ceph.conf"), "daemon", "client.rgw", "perf", "dump"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    return int(json.loads(out)["rgw"]["req"])


def epoch(location: str, number: int, epoch_len: int) -> tuple[float, int]:
    """Seconds and payload bytes of one shuffled epoch read with plain pyarrow.flight."""
    import pyarrow.flight as flight

    command = {"dataset": DATASET, "seed": 1, "epoch": number, "shuffle": True}
    with flight.connect(location) as client:
        info = client.get_flight_info(flight.FlightDescriptor.for_command(json.dumps(command)))
        started = time.perf_counter()
        reader = client.do_get(info.endpoints[0].ticket)
        rows = nbytes = 0
        for chunk in reader:
            rows += chunk.data.num_rows
            nbytes += chunk.data.column("payload").nbytes
        seconds = time.perf_counter() - started
    if rows != epoch_len:
        raise common.BenchError(f"{location}: epoch {number} had {rows} rows, not {epoch_len}")
    return seconds, nbytes


def start(name: str, args: list[str], workdir: Path) -> Any:
    command = [sys.executable, "-m", "flight_server", "--port", "0", "--log-level", "WARNING"]
    server = common.ServerProcess.start(name, [*command, *args], workdir)
    server.wait_location()
    return server


def activation_reach(a: str, b: str) -> list[float]:
    """Seconds from an acknowledged activation through ``a`` until ``b`` serves it."""
    import polars as pl

    from flight_client import DatasetClient

    times = []
    with DatasetClient(a) as ca, DatasetClient(b) as cb:
        table = ca.get_metadata(DATASET)
        for i in range(ACTIVATIONS):
            weight = 2.0 + i
            ca.update_metadata(DATASET, table.with_columns(pl.lit(weight).alias("weight")))
            acknowledged = time.perf_counter()
            deadline = acknowledged + 30
            while cb.get_metadata(DATASET)["weight"][0] != weight:
                if time.perf_counter() > deadline:
                    raise common.BenchError("replica b never served the activation")
                time.sleep(0.01)
            times.append(time.perf_counter() - acknowledged)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="64 MiB instead of 256 MiB")
    parser.add_argument("--record-kib", type=int, default=64, help="payload size (KiB)")
    args = parser.parse_args(argv)
    total = (64 if args.quick else 256) * MIB
    size = args.record_kib * 1024
    count = total // size
    with tempfile.TemporaryDirectory(prefix="bench-object-store-") as tmp:
        root = Path(tmp)
        with CephS3(root / "ceph") as ceph:
            import os

            os.environ.update(ceph.environment())
            ceph.create_bucket("bench")
            cache, write_s = common.write_cache(DATASET, count, size, root / "caches")
            import dataset_rt as drt

            started = time.perf_counter()
            report = drt._native.upload_cache(str(cache), "s3://bench/caches")
            upload_s = time.perf_counter() - started
            servers = []
            try:
                local = start(
                    "local", ["--dataset", f"{DATASET}={cache}", "--data-dir", str(root / "l")],
                    root,
                )  # fmt: skip
                servers.append(local)
                remote = [
                    start(
                        name,
                        [
                            "--dataset",
                            f"{DATASET}={report.url}",
                            "--data-dir",
                            str(root / name),
                            "--state-dir",
                            "s3://bench/state",
                        ],
                        root,
                    )
                    for name in ("a", "b")
                ]
                servers += remote
                a = remote[0].location
                before = rgw_requests(ceph)
                cold_s, nbytes = epoch(a, 0, count)
                cold_requests = rgw_requests(ceph) - before
                before = rgw_requests(ceph)
                warm = [epoch(a, n, count)[0] for n in (1, 2, 3)]
                warm_requests = rgw_requests(ceph) - before
                local_runs = [epoch(local.location, n, count)[0] for n in (0, 1, 2, 3)]
                reach = activation_reach(a, remote[1].location)
            finally:
                for server in servers:
                    server.stop()
    gib = nbytes / (1 << 30)
    rate = lambda s: nbytes / MIB / s  # noqa: E731
    local_rate = rate(statistics.median(local_runs[1:]))
    warm_rate = rate(statistics.median(warm))
    print(f"cache: {count} x {args.record_kib} KiB = {total / MIB:.0f} MiB "
          f"(written in {write_s:.1f} s, uploaded in {upload_s:.1f} s: "
          f"{report.bytes / MIB / upload_s:.0f} MiB/s)")  # fmt: skip
    print(
        common.render(
            ["server", "epoch", "MiB/s", "vs local", "store requests / GiB"],
            [
                ["local dir", "warm (median of 3)", f"{local_rate:.0f}", "1.00x", "-"],
                [
                    "replica a",
                    "0 (cold mirror)",
                    f"{rate(cold_s):.0f}",
                    f"{rate(cold_s) / local_rate:.2f}x",
                    f"{cold_requests / gib:.0f}",
                ],
                [
                    "replica a",
                    "1-3 (warm, median)",
                    f"{warm_rate:.0f}",
                    f"{warm_rate / local_rate:.2f}x",
                    f"{warm_requests / (3 * gib):.1f}",
                ],
            ],
        )
    )
    print(
        f"activation through a served by b after: median {statistics.median(reach):.2f} s, "
        f"max {max(reach):.2f} s ({ACTIVATIONS} activations; b polls the log once a second)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
