"""Columnar ingest (`DatasetRuntime.write_arrow`) against the iterable path (`write_cache`).

Run from the project root::

    uv run python benchmarks/bench_ingest.py             # 10^7 records of 8 bytes (~1 min)
    uv run python benchmarks/bench_ingest.py --records 1000000
    uv run python benchmarks/bench_ingest.py --json results.json

The workload is the issue's: records of 8 bytes with one integer column, written
as `CacheInput`s from a Python generator (the baseline) and as a pyarrow Table and
a Parquet file of the same rows (columnar), in the same run; then 1 MiB records,
where both paths should be bound by the disk. Each write is checked to give the
same ``cache_id``. Throughputs are records/s (and MB/s of payload); the ratio is
columnar / iterable.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000_000, help="small records")
    parser.add_argument("--large-records", type=int, default=2000, help="1 MiB records")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--scratch", type=Path, default=None, help="where caches are written")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
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
