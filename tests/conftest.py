"""Shared fixtures and helpers: a runtime, an in-memory source, deterministic records."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import dataset_rt as drt

_RUNTIME: drt.DatasetRuntime | None = None


def _shared_runtime() -> drt.DatasetRuntime:
    global _RUNTIME
    if _RUNTIME is None:
        _RUNTIME = drt.DatasetRuntime(num_workers=2)
    return _RUNTIME


@pytest.fixture(scope="session")
def ceph(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A one-node Ceph radosgw on loopback for the session (tests/ceph_s3.py):
    the real S3-compatible store of the object-storage and contract suites."""
    from ceph_s3 import CephS3, missing_binaries

    missing = missing_binaries()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the object-storage tests; missing {missing} (.ci/run)")
        pytest.skip(f"Ceph is not installed (missing {', '.join(missing)}); .ci/run installs it")
    with CephS3(tmp_path_factory.mktemp("ceph")) as store:
        yield store


@pytest.fixture(scope="session")
def runtime() -> drt.DatasetRuntime:
    """One two-worker runtime for the whole session (a runtime holds no dataset state)."""
    return _shared_runtime()


class ListSource:
    """A named source over a list of records that counts how often it was iterated."""

    def __init__(self, name: str, records: list[drt.CacheInput]) -> None:
        self.name = name
        self.records = list(records)
        self.iterations = 0

    def __iter__(self) -> Iterator[drt.CacheInput]:
        self.iterations += 1
        return iter(self.records)

    def __repr__(self) -> str:
        return f"ListSource({self.name!r}, {len(self.records)} records)"


def payload(index: int, size: int = 16, seed: int = 0) -> bytes:
    """Deterministic pseudo-random bytes of record ``index`` (distinct per record)."""
    return random.Random(f"{seed}:{index}").randbytes(size)


def make_records(n: int, *, payload_size: int = 16, seed: int = 0) -> list[drt.CacheInput]:
    """``n`` records with the four metadata types and deterministic, distinct payloads."""
    return [
        drt.CacheInput(
            data=payload(i, payload_size, seed),
            metadata={"label": i % 3, "score": float(i) / 2, "flag": i % 2 == 0, "name": f"r{i}"},
        )
        for i in range(n)
    ]


def write(tmp_path: Path, source: Any, **writer_kwargs: Any) -> Path:
    """Write ``source`` under ``tmp_path`` (progress bar off) and return the cache path."""
    writer_kwargs.setdefault("show_progress", False)
    config = drt.WriterConfig(**writer_kwargs)
    (result,) = _shared_runtime().write_cache(source, tmp_path, writer_config=config)
    assert isinstance(result, drt.CacheWriteSuccess), result
    assert result.path == tmp_path / source.name
    return result.path


# -- LazyFrames for the lazy suites (tests/test_lazy.py, tests/flight/test_lazy.py) --


def raising_on_batch(n: int) -> Callable[[pl.DataFrame], pl.DataFrame]:
    """A `map_batches` function that raises on the ``n``-th batch it sees."""
    seen = 0

    def check(frame: pl.DataFrame) -> pl.DataFrame:
        nonlocal seen
        seen += 1
        if seen == n:
            raise RuntimeError(f"batch {n} is bad")
        return frame

    return check


def many_batches(frame: pl.DataFrame, copies: int = 40) -> pl.LazyFrame:
    """``frame`` ``copies`` times over, lazily: a query of many batches."""
    return pl.concat([frame.lazy()] * copies)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow, fuzz-at-length and end-to-end tests run on purpose (``-m slow``,
    ``-m fuzz``, ``-m e2e``), not by default."""
    if config.getoption("markexpr"):
        return
    for item in items:
        for marker in ("slow", "fuzz", "e2e"):
            if marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=f"{marker}: run with -m {marker}"))
