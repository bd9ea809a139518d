"""`DatasetRuntime`: the fixed pool of Rust worker threads and cache orchestration."""

from __future__ import annotations

import json
import operator
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dataset_rt import _native
from dataset_rt.config import DEFAULT_WRITER_CONFIG, ReaderConfig, WriterConfig
from dataset_rt.dataset import (
    CachedDataset,
    CacheSourcesDatasetError,
    CacheSourcesDatasetResult,
    CacheSourcesDatasetSuccess,
)
from dataset_rt.errors import DatasetRTError, InvalidArgumentError
from dataset_rt.facade import facade_module
from dataset_rt.records import (
    CacheSource,
    CacheWriteError,
    CacheWriteResult,
    CacheWriteSuccess,
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
        not overwritten (its source is reported as an error naming the path).
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
        if not isinstance(config, WriterConfig):
            raise InvalidArgumentError(
                f"writer_config must be a WriterConfig, got {type(config).__name__}"
            )
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
        written = _native.write_cache(
            self._native,
            iter(source),  # type: ignore[call-overload]
            str(base_dir),
            name,
            config.options,
            total=_length_hint(source),
            profiler=profiler,
        )
        return Path(written)


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
