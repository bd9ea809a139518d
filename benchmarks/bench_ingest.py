"""Columnar ingest (`DatasetRuntime.write_arrow`) against the iterable path (`write_cache`).

Run from the project root::

    uv run python benchmarks/bench_ingest.py             # 10^7 records of 8 bytes (~1 min)
    uv run python benchmarks/bench_ingest.py --records 1000000
    uv run python benchmarks/bench_ingest.py --json results.json
    uv run python benchmarks/bench_ingest.py --memory 1000000 100000000

The workload is the issue's: records of 8 bytes with one integer column, written
as `CacheInput`s from a Python generator (the baseline) and as a pyarrow Table and
a Parquet file of the same rows (columnar), in the same run; then 1 MiB records,
where both paths should be bound by the disk. Each write is checked to give the
same ``cache_id``. Throughputs are records/s (and MB/s of payload); the ratio is
columnar / iterable.

``--memory ROWS...`` is the bounded-import mode instead (issue 47): for each row
count, a Parquet file of that many 8-byte records (written in row groups, never
held whole) is imported by ``python -m dataset_rt import`` (`dataset_rt.cli.main`,
its summary line included) in a fresh subprocess, which reports its peak RSS
(``VmHWM`` of /proc/self/status), its peak anonymous memory (``RssAnon``, sampled
every 20 ms: ``VmHWM`` also counts mapped file pages), its mapped file pages at the
end (``RssFile``) and records/s; then the ratio of each count's peaks to the first
count's. It needs about 100 bytes of disk a row (the Parquet file and the cache),
and checks for them first. With
``--baseline DIR`` (a directory holding another build's ``dataset_rt`` package,
its extension built: a checkout of the previous commit), each file is imported by
that build first, in the same run, and the two must give the same ``cache_id``::

    uv run python benchmarks/bench_ingest.py --memory 1000000 100000000 --baseline ../old
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import dataset_rt as drt
from dataset_rt import _native

CONFIG = drt.WriterConfig(show_progress=False)


class _Records:
    """The rows as `CacheInput`s: ``size``-byte slices of one buffer, label = index."""

    name = "ingest"

    def __init__(self, data: bytes, size: int) -> None:
        self.data, self.size = data, size

    def __len__(self) -> int:
        return len(self.data) // self.size

    def __iter__(self) -> Iterator[drt.CacheInput]:
        data, size = self.data, self.size
        for i in range(len(self)):
            yield drt.CacheInput(data=data[i * size : (i + 1) * size], metadata={"label": i})


def _table(data: bytes, size: int) -> pa.Table:
    n = len(data) // size
    offsets = np.arange(0, (n + 1) * size, size, dtype=np.int64)
    payload = pa.Array.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    return pa.table({"data": payload, "label": pa.array(np.arange(n, dtype=np.int64))})


def _timed(write: Callable[[Path], Path], base: Path) -> tuple[float, str]:
    shutil.rmtree(base, ignore_errors=True)
    start = time.perf_counter()
    path = write(base)
    seconds = time.perf_counter() - start
    cache_id = str(_native.inspect_cache(str(path)).cache_id)
    shutil.rmtree(base, ignore_errors=True)
    return seconds, cache_id


def _workload(
    runtime: drt.DatasetRuntime, scratch: Path, records: int, size: int
) -> list[dict[str, Any]]:
    data = np.random.default_rng(0).integers(0, 256, records * size, dtype=np.uint8).tobytes()
    table = _table(data, size)
    parquet = scratch / "ingest.parquet"
    pq.write_table(table, parquet, compression="none")

    def iterable(base: Path) -> Path:
        [result] = runtime.write_cache(_Records(data, size), base, writer_config=CONFIG)
        assert isinstance(result, drt.CacheWriteSuccess), result
        return result.path

    def columnar(source: object) -> Callable[[Path], Path]:
        def write(base: Path) -> Path:
            result = runtime.write_arrow(
                source, base, name="ingest", payload_column="data", writer_config=CONFIG
            )
            assert isinstance(result, drt.CacheWriteSuccess), result
            return result.path

        return write

    rows = []
    runs = [("iterable", iterable), ("table", columnar(table)), ("parquet", columnar(parquet))]
    baseline = None
    ids = set()
    for label, write in runs:
        seconds, cache_id = _timed(write, scratch / label)
        ids.add(cache_id)
        rate = records / seconds
        baseline = baseline or rate
        rows.append(
            {
                "records": records,
                "record_bytes": size,
                "path": label,
                "seconds": seconds,
                "records_per_s": rate,
                "mb_per_s": records * size / seconds / 1e6,
                "ratio": rate / baseline,
            }
        )
    assert len(ids) == 1, f"the paths wrote different caches: {ids}"
    return rows


# -- bounded import (--memory) -------------------------------------------------------

#: Disk a row of the memory mode needs: the Parquet file (~20 B) and the cache
#: (payload 8, index entry 40, metadata 16), with room to spare.
_DISK_PER_ROW = 100
_ROW_GROUP = 1 << 20


def _status() -> dict[str, int]:
    """The memory lines of /proc/self/status, in bytes."""
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                fields[key] = int(value.split()[0]) * 1024
    return fields


def _write_parquet(path: Path, rows: int) -> None:
    """``rows`` records of 8 random bytes and an int64 ``label``, one row group at a time."""
    schema = pa.schema([("data", pa.binary()), ("label", pa.int64())])
    with pq.ParquetWriter(path, schema, compression="none", use_dictionary=False) as writer:
        for start in range(0, rows, _ROW_GROUP):
            n = min(_ROW_GROUP, rows - start)
            data = np.random.default_rng(start).integers(0, 256, n * 8, dtype=np.uint8)
            offsets = np.arange(0, (n + 1) * 8, 8, dtype=np.int32)
            payload = pa.Array.from_buffers(
                pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data.tobytes())]
            )
            labels = pa.array(np.arange(start, start + n, dtype=np.int64))
            writer.write_table(pa.table([payload, labels], schema=schema))


def _memory_child(parquet: Path, base: Path, workers: int) -> None:
    """Run ``python -m dataset_rt import`` of ``parquet`` in this (fresh) process, as a
    user would (its "ok:" line included); print what it cost."""
    from dataset_rt import cli

    before = _status()
    peak_anon = [before["RssAnon"]]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak_anon[0] = max(peak_anon[0], _status()["RssAnon"])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    code = cli.main(
        ["import", str(parquet), "--payload-column", "data", "--name", "ingest",
         "--base-dir", str(base), "--num-workers", str(workers)]
    )  # fmt: skip
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    after = _status()
    assert code == 0, code
    manifest = json.loads((base / "ingest" / "manifest.json").read_text())["manifest"]
    report = {
        "records": manifest["record_count"],
        "seconds": seconds,
        "records_per_s": manifest["record_count"] / seconds,
        "start_rss": before["VmRSS"],
        "peak_rss": after["VmHWM"],
        "peak_anon": max(peak_anon[0], after["RssAnon"]),
        "end_anon": after["RssAnon"],
        "end_file": after["RssFile"],
        "cache_id": str(manifest["cache_id"]),
        "package": str(Path(drt.__file__).parent),
    }
    print(json.dumps(report))


def _memory(
    rows_list: list[int], scratch: Path, workers: int, baseline: Path | None
) -> list[dict[str, Any]]:
    builds: list[tuple[str, Path | None]] = [("this", None)]
    if baseline is not None:
        builds.insert(0, ("baseline", baseline))
    results = []
    for rows in rows_list:
        free = shutil.disk_usage(scratch).free
        if free < rows * _DISK_PER_ROW:
            raise SystemExit(
                f"{rows} rows need about {rows * _DISK_PER_ROW / 1e9:.1f} GB of disk under "
                f"{scratch}; {free / 1e9:.1f} GB are free (give --scratch elsewhere)"
            )
        parquet = scratch / f"memory-{rows}.parquet"
        base = scratch / f"memory-{rows}"
        try:
            _write_parquet(parquet, rows)
            ids = set()
            for build, path in builds:
                env = dict(os.environ)
                if path is not None:
                    env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
                command = [sys.executable, __file__, "--memory-child", str(parquet), str(base)]
                child = subprocess.run(
                    [*command, "--num-workers", str(workers)],
                    check=True,
                    stdout=subprocess.PIPE,
                    text=True,
                    env=env,
                )
                shutil.rmtree(base, ignore_errors=True)
                results.append(
                    {"build": build, **json.loads(child.stdout.strip().splitlines()[-1])}
                )
                ids.add(results[-1]["cache_id"])
            assert len(ids) == 1, f"the builds wrote different caches: {ids}"
        finally:
            parquet.unlink(missing_ok=True)
            shutil.rmtree(base, ignore_errors=True)
    for build, _ in builds:
        rows = [row for row in results if row["build"] == build]
        for row in rows:
            row["peak_rss_ratio"] = row["peak_rss"] / rows[0]["peak_rss"]
            row["peak_anon_ratio"] = row["peak_anon"] / rows[0]["peak_anon"]
    return results


def _print_memory(rows: list[dict[str, Any]]) -> None:
    mb = 1 << 20
    print(f"{'build':>8} {'records':>11} {'seconds':>8} {'records/s':>12} {'start':>7} "
          f"{'peak RSS':>9} {'ratio':>6} {'peak anon':>10} {'ratio':>6} {'end file':>9}"
          "  (MiB)")  # fmt: skip
    for row in rows:
        print(
            f"{row['build']:>8} {row['records']:>11} {row['seconds']:>8.2f} "
            f"{row['records_per_s']:>12,.0f} "
            f"{row['start_rss'] / mb:>7.0f} {row['peak_rss'] / mb:>9.0f} "
            f"{row['peak_rss_ratio']:>5.2f}x {row['peak_anon'] / mb:>10.0f} "
            f"{row['peak_anon_ratio']:>5.2f}x {row['end_file'] / mb:>9.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000_000, help="small records")
    parser.add_argument("--large-records", type=int, default=2000, help="1 MiB records")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--scratch", type=Path, default=None, help="where caches are written")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--memory",
        type=int,
        nargs="+",
        metavar="ROWS",
        help="the bounded-import mode: peak memory of a Parquet import of each row count",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="with --memory: a directory holding another build's dataset_rt, run first",
    )
    parser.add_argument("--memory-child", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        _memory_child(*args.memory_child, args.num_workers)
        return
    if args.memory:
        scratch = Path(tempfile.mkdtemp(prefix="bench_ingest_", dir=args.scratch))
        try:
            rows = _memory(args.memory, scratch, args.num_workers, args.baseline)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        _print_memory(rows)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2) + "\n")
        return
    runtime = drt.DatasetRuntime(num_workers=args.num_workers)
    scratch = Path(tempfile.mkdtemp(prefix="bench_ingest_", dir=args.scratch))
    try:
        rows = _workload(runtime, scratch, args.records, 8)
        if args.large_records:
            rows += _workload(runtime, scratch, args.large_records, 1 << 20)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"{'records':>10} {'bytes':>8} {'path':>9} {'seconds':>8} {'records/s':>12} "
          f"{'MB/s':>8} {'ratio':>6}")  # fmt: skip
    for row in rows:
        print(
            f"{row['records']:>10} {row['record_bytes']:>8} {row['path']:>9} "
            f"{row['seconds']:>8.2f} {row['records_per_s']:>12,.0f} {row['mb_per_s']:>8.1f} "
            f"{row['ratio']:>5.1f}x"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
