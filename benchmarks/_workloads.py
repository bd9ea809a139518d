"""Benchmark worker: runs every workload against whichever ``dataset_rt`` it imports.

Both this project and the PyPI baseline (``dataset-rt==0.4.8``) import as
``dataset_rt``, so `bench_core.py` launches this file once per interpreter::

    python benchmarks/_workloads.py --lib ours --scale full --data-dir DIR --out FILE

It writes a JSON report (see `Report`) to ``--out`` and progress lines to stderr.
Every workload group is isolated: a failing or missing API is recorded under
``errors`` and the remaining workloads still run.

This module must stay importable without ``dataset_rt`` (the parent imports
`Sizes` from it) and must not need numpy except for the baseline's numpy draws.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.metadata
import json
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

LIBS = ("ours", "baseline")
BATCH_SIZE = 1024
BATCH_BYTES = 4 << 20
NUM_WORKERS = 2
POOL_BYTES = 16 << 20
OURS_BATCH_NOTE = f"iter_batches(columns=None, batch_size={BATCH_SIZE})"
BASELINE_BATCH_NOTE = (
    "baseline has no batch API (only a torch DataLoader that collates per-sample "
    "CachedSample lists): measured as its per-sample iterator collected into column lists "
    f"of {BATCH_SIZE} rows or {BATCH_BYTES >> 20} MiB of payload, whichever comes first"
)


@dataclass(frozen=True)
class Sizes:
    """Record counts, payload sizes and repeat counts of one benchmark run."""

    small_count: int = 200_000
    small_size: int = 1 << 10
    large_count: int = 2_000
    large_size: int = 1 << 20
    tiny_count: int = 1_000_000
    tiny_size: int = 16
    draws: int = 10_000_000
    write_repeats: int = 2
    repeats: int = 3

    @classmethod
    def for_scale(cls, scale: str) -> Sizes:
        """Full sizes for ``"full"``; 10x fewer records and draws for ``"quick"``."""
        if scale == "full":
            return cls()
        if scale == "quick":
            full = cls()
            return cls(
                small_count=full.small_count // 10,
                large_count=full.large_count // 10,
                tiny_count=full.tiny_count // 10,
                draws=full.draws // 10,
            )
        raise ValueError(f"unknown scale {scale!r}; expected 'full' or 'quick'")


@dataclass
class Measurement:
    """Best-of-N timing of one workload; ``items`` and ``nbytes`` are per run."""

    seconds: float
    items: int
    nbytes: int = 0
    runs: list[float] = field(default_factory=list)
    note: str = ""


@dataclass
class Report:
    """Everything one worker measured, serialised to JSON for the parent."""

    lib: str
    version: str
    module_file: str
    python: str
    sizes: dict[str, int]
    results: dict[str, Measurement] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


class BenchError(RuntimeError):
    """A library returned something other than what the workload expects."""


class RecordSource:
    """A named, re-iterable cache source over pre-built ``CacheInput`` records."""

    def __init__(self, name: str, records: Sequence[Any]) -> None:
        self.name = name
        self._records = records

    def __iter__(self) -> Iterator[Any]:
        return iter(self._records)


def log(lib: str, message: str) -> None:
    """Print one progress line to stderr (stdout is left to the libraries)."""
    print(f"[{lib}] {message}", file=sys.stderr, flush=True)


def check(condition: bool, message: str) -> None:
    """Raise `BenchError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise BenchError(message)


def best_of(repeats: int, run: Callable[[], tuple[int, int]], note: str = "") -> Measurement:
    """Time ``run`` ``repeats`` times; keep the fastest. ``run`` returns (items, bytes)."""
    runs: list[float] = []
    items = nbytes = 0
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        items, nbytes = run()
        runs.append(time.perf_counter() - start)
    return Measurement(min(runs), items, nbytes, runs, note)


def payload_pool() -> memoryview:
    """Fixed-seed random bytes; payloads are zero-copy slices of it."""
    return memoryview(random.Random(0).randbytes(POOL_BYTES))


def make_records(drt: Any, count: int, size: int, pool: memoryview) -> list[Any]:
    """Build ``count`` records of ``size`` bytes each, at pseudo-random pool offsets."""
    span = len(pool) - size
    offsets = random.Random(size).choices(range(span + 1), k=count)
    return [
        drt.CacheInput(
            data=pool[offset : offset + size],
            metadata={"label": i % 10, "score": float(i), "split": "train"},
        )
        for i, offset in enumerate(offsets)
    ]


def write_once(drt: Any, rt: Any, source: RecordSource, base_dir: Path) -> Path:
    """Write one cache and return its path (raise if the library reports an error)."""
    config = drt.WriterConfig(show_progress=False)
    results = rt.write_cache(source, base_dir, writer_config=config)
    check(len(results) == 1, f"write_cache returned {len(results)} results for one source")
    result = results[0]
    check(isinstance(result, drt.CacheWriteSuccess), f"write_cache failed: {result!r}")
    return Path(result.path)


def bench_write(
    drt: Any, rt: Any, records: list[Any], size: int, root: Path, repeats: int
) -> tuple[Measurement, Path]:
    """Best-of-N cache write into fresh directories; keep only the last cache."""
    source = RecordSource("bench", records)
    paths: list[Path] = []

    def run() -> tuple[int, int]:
        for old in paths:
            shutil.rmtree(old.parent, ignore_errors=True)
        base = Path(tempfile.mkdtemp(prefix="write-", dir=root))
        paths.append(write_once(drt, rt, source, base))
        return len(records), len(records) * size

    measurement = best_of(repeats, run)
    return measurement, paths[-1]


def open_dataset(drt: Any, rt: Any, path: Path, *, shuffle: bool) -> Any:
    """Open one cache with seed 0."""
    config = drt.ReaderConfig(seed=0, shuffle=shuffle)
    return rt.cached_dataset([path], reader_config=config)


def consume_samples(dataset: Any) -> tuple[int, int]:
    """One epoch through the per-sample iterator, touching every payload's length."""
    count = nbytes = 0
    for sample in dataset:
        nbytes += len(sample.data)
        count += 1
    return count, nbytes


def consume_arrow(reader: Any) -> tuple[int, int]:
    """Drain an Arrow ``RecordBatchReader``; count rows and payload bytes."""
    import pyarrow.compute as pc

    rows = nbytes = 0
    for batch in reader:
        rows += batch.num_rows
        if batch.num_rows:
            nbytes += pc.sum(pc.binary_length(batch.column("payload"))).as_py()
    return rows, nbytes


def consume_batches(dataset: Any) -> tuple[int, int]:
    """One epoch through our Arrow batch path, all columns."""
    return consume_arrow(dataset.iter_batches(columns=None, batch_size=BATCH_SIZE))


def consume_sample_lists(dataset: Any) -> tuple[int, int]:
    """Baseline 'batches': per-sample iteration collected into bounded column lists."""
    rows = nbytes = pending = 0
    data: list[bytes] = []
    metadata: list[dict[str, Any]] = []
    ids: list[tuple[int, int]] = []
    for sample in dataset:
        data.append(sample.data)
        metadata.append(sample.metadata)
        ids.append((sample.cache_id, sample.sample_id))
        pending += len(sample.data)
        if len(data) == BATCH_SIZE or pending >= BATCH_BYTES:
            rows += len(data)
            nbytes += pending
            data, metadata, ids, pending = [], [], [], 0
    return rows + len(data), nbytes + pending


def bench_epochs(
    lib: str, drt: Any, rt: Any, path: Path, tag: str, expect: tuple[int, int], repeats: int
) -> dict[str, Measurement]:
    """Per-sample and batch epochs over one cache, shuffled and in order."""
    out: dict[str, Measurement] = {}
    for shuffle in (True, False):
        order = "shuffle" if shuffle else "ordered"
        dataset = open_dataset(drt, rt, path, shuffle=shuffle)
        check(len(dataset) == expect[0], f"len(dataset) is {len(dataset)}, expected {expect[0]}")
        out[f"iter.{tag}.{order}"] = best_of(repeats, partial(consume_samples, dataset))
        if lib == "ours":
            batches = best_of(repeats, partial(consume_batches, dataset), OURS_BATCH_NOTE)
        else:
            batches = best_of(repeats, partial(consume_sample_lists, dataset), BASELINE_BATCH_NOTE)
        out[f"batch.{tag}.{order}"] = batches
    for key, measurement in out.items():
        got = (measurement.items, measurement.nbytes)
        check(got == expect, f"{key}: read (samples, bytes) {got}, expected {expect}")
    return out


def reweight(frame: Any) -> Any:
    """The benchmark's reweighting: a vectorised Polars expression over label/score."""
    import polars as pl

    return frame.with_columns(
        weight=pl.when(pl.col("label") == 3)
        .then(pl.lit(4.0))
        .otherwise(1.0 + pl.col("score") % 3.0)
    )


def bench_metadata(dataset: Any, rows: int, repeats: int) -> dict[str, Measurement]:
    """Time get_metadata, the Polars reweighting and update_metadata on ``rows`` rows."""
    phases: dict[str, list[float]] = {"get": [], "reweight": [], "update": [], "total": []}
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        frame = dataset.get_metadata()
        t1 = time.perf_counter()
        updated = reweight(frame)
        t2 = time.perf_counter()
        dataset.update_metadata(updated)
        t3 = time.perf_counter()
        check(frame.height == rows, f"get_metadata returned {frame.height} rows, expected {rows}")
        for name, spent in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t3 - t0), strict=True):
            phases[name].append(spent)
    check(len(dataset) == rows, f"len(dataset) after update_metadata is {len(dataset)}")
    return {f"meta.{name}": Measurement(min(runs), rows, 0, runs) for name, runs in phases.items()}


def ours_draws(dataset: Any, count: int, repeats: int) -> Measurement:
    """Our weighted draws: ``CachedDataset.draw_rows``, the stream's draws without payloads."""

    def run() -> tuple[int, int]:
        drawn = len(dataset.draw_rows(start=0, count=count))
        check(drawn == count, f"draw_rows returned {drawn} rows, expected {count}")
        return drawn, 0

    return best_of(repeats, run, "CachedDataset.draw_rows(start=0, count) (alias table, 2 workers)")


def numpy_draws(dataset: Any, count: int, repeats: int) -> Measurement:
    """Baseline draws: numpy ``Generator.choice`` with probabilities from the weights."""
    import numpy as np

    weights = dataset.get_metadata()["weight"].to_numpy()

    def run() -> tuple[int, int]:
        drawn = np.random.default_rng(0).choice(len(weights), size=count, p=weights / weights.sum())
        return len(drawn), 0

    return best_of(repeats, run, f"numpy {np.__version__} default_rng(0).choice(n, size, p=w/sum)")


class Runner:
    """Runs each workload group of one library, recording results and errors."""

    def __init__(self, lib: str, sizes: Sizes, root: Path) -> None:
        self.lib = lib
        self.sizes = sizes
        self.root = root
        self.drt: Any = importlib.import_module("dataset_rt")
        self.rt: Any = self.drt.DatasetRuntime(num_workers=NUM_WORKERS)
        self.pool = payload_pool()
        self.report = Report(
            lib=lib,
            version=library_version(),
            module_file=str(self.drt.__file__),
            python=sys.version.split()[0],
            sizes=asdict(sizes),
        )

    def guarded(self, group: str, body: Callable[[], dict[str, Measurement]]) -> None:
        """Run one workload group; record its measurements or its failure."""
        log(self.lib, f"{group} ...")
        try:
            results = body()
        except Exception as error:  # any library failure is a finding, not a crash
            self.report.errors[group] = f"{type(error).__name__}: {error}"
            log(self.lib, f"{group} FAILED: {type(error).__name__}: {error}")
            log(self.lib, traceback.format_exc().rstrip())
            return
        for key, measurement in results.items():
            self.report.results[key] = measurement
            log(self.lib, f"  {key}: {measurement.seconds:.4f} s")

    def payload_group(self, tag: str, count: int, size: int) -> None:
        """Write, then read per-sample and in batches, one payload size."""
        cache: list[Path] = []

        def write() -> dict[str, Measurement]:
            # The records are built before, and freed after, the timed writes.
            records = make_records(self.drt, count, size, self.pool)
            measurement, path = bench_write(
                self.drt, self.rt, records, size, self.root, self.sizes.write_repeats
            )
            cache.append(path)
            return {f"write.{tag}": measurement}

        self.guarded(f"write.{tag}", write)
        if not cache:
            self.report.errors[f"read.{tag}"] = f"skipped: needs the cache of write.{tag}"
            return
        self.guarded(
            f"read.{tag}",
            lambda: bench_epochs(
                self.lib,
                self.drt,
                self.rt,
                cache[0],
                tag,
                (count, count * size),
                self.sizes.repeats,
            ),
        )
        shutil.rmtree(cache[0].parent, ignore_errors=True)

    def metadata_group(self) -> None:
        """Write the tiny-record cache, then time metadata updates and weighted draws."""
        sizes = self.sizes
        datasets: list[Any] = []

        def setup() -> dict[str, Measurement]:
            records = make_records(self.drt, sizes.tiny_count, sizes.tiny_size, self.pool)
            write, path = bench_write(self.drt, self.rt, records, sizes.tiny_size, self.root, 1)
            datasets.append(open_dataset(self.drt, self.rt, path, shuffle=True))
            return {"write.tiny": write}

        self.guarded("write.tiny", setup)
        if not datasets:
            self.report.errors["meta"] = "skipped: needs the cache of write.tiny"
            return
        dataset = datasets[0]
        self.guarded("meta", lambda: bench_metadata(dataset, sizes.tiny_count, sizes.repeats))
        draw = ours_draws if self.lib == "ours" else numpy_draws
        self.guarded("draws", lambda: {"draws": draw(dataset, sizes.draws, sizes.repeats)})

    def run(self) -> Report:
        """Run every workload group in a fixed order."""
        sizes = self.sizes
        self.payload_group("1k", sizes.small_count, sizes.small_size)
        self.payload_group("1m", sizes.large_count, sizes.large_size)
        self.metadata_group()
        return self.report


def library_version() -> str:
    """The installed distribution version of whichever dataset_rt was imported."""
    for dist in ("dataset-rt", "dataset-rt-flight"):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line interface of the worker."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", choices=LIBS, required=True)
    parser.add_argument("--scale", choices=("full", "quick"), default="full")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run all workloads and write the JSON report (failures are recorded in it)."""
    args = parse_args(argv)
    sizes = Sizes.for_scale(args.scale)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=f"{args.lib}-", dir=args.data_dir))
    try:
        report = Runner(args.lib, sizes, root).run()
    except Exception as error:  # e.g. the extension does not import: report, don't crash
        log(args.lib, traceback.format_exc().rstrip())
        report = Report(args.lib, "unknown", "", sys.version.split()[0], asdict(sizes))
        report.errors["setup"] = f"{type(error).__name__}: {error}"
    finally:
        shutil.rmtree(root, ignore_errors=True)
    args.out.write_text(json.dumps(asdict(report), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
