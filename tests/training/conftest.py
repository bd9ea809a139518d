"""Fixtures of the training suites: a cache with labels, an in-process source.

These suites need PyTorch (the `torch` dependency group, which CI installs);
without it they are skipped with that reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the training suites need PyTorch (uv sync --group torch)")

import polars as pl
from conftest import ListSource, make_records

import dataset_rt as drt
from dataset_rt.loader import LocalSource

DATASET = "toy"
RECORDS = 500
BIG_RECORDS = 4096
SEED = 99


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory, runtime: drt.DatasetRuntime) -> Path:
    """One cache of ``RECORDS`` records, labels 0, 1, 2 (built once per session)."""
    root = tmp_path_factory.mktemp("training")
    source = ListSource("train", make_records(RECORDS, payload_size=32))
    (result,) = runtime.write_cache(
        source, root, writer_config=drt.WriterConfig(show_progress=False)
    )
    assert isinstance(result, drt.CacheWriteSuccess), result
    return result.path


@pytest.fixture(scope="session")
def big_cache(tmp_path_factory: pytest.TempPathFactory, runtime: drt.DatasetRuntime) -> Path:
    """``BIG_RECORDS`` records of 64 KiB (256 MiB): a rank's stream (128 MiB) far
    outgrows what gRPC and the sockets buffer, so a server killed early in the
    epoch is killed mid-stream."""
    root = tmp_path_factory.mktemp("training-big")
    source = ListSource("big", make_records(BIG_RECORDS, payload_size=64 * 1024))
    (result,) = runtime.write_cache(
        source, root, writer_config=drt.WriterConfig(show_progress=False)
    )
    assert isinstance(result, drt.CacheWriteSuccess), result
    return result.path


@pytest.fixture
def source(cache: Path, tmp_path: Path) -> LocalSource:
    """The cache in this process, its populations in a fresh state directory."""
    return LocalSource([cache], tmp_path / "state", name=DATASET)


def only_label(table: pl.DataFrame, label: int) -> pl.DataFrame:
    """The population cut down to the rows of ``label`` (so every draw shows it)."""
    return table.filter(pl.col("label") == label)
