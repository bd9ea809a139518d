"""Put (issue 20): streaming validation + activation of a population, in-process.

Run from the project root::

    uv run python benchmarks/bench_put.py                         # 10^7 rows on this disk
    uv run python benchmarks/bench_put.py --scratch-dir /dev/shm/drt   # the engine alone

It writes a cache of N records of 8 bytes with one int64 column ``label`` (once, in
``--data-dir``), opens it in-process, makes a population of N rows in memory
(``cache_id``, ``sample_id`` = i, ``label``, ``weight`` = 1 / (1 + label % 10), batches
of 10^6 rows: the batches are made before the clock starts, so the figure is the
engine's, not numpy's), and times ``update_metadata`` over a RecordBatchReader of them
``--puts`` times: validation against the cache, the table and rows files written and
fsynced, the id hashed, the population swapped in.

Populations go to the library's scratch directory (``DATASET_RT_SCRATCH``, set from
``--scratch-dir``): on tmpfs nothing reaches a disk and the figure is the engine's
CPU path; on a disk it is bound by what must be made durable. So the benchmark also
prints the bytes a row costs on disk (table and rows file) and the disk's sequential
write rate with fsync (1 GiB written to the scratch directory), and their quotient:
the put rate that disk allows. To compare two trees side by side, run the script of
one with ``PYTHONPATH`` pointing at the other's checkout (built), alternating.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

BATCH = 10**6
DISK_PROBE_BYTES = 1 << 30


def population(cache_id: int, rows: int) -> list[pa.RecordBatch]:
    out = []
    for start in range(0, rows, BATCH):
        sample = np.arange(start, min(rows, start + BATCH), dtype=np.uint64)
        label = (sample % np.uint64(1000)).astype(np.int64)
        columns = [np.full(len(sample), cache_id, dtype=np.uint64), sample, label]
        columns.append(1.0 / (1 + label % 10))
        out.append(pa.record_batch(columns, names=["cache_id", "sample_id", "label", "weight"]))
    return out


def disk_write_rate(directory: Path) -> float:
    """Bytes/s of a sequential 1 GiB write with fsync into ``directory``."""
    block = os.urandom(1 << 20)
    with tempfile.NamedTemporaryFile(dir=directory) as probe:
        started = time.perf_counter()
        for _ in range(DISK_PROBE_BYTES // len(block)):
            probe.write(block)
        probe.flush()
        os.fsync(probe.fileno())
        return DISK_PROBE_BYTES / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=float, default=1e7, help="records and rows (1e7)")
    parser.add_argument("--puts", type=int, default=3, help="timed puts (3)")
    parser.add_argument("--scratch-dir", type=Path, help="where populations are written")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(__file__).parent / ".bench-data" / "put",
        help="where the cache is written (kept for the next run; remove it by hand)",
    )
    args = parser.parse_args()
    rows = int(args.rows)
    if args.scratch_dir is not None:
        args.scratch_dir.mkdir(parents=True, exist_ok=True)
        os.environ["DATASET_RT_SCRATCH"] = str(args.scratch_dir)
    from bench_scale import record_batches  # the same cache as the scale benchmark

    import dataset_rt as drt  # after DATASET_RT_SCRATCH is set

    runtime = drt.DatasetRuntime(num_workers=2)
    base = args.data_dir / f"rows-{rows}"
    caches = sorted(p for p in base.iterdir() if p.is_dir()) if base.exists() else []
    if not caches:
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        config = drt.WriterConfig(show_progress=False)
        written = runtime.write_arrow(
            record_batches(rows), base, name="put", payload_column="data", writer_config=config
        )
        if not isinstance(written, drt.CacheWriteSuccess):
            raise SystemExit(f"write_arrow failed: {written!r}")
        caches = [Path(written.path)]
    config = drt.ReaderConfig(seed=1, shuffle=True)
    dataset = runtime.cached_dataset(caches, reader_config=config)
    cache_id = int(dataset.scan_metadata().head(1).collect()["cache_id"][0])
    made = population(cache_id, rows)
    rates = []
    for _ in range(args.puts):
        reader = pa.RecordBatchReader.from_batches(made[0].schema, iter(made))
        started = time.perf_counter()
        dataset.update_metadata(reader)
        rates.append(rows / (time.perf_counter() - started))
        print(f"put of {rows:,} rows: {rates[-1]:,.0f} rows/s", flush=True)
    print(f"median {statistics.median(rates):,.0f} rows/s over {len(rates)} puts")
    scratch = args.scratch_dir or Path(tempfile.gettempdir()) / "dataset_rt-populations"
    rate = disk_write_rate(scratch)
    # Table: label and weight (8 bytes each; the identities are the rows
    # file's keys); rows file: 16 bytes.
    per_row = 2 * 8 + 16
    print(
        f"{scratch}: sequential write with fsync {rate / 2**20:,.0f} MiB/s; "
        f"{per_row} bytes a row made durable -> at most {rate / per_row:,.0f} rows/s"
    )


if __name__ == "__main__":
    main()
