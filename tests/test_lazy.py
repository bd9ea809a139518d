"""Populations as Polars LazyFrames in the library (`dataset_rt.lazy`): a scan is
`get_metadata`, batch by batch; a LazyFrame or a Parquet path given to
`update_metadata` / `LocalSource.put` is the same population as its eager table,
refused alike, and a source failing midway changes nothing. Also runs
docs/large-datasets.md's examples."""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from conftest import ListSource, make_records, many_batches, raising_on_batch, write
from test_readme import EXAMPLE, README_LOCATION, Example, _check_output

import dataset_rt as drt
from dataset_rt.lazy import BATCH_ROWS, scan_batches
from dataset_rt.loader import LocalSource
from flight_server import Catalog, DatasetFlightServer, DatasetSpec
from flight_server.demo import DEMO_NAME, ensure_demo_cache

ROWS = 300
DOC = Path(__file__).parents[1] / "docs" / "large-datasets.md"


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return write(tmp_path / "caches", ListSource("lazy", make_records(ROWS)))


@pytest.fixture
def dataset(cache: Path, runtime: drt.DatasetRuntime) -> drt.CachedDataset:
    return runtime.cached_dataset([cache], reader_config=drt.ReaderConfig(seed=3))


def balanced(frame: Any) -> Any:
    """The seed's reweighting (shared/examples/balance.py), on a frame or a LazyFrame."""
    return frame.with_columns((1.0 / pl.len().over("label")).alias("weight"))


def edited(frame: Any) -> Any:
    """Extra columns and duplicated rows, reordered."""
    doubled = pl.concat([frame, frame.filter(pl.col("label") == 1)])
    return doubled.with_columns(
        (pl.col("score") * 2).alias("twice"), pl.col("name").str.to_uppercase().alias("tag")
    ).reverse()


def draws(dataset: drt.CachedDataset) -> list[int]:
    return dataset.draw_rows(count=2000).to_pylist()


# -- scanning ---------------------------------------------------------------------


def test_scan_equals_get_before_and_after_an_update(dataset: drt.CachedDataset) -> None:
    assert dataset.scan_metadata().collect().equals(dataset.get_metadata())
    dataset.update_metadata(edited(dataset.get_metadata()))
    scanned = dataset.scan_metadata()
    eager = dataset.get_metadata()
    assert scanned.collect_schema() == eager.schema
    assert scanned.collect().equals(eager)
    assert scanned.collect(engine="streaming").equals(eager)
    assert eager.columns[-2:] == ["twice", "tag"]
    assert eager.height == ROWS + ROWS // 3


def test_a_scan_is_the_population_active_when_it_was_made(dataset: drt.CachedDataset) -> None:
    before = dataset.get_metadata()
    scan = dataset.scan_metadata()
    dataset.update_metadata(before.head(10))
    assert scan.collect().equals(before)
    assert dataset.scan_metadata().collect().height == 10


QUERIES: list[Callable[[Any], Any]] = [
    lambda f: f.select("sample_id", "name"),
    lambda f: f.filter(pl.col("label") == 2),
    lambda f: f.filter(pl.col("score") > 40).select("name", "cache_id"),
    lambda f: f.head(7),
    lambda f: f.filter(pl.col("flag")).head(5).select("sample_id"),
    lambda f: f.filter(pl.col("twice") < 10).select("tag"),
    lambda f: f.group_by("label").agg(pl.col("weight").sum()).sort("label"),
]


@pytest.mark.parametrize("query", QUERIES)
def test_projection_filter_and_limit_give_what_eager_gives(
    dataset: drt.CachedDataset, query: Callable[[Any], Any]
) -> None:
    dataset.update_metadata(edited(dataset.get_metadata()))
    assert query(dataset.scan_metadata()).collect().equals(query(dataset.get_metadata()))


def test_the_source_receives_the_projection_the_filter_and_the_limit() -> None:
    """What the IO source is asked for, and what it reads: a few batches, not all."""
    table = pa.table({"a": range(10 * BATCH_ROWS), "b": [1.0] * (10 * BATCH_ROWS)})
    opened: list[int] = []
    asked: list[list[str] | None] = []

    def open_batches(columns: list[str] | None) -> Iterator[pa.RecordBatch]:
        asked.append(columns)
        read = table if columns is None else table.select(columns)
        for batch in read.to_batches(max_chunksize=BATCH_ROWS):
            opened.append(batch.num_rows)
            yield batch

    scan = scan_batches(table.schema, open_batches, name="test")
    plan = scan.filter(pl.col("a") % 2 == 0).select("a").explain()
    assert "PROJECT 1/2" in plan, plan
    assert "SELECTION" in plan, plan
    assert scan.head(3).collect()["a"].to_list() == [0, 1, 2]
    assert len(opened) == 1, "a limit stops the stream after the batch that reaches it"
    assert asked == [None], "a query of every column asks for every column"
    opened.clear()
    assert scan.filter(pl.col("a") >= 9 * BATCH_ROWS).select(pl.len()).collect().item() == (
        BATCH_ROWS
    )
    assert len(opened) == 10
    # The stream is asked for the columns the query reads: the filter's column
    # is read even though the result does not hold it.
    assert scan.filter(pl.col("a") == 5).select("b").collect()["b"].to_list() == [1.0]
    assert asked[-1] is None, "a and b are every column"
    narrow = pa.table({"a": [1, 2, 3], "b": [1.0, 2.0, 3.0], "c": ["x", "y", "z"]})

    def open_narrow(columns: list[str] | None) -> Iterator[pa.RecordBatch]:
        asked.append(columns)
        return iter((narrow if columns is None else narrow.select(columns)).to_batches())

    three = scan_batches(narrow.schema, open_narrow, name="test")
    assert three.filter(pl.col("c") != "y").select("a").collect()["a"].to_list() == [1, 3]
    assert asked[-1] == ["a", "c"], "the query's columns, in the stream's order"


# -- writing ----------------------------------------------------------------------


def test_a_lazy_reweighting_is_the_eager_population(dataset: drt.CachedDataset) -> None:
    table = dataset.get_metadata()
    lazy = balanced(dataset.scan_metadata())
    dataset.update_metadata(balanced(table))
    expected, expected_draws = dataset.get_metadata(), draws(dataset)
    dataset.update_metadata(table.head(3))
    dataset.update_metadata(lazy)
    assert dataset.get_metadata().equals(expected)
    assert draws(dataset) == expected_draws
    assert len(dataset) == ROWS


def test_a_lazy_frame_is_never_collected(
    dataset: drt.CachedDataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    frame = balanced(dataset.get_metadata())
    lazy = many_batches(frame, 4)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the LazyFrame was collected")

    monkeypatch.setattr(pl.LazyFrame, "collect", refuse)
    dataset.update_metadata(lazy)
    assert dataset.num_rows == 4 * ROWS


def test_parquet_files_and_directories_are_the_eager_population(
    dataset: drt.CachedDataset, cache: Path, tmp_path: Path
) -> None:
    frame = edited(balanced(dataset.get_metadata()))
    source = LocalSource([cache], tmp_path / "state")
    eager_id = source.put(frame)
    assert source.put(frame.lazy()) == eager_id
    single = tmp_path / "population.parquet"
    frame.write_parquet(single)
    parts = tmp_path / "parts"
    parts.mkdir()
    for i, start in enumerate(range(0, frame.height, 100)):
        frame.slice(start, 100).write_parquet(parts / f"part-{i:03}.parquet")
    assert source.put(single) == eager_id
    assert source.put(str(single)) == eager_id
    assert source.put(parts) == eager_id
    dataset.update_metadata(parts)
    assert dataset.get_metadata().equals(frame)


def test_a_parquet_population_is_read_one_row_group_at_a_time(tmp_path: Path) -> None:
    """A put from one Parquet file holds a row group at a time, not the file read so
    far (pyarrow's pre-buffering, apache/arrow#39808): the scan `write_arrow` uses.
    Measured by pyarrow's own allocations while the put's stream is read."""
    import numpy as np
    import pyarrow.parquet as pq

    from dataset_rt.lazy import streamed

    rows = 1 << 22
    path = tmp_path / "population.parquet"
    table = pa.table(
        {
            "cache_id": np.zeros(rows, np.uint64),
            "sample_id": np.arange(rows, dtype=np.uint64),
            "weight": np.random.default_rng(0).random(rows),
        }
    )
    pq.write_table(table, path, row_group_size=1 << 17, compression="none")  # 32 groups
    del table
    source = streamed(path)
    assert source is not None
    start, peak, seen = pa.total_allocated_bytes(), 0, 0
    for batch in source.batches():
        peak = max(peak, pa.total_allocated_bytes() - start)
        seen += batch.num_rows
        del batch
    assert seen == rows
    # One row group is 3 MiB of this 96 MiB file; pre-buffering held all of it.
    assert peak < path.stat().st_size / 4, (peak, path.stat().st_size)


def test_a_missing_parquet_path_is_refused(dataset: drt.CachedDataset, tmp_path: Path) -> None:
    before = dataset.get_metadata()
    with pytest.raises(FileNotFoundError, match="no Parquet file or directory"):
        dataset.update_metadata(tmp_path / "absent.parquet")
    assert dataset.get_metadata().equals(before)


BAD_EDITS: list[Callable[[Any], Any]] = [
    lambda f: f.drop("weight"),
    lambda f: f.with_columns(pl.col("label").cast(pl.Float64)),
    lambda f: f.with_columns(pl.col("name") + "!"),
    lambda f: f.with_columns(
        pl.when(pl.col("label") == 1).then(-1.0).otherwise(1.0).alias("weight")
    ),
    lambda f: f.with_columns(pl.col("sample_id") + 10_000),
]


@pytest.mark.parametrize("edit", BAD_EDITS)
def test_a_bad_lazy_frame_gets_its_eager_error_and_changes_nothing(
    dataset: drt.CachedDataset, cache: Path, tmp_path: Path, edit: Callable[[Any], Any]
) -> None:
    frame = dataset.get_metadata()
    dataset.update_metadata(frame.head(50))
    before, position = dataset.get_metadata(), draws(dataset)
    with pytest.raises(drt.InvalidPopulationError) as eager:
        dataset.update_metadata(edit(pl.concat([frame] * 3)))
    with pytest.raises(drt.InvalidPopulationError) as lazy:
        dataset.update_metadata(edit(many_batches(frame, 3)))
    assert str(lazy.value) == str(eager.value)
    assert type(lazy.value) is type(eager.value)
    assert dataset.get_metadata().equals(before)
    assert draws(dataset) == position

    source = LocalSource([cache], tmp_path / "state")
    active = source.service.active().population
    with pytest.raises(drt.InvalidPopulationError) as put:
        source.put(edit(many_batches(frame, 3)))
    assert str(put.value) == str(eager.value)
    assert source.service.active().population == active


def test_a_lazy_frame_failing_midway_changes_nothing(
    dataset: drt.CachedDataset, cache: Path, tmp_path: Path
) -> None:
    frame = dataset.get_metadata()
    dataset.update_metadata(balanced(frame))
    before, position, length = dataset.get_metadata(), draws(dataset), len(dataset)
    failing = many_batches(frame).map_batches(raising_on_batch(3), streamable=True)
    with pytest.raises(RuntimeError, match="batch 3 is bad"):
        dataset.update_metadata(failing)
    assert dataset.get_metadata().equals(before)
    assert draws(dataset) == position
    assert len(dataset) == length

    source = LocalSource([cache], tmp_path / "state")
    stored = source.service.populations()
    failing = many_batches(frame).map_batches(raising_on_batch(3), streamable=True)
    with pytest.raises(RuntimeError, match="batch 3 is bad"):
        source.put(failing)
    assert source.service.populations() == stored


def test_eager_tables_keep_their_path(dataset: drt.CachedDataset) -> None:
    frame = balanced(dataset.get_metadata())
    dataset.update_metadata(frame.to_arrow())
    assert dataset.get_metadata().equals(frame)
    reader = pa.RecordBatchReader.from_batches(
        frame.to_arrow().schema, frame.to_arrow().to_batches()
    )
    dataset.update_metadata(reader)
    assert dataset.get_metadata().equals(frame)


# -- docs/large-datasets.md -------------------------------------------------------


def _doc_examples() -> list[Example]:
    text = DOC.read_text()
    return [
        Example(text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2) or "")
        for m in EXAMPLE.finditer(text)
    ]


def _run_in(example: Example, cwd: Path, location: str, namespace: dict[str, Any]) -> str:
    """test_readme's run of one example, in the page's shared ``namespace``."""
    code = example.code.replace(README_LOCATION, location)
    printed = io.StringIO()
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, f"{DOC}:{example.line}", "exec"), namespace)
    finally:
        os.chdir(previous)
    return printed.getvalue().replace(location, README_LOCATION)


def test_the_large_datasets_page_runs_as_written(
    tmp_path: Path, runtime: drt.DatasetRuntime, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The page's examples in order, in one namespace as a reader runs them (the
    in-process ones in a fresh directory, the Flight ones against a demo server),
    twice in a row as test_readme runs the README, each printing what the page
    shows; and the README links the page."""
    examples = _doc_examples()
    assert len(examples) >= 5
    assert any(e.needs_server for e in examples)
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert re.search(r"\[docs/large-datasets\.md\]\(docs/large-datasets\.md\)", readme)
    demo = ensure_demo_cache(runtime, tmp_path_factory.mktemp("demo"))
    catalog = Catalog([DatasetSpec(DEMO_NAME, (demo,))], tmp_path / "state", runtime)
    with DatasetFlightServer(catalog, "grpc://127.0.0.1:0") as server:
        for run in ("first", "second"):
            namespace: dict[str, Any] = {"__name__": "__large_datasets__"}
            for example in examples:
                location = server.location if example.needs_server else README_LOCATION
                try:
                    _check_output(example, _run_in(example, tmp_path, location, namespace))
                except BaseException as error:
                    error.add_note(f"on the {run} pass through the page")
                    raise
