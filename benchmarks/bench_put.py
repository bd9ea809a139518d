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

``--parquet`` puts the same population from a Parquet file instead (a path given to
``update_metadata``, read one row group at a time: `dataset_rt.parquet`), each put in
a fresh process that reports its peak anonymous memory (``RssAnon``, sampled every
20 ms) and pyarrow's peak allocations; ``--baseline DIR`` runs another build's
``dataset_rt`` (a built checkout) alternately::

    uv run python benchmarks/bench_put.py --rows 1e7 --parquet --baseline ../old
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

BATCH = 10**6
DISK_PROBE_BYTES = 1 << 30


def population(cache_id: int, rows: int) -> list[pa.RecordBatch]:
    return list(population_batches(cache_id, rows))


def population_batches(cache_id: int, rows: int) -> Iterator[pa.RecordBatch]:
    for start in range(0, rows, BATCH):
        sample = np.arange(start, min(rows, start + BATCH), dtype=np.uint64)
        label = (sample % np.uint64(1000)).astype(np.int64)
        columns = [np.full(len(sample), cache_id, dtype=np.uint64), sample, label]
        columns.append(1.0 / (1 + label % 10))
        yield pa.record_batch(columns, names=["cache_id", "sample_id", "label", "weight"])


# -- a put from a Parquet file (--parquet) -------------------------------------------


def _status() -> dict[str, int]:
    """The memory lines of /proc/self/status, in bytes."""
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "RssAnon"):
                fields[key] = int(value.split()[0]) * 1024
    return fields


def parquet_child(cache: Path, parquet: Path) -> None:
    """One put of the Parquet file ``parquet`` in this fresh process (the library's
    `update_metadata(path)`); print its cost as JSON."""
    import dataset_rt as drt

    runtime = drt.DatasetRuntime(num_workers=2)
    dataset = runtime.cached_dataset([cache], reader_config=drt.ReaderConfig(seed=1))
    before = _status()
    peak = {"anon": before["RssAnon"], "arrow": pa.total_allocated_bytes()}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak["anon"] = max(peak["anon"], _status()["RssAnon"])
            peak["arrow"] = max(peak["arrow"], pa.total_allocated_bytes())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    dataset.update_metadata(parquet)
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    report = {
        "rows": dataset.num_rows,
        "seconds": seconds,
        "start_anon": before["RssAnon"],
        "peak_anon": peak["anon"],
        "peak_arrow": peak["arrow"],
        "package": str(Path(drt.__file__).parent),
    }
    print(json.dumps(report))


def parquet_puts(cache: Path, cache_id: int, rows: int, puts: int, baseline: Path | None) -> None:
    """``puts`` rounds of a put from one Parquet file (row groups of 10^6 rows), each
    in a fresh process, alternating with ``baseline``'s build when given."""
    with tempfile.TemporaryDirectory(prefix="bench_put_") as scratch:
        parquet = Path(scratch) / "population.parquet"
        batches = population_batches(cache_id, rows)
        first = next(batches)
        with pq.ParquetWriter(parquet, first.schema) as writer:
            writer.write_batch(first)
            for batch in batches:
                writer.write_batch(batch)
        size = parquet.stat().st_size
        builds: list[tuple[str, Path | None]] = [("this", None)]
        if baseline is not None:
            builds.insert(0, ("baseline", baseline))
        results = []
        for _ in range(puts):
            for build, path in builds:
                env = dict(os.environ)
                if path is not None:
                    env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
                command = [sys.executable, __file__, "--parquet-child", str(cache), str(parquet)]
                child = subprocess.run(
                    command, check=True, stdout=subprocess.PIPE, text=True, env=env
                )
                results.append(
                    {"build": build, **json.loads(child.stdout.strip().splitlines()[-1])}
                )
    mib = 1 << 20
    print(f"population: {rows:,} rows, Parquet file {size / mib:,.0f} MiB")
    print(f"{'build':>8} {'seconds':>8} {'rows/s':>12} {'start anon':>11} {'peak anon':>10} "
          f"{'peak pyarrow':>13}  (MiB)")  # fmt: skip
    for row in results:
        print(
            f"{row['build']:>8} {row['seconds']:>8.2f} {row['rows'] / row['seconds']:>12,.0f} "
            f"{row['start_anon'] / mib:>11.0f} {row['peak_anon'] / mib:>10.0f} "
            f"{row['peak_arrow'] / mib:>13.0f}"
        )


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
    parser.add_argument(
        "--parquet",
        action="store_true",
        help="put the population from a Parquet file, each put in a fresh process, and "
        "report its peak memory (anonymous, and pyarrow's allocations)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="with --parquet: a directory holding another build's dataset_rt, run alternately",
    )
    parser.add_argument("--parquet-child", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.parquet_child:
        parquet_child(*args.parquet_child)
        return
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
    if args.parquet:
        parquet_puts(caches[0], cache_id, rows, args.puts, args.baseline)
        return
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
