"""`DatasetRuntime`: the fixed pool of Rust worker threads and cache orchestration."""

from __future__ import annotations

import json
import operator
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeAlias

from dataset_rt import _native
from dataset_rt.config import DEFAULT_WRITER_CONFIG, ReaderConfig, WriterConfig
from dataset_rt.dataset import (
    CachedDataset,
    CacheSourcesDatasetError,
    CacheSourcesDatasetResult,
    CacheSourcesDatasetSuccess,
)
from dataset_rt.errors import DatasetRTError, InvalidArgumentError, SourceError
from dataset_rt.existing import write_or_reuse
from dataset_rt.facade import facade_module
from dataset_rt.records import (
    CacheSource,
    CacheWriteError,
    CacheWriteResult,
    CacheWriteSuccess,
)

ArrowData: TypeAlias = Any
"""What `DatasetRuntime.write_arrow` reads: a Parquet file or directory (a path),
a ``pyarrow.Table``, ``RecordBatch`` or ``RecordBatchReader``, a list of record
batches, a Polars ``DataFrame`` or ``LazyFrame``, or any object that exports
``__arrow_c_stream__``."""

DEFAULT_BATCH_SIZE = 64 * 1024
"""Rows per record batch read from a Parquet path or a ``LazyFrame``."""


def _arrow_stream(data: ArrowData, batch_size: int) -> tuple[object, int | None]:
    """``data`` as an Arrow C stream exporter, read lazily, and its row count if known.

    Paths are scanned batch by batch (`dataset_rt.parquet`: one row group in memory
    at a time); tables are cut into batches of ``batch_size`` rows without
    copying.
    """
    import pyarrow as pa

    if isinstance(data, (str, os.PathLike)):
        from dataset_rt.parquet import ParquetScan

        path = Path(data)
        if not path.exists():
            raise InvalidArgumentError(
                f"{path} does not exist; expected a Parquet file or a directory of Parquet files"
            )
        scan = ParquetScan(path)
        return scan.reader(batch_size), scan.count_rows()
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        return data.to_reader(max_chunksize=batch_size), data.num_rows
    if isinstance(data, (list, tuple)):
        batches = [pa.record_batch(b) if not isinstance(b, pa.RecordBatch) else b for b in data]
        if not batches:
            # An empty source: the engine refuses it as it refuses an empty iterable.
            return pa.RecordBatchReader.from_batches(pa.schema([]), []), 0
        reader = pa.RecordBatchReader.from_batches(batches[0].schema, batches)
        return reader, sum(b.num_rows for b in batches)
    if type(data).__name__ == "LazyFrame" and hasattr(data, "collect_batches"):
        return data.collect_batches(chunk_size=batch_size), None
    if hasattr(data, "__arrow_c_stream__"):
        rows = getattr(data, "num_rows", None)
        if rows is None and type(data).__name__ == "DataFrame":
            rows = getattr(data, "height", None)
        return data, rows if isinstance(rows, int) else None
    raise InvalidArgumentError(
        "data must be a Parquet path, a pyarrow Table, RecordBatch or RecordBatchReader, a "
        "list of record batches, a polars DataFrame or LazyFrame, or an object exporting "
        f"__arrow_c_stream__; got {type(data).__name__}"
    )


def _as_source_list(sources: CacheSource | Sequence[CacheSource]) -> list[CacheSource]:
    if isinstance(sources, (list, tuple)):
        return list(sources)
    return [sources]  # type: ignore[list-item]


def _source_name(source: object, position: int) -> str:
    name = getattr(source, "name", None)
    if isinstance(name, str):
        return name
    return f"<source #{position}>"


def _length_hint(source: object) -> int | None:
    """The source's length when it knows it (for the progress bar's ETA)."""
    try:
        hint = operator.length_hint(source, -1)
    except Exception:
        return None
    return hint if hint >= 0 else None


class DatasetRuntime:
    """Owns exactly ``num_workers`` Rust worker threads, reused by every operation.

    Create one per process (a forked child gets fresh threads on first use) and
    use it to write caches and open datasets.
    """

    __slots__ = ("_native",)

    def __init__(self, *, num_workers: int) -> None:
        self._native = _native.Runtime(num_workers)

    @property
    def native(self) -> _native.Runtime:
        """The engine's runtime, for the packages built on this one (the Flight server)."""
        return self._native

    @property
    def num_workers(self) -> int:
        """The number of Rust worker threads this runtime owns."""
        return self._native.num_workers

    def write_cache(
        self,
        sources: CacheSource | Sequence[CacheSource],
        base_dir: str | Path,
        *,
        writer_config: WriterConfig = DEFAULT_WRITER_CONFIG,
    ) -> list[CacheWriteResult]:
        """Write one immutable cache per source at ``base_dir / source.name``.

        Returns one `CacheWriteSuccess` or `CacheWriteError` per source, in order;
        a failing source never stops the others. A cache that already exists is
        never overwritten: the source is read and the cache is reused when the
        records are the same (the same ``cache_id``), else the source's result is
        an error naming the path and what to do (`dataset_rt.existing`).
        """
        return self._write_sources(sources, Path(base_dir), writer_config, reuse=False)

    def ensure_caches(
        self,
        sources: CacheSource | Sequence[CacheSource],
        base_dir: str | Path,
        *,
        writer_config: WriterConfig = DEFAULT_WRITER_CONFIG,
    ) -> list[CacheWriteResult]:
        """Reuse the complete caches under ``base_dir`` and write the missing ones.

        Like `from_cache_sources` without opening a dataset: one result per source,
        in order. A source whose cache exists is not iterated; a damaged existing
        cache is reported as a `CacheWriteError` (never used, never deleted).
        """
        return self._write_sources(sources, Path(base_dir), writer_config, reuse=True)

    def write_arrow(
        self,
        data: ArrowData,
        base_dir: str | Path,
        *,
        name: str,
        payload_column: str,
        writer_config: WriterConfig = DEFAULT_WRITER_CONFIG,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> CacheWriteResult:
        """Write one immutable cache at ``base_dir / name`` from columnar data.

        ``data`` is a Parquet file or a directory of them (scanned batch by batch
        with ``pyarrow.dataset``), a ``pyarrow.Table``, ``RecordBatch`` or
        ``RecordBatchReader``, a list of record batches, a Polars ``DataFrame`` or
        ``LazyFrame``, or any ``__arrow_c_stream__`` exporter. Each row is one
        record: ``payload_column`` (binary, large_binary, binary_view or
        fixed_size_binary, no nulls) is its payload and every other column is
        stored metadata (bool, integer, float or string columns, no nulls).

        The rows never become Python objects: the Arrow stream is read in Rust
        with the GIL released and written by the same engine as `write_cache`,
        so the same records give the same cache, byte for byte, and the same
        ``cache_id``, whichever path wrote them. Returns a `CacheWriteSuccess`, or
        a `CacheWriteError` whose message names the column and record at fault
        (or the bad ``name``, a missing path, ``data`` of an unknown kind: what
        `write_cache` reports as a source's failure); a failed write leaves no
        cache. An existing cache is never overwritten: it is reused when ``data``
        holds the same records (the same ``cache_id``), else the result is an error
        naming the path and what to do (`dataset_rt.existing`).
        """
        config = _checked_writer_config(writer_config)
        if not isinstance(payload_column, str):
            raise InvalidArgumentError(
                f"payload_column must be a str, got {type(payload_column).__name__}"
            )
        try:
            _native.validate_source_name(name)
            path, _ = write_arrow_cache(
                self._native, data, Path(base_dir), name, payload_column, config, batch_size
            )
        except DatasetRTError as error:
            return CacheWriteError(name, str(error))
        return CacheWriteSuccess(name, path)

    def from_arrow(
        self,
        data: ArrowData,
        base_dir: str | Path,
        *,
        name: str,
        payload_column: str,
        reader_config: ReaderConfig,
        writer_config: WriterConfig = DEFAULT_WRITER_CONFIG,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> CacheSourcesDatasetResult:
        """`from_cache_sources` for columnar data: reuse ``base_dir / name`` or write it.

        When the cache exists, ``data`` is not read (its name stands for its
        records, as for `from_cache_sources`; the cache is checked as
        `from_cache_sources` checks an existing cache); otherwise it is written
        with `write_arrow`. Then the cache is opened: the result is
        `CacheSourcesDatasetSuccess`, or `CacheSourcesDatasetError` with the
        write's or the open's error.
        """
        config = _checked_writer_config(writer_config)
        target = Path(base_dir) / name
        result: CacheWriteResult
        if _valid_name(name) and target.exists():
            try:
                _native.check_cache(str(target), config.validate_cache)
            except DatasetRTError as error:
                result = CacheWriteError(name, str(error))
            else:
                result = CacheWriteSuccess(name, target)
        else:
            result = self.write_arrow(
                data,
                base_dir,
                name=name,
                payload_column=payload_column,
                writer_config=config,
                batch_size=batch_size,
            )
        return self._open_written([result], reader_config)

    def cached_dataset(
        self, paths: Sequence[str | Path], *, reader_config: ReaderConfig
    ) -> CachedDataset:
        """Open complete caches as one dataset (raises `CorruptCacheError` for a bad one)."""
        if isinstance(paths, (str, Path)):
            paths = [paths]
        if not isinstance(reader_config, ReaderConfig):
            raise InvalidArgumentError(
                f"reader_config must be a ReaderConfig, got {type(reader_config).__name__}"
            )
        return CachedDataset._open(self._native, [Path(p) for p in paths], reader_config)

    def open_dataset(
        self,
        location: str | os.PathLike[str],
        *,
        reader_config: ReaderConfig,
        mirror_dir: str | os.PathLike[str] | None = None,
    ) -> CachedDataset:
        """Open the dataset at ``location`` as one dataset over all its caches.

        ``location`` is a directory or ``s3://BUCKET/PREFIX`` holding a committed
        dataset of many caches (`dataset_rt.parts`, docs/distributed.md), or one
        cache. Each cache is checked to be the one the dataset's descriptor names.
        A dataset on object storage is read through ``mirror_dir``, a local
        directory that holds what was fetched. Raises `NotFoundError`,
        `CorruptCacheError` (a damaged descriptor or cache) or
        `InvalidArgumentError`.
        """
        if not isinstance(reader_config, ReaderConfig):
            raise InvalidArgumentError(
                f"reader_config must be a ReaderConfig, got {type(reader_config).__name__}"
            )
        mirror = None if mirror_dir is None else os.fspath(mirror_dir)
        return CachedDataset._open(self._native, [os.fspath(location)], reader_config, mirror)

    def from_cache_sources(
        self,
        sources: CacheSource | Sequence[CacheSource],
        base_dir: str | Path,
        *,
        reader_config: ReaderConfig,
        writer_config: WriterConfig = DEFAULT_WRITER_CONFIG,
    ) -> CacheSourcesDatasetResult:
        """Reuse the complete caches under ``base_dir``, write the missing ones, open all.

        A source whose cache exists is not iterated. An existing cache that is
        corrupt or incomplete is reported as a `CacheWriteError` that names the file
        and the fix; it is never used and never deleted. The result is
        `CacheSourcesDatasetSuccess` when at least one cache is usable (check
        ``results`` for the others) and `CacheSourcesDatasetError` otherwise.
        """
        results = self.ensure_caches(sources, base_dir, writer_config=writer_config)
        return self._open_written(results, reader_config)

    def _open_written(
        self, results: list[CacheWriteResult], reader_config: ReaderConfig
    ) -> CacheSourcesDatasetResult:
        """One dataset over the caches written or reused (`from_cache_sources`'s result)."""
        paths = [r.path for r in results if isinstance(r, CacheWriteSuccess)]
        if not paths:
            failures = "; ".join(
                f"{r.source_name}: {r.message}" for r in results if isinstance(r, CacheWriteError)
            )
            # dataset-rt 0.4.8's words, which its users compare with `==`.
            message = f"no caches were written: {failures}" if failures else None
            return CacheSourcesDatasetError(results, message or "no cache sources were provided")
        try:
            dataset = self.cached_dataset(paths, reader_config=reader_config)
        except DatasetRTError as error:
            return CacheSourcesDatasetError(results, str(error))
        return CacheSourcesDatasetSuccess(dataset, results)

    def _write_sources(
        self,
        sources: CacheSource | Sequence[CacheSource],
        base_dir: Path,
        config: WriterConfig,
        *,
        reuse: bool,
    ) -> list[CacheWriteResult]:
        _checked_writer_config(config)
        source_list = _as_source_list(sources)
        # Two sources of one name would write one directory: refuse before writing.
        names = [_source_name(source, position) for position, source in enumerate(source_list)]
        _native.check_source_names(str(base_dir), names)
        options = config.options
        profiles: list[tuple[str, _native.WriteProfiler]] = []
        results: list[CacheWriteResult] = []
        try:
            for position, source in enumerate(source_list):
                name = _source_name(source, position)
                profiler = None
                if options.profile_path is not None:
                    profiler = _native.WriteProfiler()
                    profiles.append((name, profiler))
                try:
                    path = self._write_one(
                        source, name, base_dir, config, reuse=reuse, profiler=profiler
                    )
                except DatasetRTError as error:
                    results.append(CacheWriteError(name, str(error)))
                except Exception as error:  # a source's own bug must not stop the others
                    results.append(
                        CacheWriteError(name, f"the source raised {type(error).__name__}: {error}")
                    )
                else:
                    results.append(CacheWriteSuccess(name, path))
        finally:
            # Also when a source raised KeyboardInterrupt: the profile says where it was.
            if options.profile_path is not None:
                _write_profile(Path(options.profile_path), profiles)
        return results

    def _write_one(
        self,
        source: object,
        name: str,
        base_dir: Path,
        config: WriterConfig,
        *,
        reuse: bool,
        profiler: _native.WriteProfiler | None = None,
    ) -> Path:
        if not isinstance(getattr(source, "name", None), str):
            raise InvalidArgumentError(
                "a cache source needs a str attribute 'name' (the cache directory name)"
            )
        _native.validate_source_name(name)
        target = base_dir / name
        if reuse and target.exists():
            # Refuse a damaged cache loudly instead of reading or deleting it.
            _native.check_cache(str(target), config.validate_cache)
            return target

        def write(base: Path) -> str:
            return _native.write_cache(
                self._native,
                iter(source),  # type: ignore[call-overload]
                str(base),
                name,
                config.options,
                total=_length_hint(source),
                profiler=profiler,
            )

        path, _ = write_or_reuse(base_dir, name, write, full_check=config.validate_cache)
        return path


def _valid_name(name: str) -> bool:
    try:
        _native.validate_source_name(name)
    except DatasetRTError:
        return False
    return True


def _checked_writer_config(config: object) -> WriterConfig:
    if not isinstance(config, WriterConfig):
        raise InvalidArgumentError(
            f"writer_config must be a WriterConfig, got {type(config).__name__}"
        )
    return config


def write_arrow_cache(
    runtime: _native.Runtime,
    data: ArrowData,
    base_dir: Path,
    name: str,
    payload_column: str,
    config: WriterConfig,
    batch_size: int,
) -> tuple[Path, bool]:
    """`DatasetRuntime.write_arrow`, raising the engine's error (the CLI's exit code
    depends on its class): the cache's path, and whether an identical existing cache
    was reused (`dataset_rt.existing`)."""
    import pyarrow as pa

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidArgumentError(f"batch_size must be an int >= 1, got {batch_size!r}")
    try:
        stream, total = _arrow_stream(data, batch_size)
    except pa.ArrowException as error:  # an unreadable Parquet file or schema
        raise SourceError(f"cannot read {data}: {error}") from error
    options = config.options
    profiler = _native.WriteProfiler() if options.profile_path is not None else None

    def write(base: Path) -> str:
        return _native.write_arrow(
            runtime,
            stream,
            str(base),
            name,
            payload_column,
            options,
            total=total,
            profiler=profiler,
        )

    try:
        return write_or_reuse(
            base_dir, name, write, full_check=config.validate_cache, records=total
        )
    finally:
        if options.profile_path is not None and profiler is not None:
            _write_profile(Path(options.profile_path), [(name, profiler)])


def _write_profile(path: Path, profiles: list[tuple[str, _native.WriteProfiler]]) -> None:
    """Write the stage profile of one write (`WriterProfilerConfig`) as JSON."""
    summary: dict[str, Any] = {
        "format_version": 1,
        "sources": [
            {
                "source_name": name,
                "stages": [
                    {"name": stage, "calls": calls, "bytes": size, "seconds": seconds}
                    for stage, calls, size, seconds in profiler.totals()
                ],
            }
            for name, profiler in profiles
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2) + "\n")


facade_module(DatasetRuntime)
