"""Fixtures of the audit suites: an imbalanced labelled cache, an in-process
source over it and a Flight server sharing its population store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from conftest import ListSource

import dataset_rt as drt
from dataset_rt.loader import LocalSource
from flight_server.catalog import Catalog, DatasetSpec
from flight_server.server import DatasetFlightServer

DATASET = "mix"
RECORDS = 3000
SEED = 5


def label_of(index: int) -> int:
    """80% label 0, 15% label 1, 5% label 2."""
    return 0 if index % 20 < 16 else 1 if index % 20 < 19 else 2


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory, runtime: drt.DatasetRuntime) -> Path:
    root = tmp_path_factory.mktemp("audit")
    records = [
        drt.CacheInput(
            data=index.to_bytes(8, "little") * 2,
            metadata={"label": label_of(index), "source": f"s{index % 7}"},
        )
        for index in range(RECORDS)
    ]
    (result,) = runtime.write_cache(
        ListSource("mix", records), root, writer_config=drt.WriterConfig(show_progress=False)
    )
    assert isinstance(result, drt.CacheWriteSuccess), result
    return result.path


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def source(cache: Path, state_dir: Path) -> LocalSource:
    return LocalSource([cache], state_dir, name=DATASET)


@pytest.fixture
def server(
    cache: Path, state_dir: Path, runtime: drt.DatasetRuntime
) -> Iterator[DatasetFlightServer]:
    """A server over the same cache and population store as `source`."""
    catalog = Catalog([DatasetSpec(DATASET, (cache,))], state_dir, runtime)
    with DatasetFlightServer(catalog, "grpc://127.0.0.1:0") as running:
        yield running


def balanced(table: pl.DataFrame) -> pl.DataFrame:
    """Every label the same total weight."""
    return table.with_columns((1.0 / pl.len().over("label")).alias("weight"))
