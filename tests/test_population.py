"""The active population: `get_metadata` / `update_metadata` (DESIGN contract 3).

An update is all-or-nothing: every rejection raises `InvalidPopulationError` naming
the column, the first offending row and how many rows fail, and leaves the
population, the epoch length and the stream position exactly as they were.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from conftest import ListSource, make_records
from polars.testing import assert_frame_equal

import dataset_rt as drt

N = 12
SEED = 11
STORED = ["label", "score", "flag", "name"]
# The default table's columns: identities, the stored columns by name (as
# dataset-rt 0.4.8 ordered them, whatever the records' key order), weight.
SCHEMA = {
    "cache_id": pl.UInt64,
    "sample_id": pl.UInt64,
    "flag": pl.Boolean,
    "label": pl.Int64,
    "name": pl.String,
    "score": pl.Float64,
    "weight": pl.Float64,
}
RECORDS = make_records(N)


# -- helpers -------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache_path(runtime: drt.DatasetRuntime, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("population")
    (result,) = runtime.write_cache(
        ListSource("pop", RECORDS), base, writer_config=drt.WriterConfig(show_progress=False)
    )
    assert isinstance(result, drt.CacheWriteSuccess), result
    return result.path


def open_dataset(
    runtime: drt.DatasetRuntime, path: Path, *, shuffle: bool = True, seed: int = SEED
) -> drt.CachedDataset:
    return runtime.cached_dataset(
        [path], reader_config=drt.ReaderConfig(seed=seed, shuffle=shuffle)
    )


def epoch(dataset: drt.CachedDataset) -> list[tuple[int, int, bytes, dict[str, Any]]]:
    """Consume one iterator of ``dataset``: every sample's identity, payload and metadata."""
    return [(s.cache_id, s.sample_id, s.data, s.metadata) for s in dataset]


def stream_ids(reader: pa.RecordBatchReader) -> list[tuple[int, int, int]]:
    table = reader.read_all()
    return list(
        zip(
            table["position"].to_pylist(),
            table["cache_id"].to_pylist(),
            table["sample_id"].to_pylist(),
            strict=True,
        )
    )


def with_values(
    df: pl.DataFrame, column: str, rows: dict[int, Any], dtype: Any = None
) -> pl.DataFrame:
    """``df`` with ``column`` replaced at the given row indices (optionally retyped)."""
    values = df[column].to_list()
    for row, value in rows.items():
        values[row] = value
    return df.with_columns(pl.Series(column, values, dtype=dtype or df[column].dtype))


def tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def active_table(base: pl.DataFrame) -> pl.DataFrame:
    """A valid, non-default population: a row removed, reweighted, reordered, annotated."""
    return (
        base.filter(pl.col("sample_id") != 5)
        .with_columns((1.0 + pl.col("label")).alias("weight"), (pl.col("name") + "!").alias("note"))
        .reverse()
    )


@pytest.fixture
def twins(
    runtime: drt.DatasetRuntime, cache_path: Path
) -> tuple[drt.CachedDataset, drt.CachedDataset, pl.DataFrame]:
    """Two datasets with the same caches, seed and history, plus the default table.

    Both have a non-default population, epoch length 7 and one consumed epoch, so a
    rejection that touched any of that would show.
    """
    first = open_dataset(runtime, cache_path)
    second = open_dataset(runtime, cache_path)
    base = first.get_metadata()
    for dataset in (first, second):
        dataset.update_metadata(active_table(base))
        dataset.set_epoch_len(7)
        assert len(epoch(dataset)) == 7
    return first, second, base


# -- the default table ---------------------------------------------------------


def test_default_metadata_schema_and_values(runtime: drt.DatasetRuntime, cache_path: Path) -> None:
    dataset = open_dataset(runtime, cache_path)
    table = dataset.get_metadata()
    assert isinstance(table, pl.DataFrame)
    assert dict(table.schema) == SCHEMA
    assert list(table.columns) == list(SCHEMA)
    assert table.height == N == len(dataset)
    assert table["sample_id"].to_list() == list(range(N))
    assert table["cache_id"].n_unique() == 1
    assert table["weight"].to_list() == [1.0] * N
    assert table.select(STORED).rows() == [tuple(r.metadata[c] for c in STORED) for r in RECORDS]
    # The identities name the records.
    cache_id = table["cache_id"][0]
    for sample_id in (0, 7, N - 1):
        item = dataset.get_item(cache_id, sample_id)
        assert item.data == RECORDS[sample_id].data
        assert item.metadata == dict(RECORDS[sample_id].metadata)


def test_aliases_read_and_write_the_same_population(
    runtime: drt.DatasetRuntime, cache_path: Path
) -> None:
    dataset = open_dataset(runtime, cache_path)
    assert_frame_equal(dataset.samples_metadata(), dataset.get_metadata())
    subset = dataset.get_metadata().head(4)
    dataset.set_samples_metadata(subset)
    assert_frame_equal(dataset.get_metadata(), subset)
    assert len(dataset) == 4
    with pytest.raises(drt.InvalidPopulationError):
        dataset.set_samples_metadata(subset.head(0))
    assert_frame_equal(dataset.samples_metadata(), subset)


# -- rejections ----------------------------------------------------------------


@dataclass(frozen=True)
class Reject:
    """A table ``build(base)`` must reject: expected column(s), first row, count."""

    id: str
    build: Callable[[pl.DataFrame], Any]
    columns: tuple[str | None, ...]
    row: int | None = None
    count: int | None = None
    words: tuple[str, ...] = ()


def _other_cache_id(base: pl.DataFrame) -> int:
    cache_id: int = base["cache_id"][0]
    return cache_id + 1 if cache_id < 2**64 - 1 else cache_id - 1


def _swap(df: pl.DataFrame, column: str, a: int, b: int) -> pl.DataFrame:
    return with_values(df, column, {a: df[column][b], b: df[column][a]})


REJECTIONS = [
    # Not a table at all.
    Reject("dict", lambda b: b.to_dict(as_series=False), (None,), words=("dict",)),
    Reject("int", lambda b: 42, (None,), words=("int",)),
    Reject("list-of-rows", lambda b: b.rows(named=True), (None,), words=("list",)),
    Reject("empty", lambda b: b.head(0), (None,), words=("empty|0 rows",)),
    # Missing columns.
    *[
        Reject(f"missing-{c}", lambda b, c=c: b.drop(c), (c,), words=("missing", f"'{c}'"))
        for c in ["cache_id", "sample_id", *STORED, "weight"]
    ],
    Reject(
        "missing-two",
        lambda b: b.drop("flag", "weight"),
        ("flag", "weight"),
        words=("missing", "'flag'", "'weight'"),
    ),
    # Null, unknown, out-of-range and negative identities.
    Reject(
        "null-cache_id",
        lambda b: with_values(b, "cache_id", {2: None, 9: None}),
        ("cache_id",),
        2,
        2,
        ("null",),
    ),
    Reject(
        "null-sample_id",
        lambda b: with_values(b, "sample_id", {4: None}),
        ("sample_id",),
        4,
        1,
        ("null",),
    ),
    Reject(
        "unknown-cache_id",
        lambda b: with_values(b, "cache_id", {r: _other_cache_id(b) for r in range(5, N)}),
        ("cache_id",),
        5,
        N - 5,
        ("unknown|not",),
    ),
    Reject(
        "sample_id-out-of-range",
        lambda b: with_values(b, "sample_id", {7: N, 8: 10**6}),
        ("sample_id",),
        7,
        2,
    ),
    Reject(
        "negative-sample_id",
        lambda b: with_values(b, "sample_id", {4: -1}, pl.Int64),
        ("sample_id",),
        4,
        1,
        ("negative",),
    ),
    Reject(
        "negative-cache_id",
        lambda b: b.with_columns(pl.lit(-1, dtype=pl.Int64).alias("cache_id")),
        ("cache_id",),
        0,
        N,
        ("negative",),
    ),
    # Columns of another type.
    Reject(
        "label-as-Int32",
        lambda b: b.with_columns(pl.col("label").cast(pl.Int32)),
        ("label",),
        words=("Int32",),
    ),
    Reject(
        "label-as-Float64",
        lambda b: b.with_columns(pl.col("label").cast(pl.Float64)),
        ("label",),
        words=("Float64",),
    ),
    Reject(
        "score-as-Float32",
        lambda b: b.with_columns(pl.col("score").cast(pl.Float32)),
        ("score",),
        words=("Float32",),
    ),
    Reject("flag-as-Int64", lambda b: b.with_columns(pl.col("flag").cast(pl.Int64)), ("flag",)),
    Reject(
        "name-as-Categorical",
        lambda b: b.with_columns(pl.col("name").cast(pl.Categorical)),
        ("name",),
    ),
    Reject(
        "sample_id-as-Float64",
        lambda b: b.with_columns(pl.col("sample_id").cast(pl.Float64)),
        ("sample_id",),
    ),
    Reject(
        "weight-as-String",
        lambda b: b.with_columns(pl.col("weight").cast(pl.String)),
        ("weight",),
    ),
    # Stored values that differ from the cache's values for that identity.
    Reject(
        "label-changed",
        lambda b: with_values(b, "label", {3: 1}),
        ("label",),
        3,
        1,
        ("differ",),
    ),
    Reject(
        "labels-rewritten",
        lambda b: b.with_columns(
            pl.when(pl.col("label") == 2).then(0).otherwise(pl.col("label")).alias("label")
        ),
        ("label",),
        2,
        len(range(2, N, 3)),
    ),
    Reject("label-null", lambda b: with_values(b, "label", {5: None}), ("label",), 5, 1),
    Reject(
        "score-nudged",
        lambda b: with_values(b, "score", {10: 5.0 + 1e-9}),
        ("score",),
        10,
        1,
    ),
    Reject("names-swapped", lambda b: _swap(b, "name", 1, 5), ("name",), 1, 2),
    Reject("name-case", lambda b: with_values(b, "name", {7: "R7"}), ("name",), 7, 1),
    Reject(
        "flags-flipped",
        lambda b: with_values(b, "flag", {2: False, 4: False, 6: False}),
        ("flag",),
        2,
        3,
    ),
    Reject(
        # Row 0 points at record 1 but carries record 0's stored values.
        "identity-moved",
        lambda b: with_values(b, "sample_id", {0: 1}),
        tuple(STORED),
        0,
        1,
    ),
    Reject(
        # Reordered and duplicated rows are fine; only the edited duplicate (row N) fails.
        "duplicate-edited",
        lambda b: pl.concat([b.reverse(), with_values(b.head(1), "label", {0: 2})]),
        ("label",),
        N,
        1,
    ),
    # Weights.
    Reject("weight-null", lambda b: with_values(b, "weight", {1: None}), ("weight",), 1, 1),
    Reject(
        "weight-nan",
        lambda b: with_values(b, "weight", {2: math.nan}),
        ("weight",),
        2,
        1,
        ("NaN",),
    ),
    Reject(
        "weight-inf", lambda b: with_values(b, "weight", {3: math.inf}), ("weight",), 3, 1, ("inf",)
    ),
    Reject(
        "weight-minus-inf",
        lambda b: with_values(b, "weight", {4: -math.inf}),
        ("weight",),
        4,
        1,
        ("inf",),
    ),
    Reject("weight-zero", lambda b: with_values(b, "weight", {5: 0.0, 6: 0.0}), ("weight",), 5, 2),
    Reject("weight-minus-zero", lambda b: with_values(b, "weight", {11: -0.0}), ("weight",), 11, 1),
    Reject(
        "weight-negative",
        lambda b: with_values(b, "weight", {9: -0.5, 0: -1e-300}),
        ("weight",),
        0,
        2,
        ("negative",),
    ),
    Reject(
        "weights-mixed",
        lambda b: with_values(b, "weight", {8: math.nan, 3: 0.0, 10: -2.0, 11: math.inf}),
        ("weight",),
        3,
        4,
    ),
    Reject(
        "weight-all-zero-int",
        lambda b: b.with_columns(pl.lit(0, dtype=pl.Int64).alias("weight")),
        ("weight",),
        0,
        N,
    ),
]


@pytest.mark.parametrize("case", REJECTIONS, ids=[c.id for c in REJECTIONS])
def test_rejection_names_the_problem_and_changes_nothing(
    twins: tuple[drt.CachedDataset, drt.CachedDataset, pl.DataFrame], case: Reject
) -> None:
    dataset, control, base = twins
    before = dataset.get_metadata()

    with pytest.raises(drt.InvalidPopulationError) as info:
        dataset.update_metadata(case.build(base))

    error = info.value
    assert isinstance(error, ValueError)
    assert isinstance(error, drt.DatasetRTError)
    message = str(error)
    assert error.column in case.columns, message
    if error.column is not None:
        assert error.column in message
    if case.row is not None:
        assert (error.row, error.count) == (case.row, case.count), message
        assert re.search(rf"\brow {case.row}\b", message), message
        assert re.search(rf"\b{case.count} rows?\b", message), message
    for pattern in case.words:
        assert re.search(pattern, message), (pattern, message)

    # Nothing changed: population, epoch length, stream position.
    assert_frame_equal(dataset.get_metadata(), before)
    assert len(dataset) == len(control) == 7
    assert epoch(dataset) == epoch(control)
    assert epoch(dataset) == epoch(control)


def test_rejections_leave_a_usable_dataset(
    twins: tuple[drt.CachedDataset, drt.CachedDataset, pl.DataFrame],
) -> None:
    dataset, control, base = twins
    for case in REJECTIONS:
        with pytest.raises(drt.InvalidPopulationError):
            dataset.update_metadata(case.build(base))
    subset = base.filter(pl.col("flag"))
    dataset.update_metadata(subset)
    control.update_metadata(subset)
    assert_frame_equal(dataset.get_metadata(), subset)
    assert len(dataset) == subset.height
    assert epoch(dataset) == epoch(control)


# -- what is allowed -----------------------------------------------------------


def test_removed_rows(runtime: drt.DatasetRuntime, cache_path: Path) -> None:
    dataset = open_dataset(runtime, cache_path, shuffle=False)
    kept = dataset.get_metadata().filter(pl.col("label") != 1)
    dataset.update_metadata(kept)
    assert_frame_equal(dataset.get_metadata(), kept)
    assert len(dataset) == kept.height == 8
    assert [s.sample_id for s in dataset] == kept["sample_id"].to_list()
    assert all(s.metadata["label"] != 1 for s in dataset)


def test_reordered_rows(runtime: drt.DatasetRuntime, cache_path: Path) -> None:
    dataset = open_dataset(runtime, cache_path, shuffle=False)
    order = [7, 3, 11, 0, 5, 1, 10, 2, 9, 4, 8, 6]
    shuffled = dataset.get_metadata()[order]
    dataset.update_metadata(shuffled)
    assert_frame_equal(dataset.get_metadata(), shuffled)
    samples = list(dataset)
    assert [s.sample_id for s in samples] == order
    assert [s.data for s in samples] == [RECORDS[i].data for i in order]


def test_duplicated_rows_are_kept(runtime: drt.DatasetRuntime, cache_path: Path) -> None:
    dataset = open_dataset(runtime, cache_path, shuffle=False)
    base = dataset.get_metadata()
    doubled = pl.concat([base, base.head(3), base.slice(1, 1)])
    dataset.update_metadata(doubled)
    assert_frame_equal(dataset.get_metadata(), doubled)
    assert len(dataset) == N + 4
    assert [s.sample_id for s in dataset] == [*range(N), 0, 1, 2, 1]


def test_a_duplicate_is_another_weighted_entry(
    runtime: drt.DatasetRuntime, cache_path: Path
) -> None:
    dataset = open_dataset(runtime, cache_path, shuffle=True)
    base = dataset.get_metadata()
    # Record 0 three times, records 1-3 once each: record 0 is half of the weight.
    table = base[[0, 1, 0, 2, 0, 3]]
    dataset.update_metadata(table)
    assert_frame_equal(dataset.get_metadata(), table)
    draws = 24_000
    counts = Counter(sid for _, _, sid in stream_ids(dataset.stream(count=draws, columns=[])))
    assert set(counts) == {0, 1, 2, 3}
    for sample_id, entries in {0: 3, 1: 1, 2: 1, 3: 1}.items():
        p = entries / 6
        sigma = math.sqrt(draws * p * (1 - p))
        assert abs(counts[sample_id] - draws * p) < 5 * sigma, (sample_id, counts)


def test_extra_columns_are_kept_in_the_order_supplied(
    runtime: drt.DatasetRuntime, cache_path: Path
) -> None:
    dataset = open_dataset(runtime, cache_path, shuffle=False)
    base = dataset.get_metadata()
    table = pl.concat([base, base.head(2)]).with_columns(
        (pl.col("score") * 10).alias("derived"),
        pl.format("note-{}", pl.col("sample_id")).alias("note"),
        pl.lit(3, dtype=pl.Int32).alias("group"),
        pl.lit(None, dtype=pl.Float32).alias("maybe"),
    )
    # Extra columns may also come first; identities and weights in any position.
    table = table.select(
        "note",
        "weight",
        "sample_id",
        "name",
        "cache_id",
        pl.exclude("note", "weight", "sample_id", "name", "cache_id"),
    )
    dataset.update_metadata(table)
    returned = dataset.get_metadata()
    assert returned.columns == table.columns
    assert_frame_equal(returned, table)
    assert len(dataset) == N + 2
    assert [s.sample_id for s in dataset] == [*range(N), 0, 1]


def test_pyarrow_table_and_reader_inputs(runtime: drt.DatasetRuntime, cache_path: Path) -> None:
    dataset = open_dataset(runtime, cache_path, shuffle=False)
    base = dataset.get_metadata()
    arrow = pa.table(base.filter(pl.col("flag")).with_columns(pl.lit(2.5).alias("weight")))
    arrow = arrow.append_column("extra", pa.array(range(arrow.num_rows), pa.int16()))
    dataset.update_metadata(arrow)
    assert_frame_equal(dataset.get_metadata(), pl.DataFrame(arrow))
    assert [s.sample_id for s in dataset] == list(range(0, N, 2))

    # A RecordBatchReader over several batches is one table.
    whole = pa.table(base.reverse())
    reader = pa.RecordBatchReader.from_batches(whole.schema, whole.to_batches(max_chunksize=5))
    dataset.update_metadata(reader)
    assert_frame_equal(dataset.get_metadata(), base.reverse())
    assert [s.sample_id for s in dataset] == list(reversed(range(N)))


@pytest.mark.parametrize("string_type", [pa.string(), pa.large_string(), pa.string_view()], ids=str)
def test_string_column_encodings(
    runtime: drt.DatasetRuntime, cache_path: Path, string_type: pa.DataType
) -> None:
    dataset = open_dataset(runtime, cache_path, shuffle=False)
    base = pa.table(dataset.get_metadata())
    index = base.schema.get_field_index("name")
    good = base.set_column(index, "name", base["name"].cast(string_type))
    names = base["name"].to_pylist()
    names[4], names[9] = "x", "r4"
    bad = base.set_column(index, "name", pa.array(names, string_type))
    assert good.schema.field("name").type == bad.schema.field("name").type == string_type

    with pytest.raises(drt.InvalidPopulationError) as info:
        dataset.update_metadata(bad)
    assert (info.value.column, info.value.row, info.value.count) == ("name", 4, 2)
    assert len(dataset) == N

    dataset.update_metadata(good.slice(0, 5))
    assert len(dataset) == 5
    assert dataset.get_metadata()["name"].to_list() == [f"r{i}" for i in range(5)]
    assert [s.metadata["name"] for s in dataset] == [f"r{i}" for i in range(5)]


def test_integer_identities_of_other_widths(runtime: drt.DatasetRuntime, cache_path: Path) -> None:
    dataset = open_dataset(runtime, cache_path, shuffle=False)
    table = dataset.get_metadata().with_columns(pl.col("sample_id").cast(pl.Int32))
    dataset.update_metadata(table)
    assert [s.sample_id for s in dataset] == list(range(N))


def test_updates_never_touch_the_cache_files(runtime: drt.DatasetRuntime, cache_path: Path) -> None:
    digest = tree_digest(cache_path)
    dataset = open_dataset(runtime, cache_path)
    base = dataset.get_metadata()
    dataset.update_metadata(active_table(base))
    for case in REJECTIONS:
        with pytest.raises(drt.InvalidPopulationError):
            dataset.update_metadata(case.build(base))
    list(dataset)
    dataset.update_metadata(base.with_columns(pl.lit(0.25).alias("weight")))
    list(dataset)
    assert tree_digest(cache_path) == digest
