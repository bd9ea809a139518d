"""Issue 22, finding 8: the column types of a population's identities and weight.

Tables with an Int32 ``sample_id`` or an Int64 / Float16 ``weight`` were
activated by casts nobody had written down, and an Int64 weight past 2^53 was
rounded on its way to Float64 without a word. The rule is now written
(docs/storage-format.md, "Column types of a population") and held here, through
`update_metadata` and over Flight ``do_put``:

- an accepted table serves exactly the values supplied: the stream's
  ``sample_id`` (UInt64) and ``weight`` (Float64) hold them, and the metadata
  comes back as supplied, types included;
- a refused table raises `InvalidPopulationError` (``INVALID_ARGUMENT`` over
  Flight) naming the column and the valid types, or the first offending row and
  how many rows fail, and leaves the active population as it was.
"""

from __future__ import annotations

import decimal
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from conftest import ListSource, make_records
from flight.conftest import DATASET, active, build_caches, make_catalog, message, put, serve
from flight.conftest import stream as flight_stream
from polars.testing import assert_frame_equal

import dataset_rt as drt

N = 12
INTEGER_TYPES = [
    pa.int8(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.uint8(),
    pa.uint16(),
    pa.uint32(),
    pa.uint64(),
]
#: What every refusal by type says is valid.
IDENTITY_TYPES = "Int8, Int16, Int32, Int64, UInt8, UInt16, UInt32 or UInt64"
WEIGHT_TYPES = "Float16, Float32, Float64, or an integer type"
LIMIT = 2**53  # integer weights are taken up to this magnitude


# -- fixtures and helpers ----------------------------------------------------------


@pytest.fixture(scope="module")
def cache_path(runtime: drt.DatasetRuntime, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("column_types")
    (result,) = runtime.write_cache(
        ListSource("types", make_records(N)),
        base,
        writer_config=drt.WriterConfig(show_progress=False),
    )
    assert isinstance(result, drt.CacheWriteSuccess), result
    return result.path


@pytest.fixture
def opened(runtime: drt.DatasetRuntime, cache_path: Path) -> tuple[drt.CachedDataset, pa.Table]:
    """A dataset read in order (so its stream is the table's rows), and the
    default table. The active population is not the default one, so a refusal
    that touched it would show."""
    dataset = runtime.cached_dataset(
        [cache_path], reader_config=drt.ReaderConfig(seed=5, shuffle=False)
    )
    base = dataset.get_metadata()
    dataset.update_metadata(base.reverse().with_columns(pl.lit(2.0).alias("weight")))
    return dataset, pa.table(base)


def retyped(table: pa.Table | pl.DataFrame, column: str, array: pa.Array) -> pa.Table:
    """``table`` (as pyarrow) with ``column`` replaced by ``array``."""
    table = pa.table(table)
    return table.set_column(table.schema.get_field_index(column), column, array)


def served(dataset: drt.CachedDataset) -> pa.Table:
    """One epoch of the stream without payloads: identities and weights as streamed."""
    return dataset.stream(columns=["weight"], payload=False).read_all()


# -- what is accepted --------------------------------------------------------------


@pytest.mark.parametrize("dtype", INTEGER_TYPES, ids=str)
def test_sample_id_of_every_integer_type_serves_the_values_supplied(
    opened: tuple[drt.CachedDataset, pa.Table], dtype: pa.DataType
) -> None:
    dataset, base = opened
    order = [7, 3, 11, 0, 5, 1, 10, 2, 9, 4, 8, 6]
    rows = pl.DataFrame(base)[order]  # (pyarrow cannot take from Polars' string views)
    dataset.update_metadata(retyped(rows, "sample_id", pa.array(order, dtype)))

    stream = served(dataset)
    assert stream.schema.field("sample_id").type == pa.uint64()
    assert stream["sample_id"].to_pylist() == order
    assert [s.sample_id for s in dataset] == order
    returned = pa.table(dataset.get_metadata())
    assert returned.schema.field("sample_id").type == dtype  # kept as supplied
    assert returned["sample_id"].to_pylist() == order


#: (id, type, values) of weight columns that must be served exactly, as Float64.
EXACT_WEIGHTS: list[tuple[str, pa.DataType, list[Any]]] = [
    ("float64", pa.float64(), [0.1 * (i + 1) for i in range(N)]),
    # Float32's 0.1 is 0.100000001490116...: served as that Float64, not as 0.1.
    ("float32", pa.float32(), [0.1, 1.5, 3.0e38, 1.0e-38] * 3),
    ("float16", pa.float16(), [0.5, 1.0, 3.25, 65504.0] * 3),
    *[(str(t), t, [1, 2, 3, 100] * 3) for t in INTEGER_TYPES],
    ("int64-up-to-2^53", pa.int64(), [LIMIT, 1, LIMIT - 1, 7] * 3),
    ("uint64-up-to-2^53", pa.uint64(), [LIMIT, 2] * 6),
]


@pytest.mark.parametrize(
    ("dtype", "values"),
    [(t, v) for _, t, v in EXACT_WEIGHTS],
    ids=[i for i, _, _ in EXACT_WEIGHTS],
)
def test_weight_types_serve_exactly_the_values_supplied(
    opened: tuple[drt.CachedDataset, pa.Table], dtype: pa.DataType, values: list[Any]
) -> None:
    dataset, base = opened
    supplied = pa.array(values, type=pa.float32() if dtype == pa.float16() else dtype)
    supplied = supplied.cast(dtype)  # pyarrow builds no Float16 from Python floats
    dataset.update_metadata(retyped(base, "weight", supplied))

    stream = served(dataset)
    assert stream.schema.field("weight").type == pa.float64()
    # Python's float() of a Float16, a Float32 or an integer up to 2^53 is exact.
    assert stream["weight"].to_pylist() == [float(w) for w in supplied.to_pylist()]
    if pa.types.is_integer(dtype):
        assert [int(w) for w in stream["weight"].to_pylist()] == values
    returned = pa.table(dataset.get_metadata())
    assert returned.schema.field("weight").type == dtype  # kept as supplied
    assert returned["weight"].combine_chunks().equals(supplied)


def test_polars_int64_identities_and_weights_keep_working(
    opened: tuple[drt.CachedDataset, pa.Table],
) -> None:
    """What Polars users write most: Int64 ids and weights (built from Python ints)."""
    dataset, base = opened
    table = pl.DataFrame(base).with_columns(
        pl.Series("sample_id", list(range(N))),
        pl.Series("weight", [1 + i % 3 for i in range(N)]),
    )
    assert table.schema["sample_id"] == table.schema["weight"] == pl.Int64
    dataset.update_metadata(table)
    assert_frame_equal(dataset.get_metadata(), table)
    stream = served(dataset)
    assert stream["sample_id"].to_pylist() == list(range(N))
    assert stream["weight"].to_pylist() == [float(1 + i % 3) for i in range(N)]


# -- what is refused ---------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """A column that must be refused: by its type (``row`` None: the message names
    the type, as Arrow spells it, and the valid types) or by its values."""

    id: str
    column: str
    array: Callable[[], pa.Array]
    words: tuple[str, ...]
    row: int | None = None
    count: int | None = None


IDS = list(range(N))
ONES = [1] * N


def _decimals(values: list[int]) -> pa.Array:
    return pa.array([decimal.Decimal(v) for v in values], pa.decimal128(20, 0))


def _floats(dtype: pa.DataType) -> Callable[[], pa.Array]:
    """The identities 0..N-1 as whole numbers of a float type."""
    return lambda: pa.array(IDS, pa.float64()).cast(dtype)


REFUSALS = [
    # Identities of other types: floats (even of whole numbers), decimals, ...
    *[
        Refusal(
            f"sample_id-{name}",
            "sample_id",
            _floats(t),
            (name,),
        )
        for t, name in (
            (pa.float16(), "Float16"),
            (pa.float32(), "Float32"),
            (pa.float64(), "Float64"),
        )
    ],
    Refusal("sample_id-decimal", "sample_id", lambda: _decimals(IDS), ("Decimal128",)),
    Refusal("sample_id-string", "sample_id", lambda: pa.array([str(i) for i in IDS]), ("Utf8",)),
    Refusal("sample_id-bool", "sample_id", lambda: pa.array([i % 2 == 0 for i in IDS]), ("Bool",)),
    Refusal("sample_id-null-type", "sample_id", lambda: pa.nulls(N), ("Null",)),
    Refusal(
        "sample_id-dictionary",
        "sample_id",
        lambda: pa.array(IDS, pa.uint64()).dictionary_encode(),
        ("Dictionary",),
    ),
    Refusal("cache_id-float64", "cache_id", lambda: pa.array([1.0] * N), ("Float64",)),
    # Negative identities, named by row and count.
    Refusal(
        "sample_id-int8-negative",
        "sample_id",
        lambda: pa.array([*IDS[:3], -1, *IDS[4:10], -128, IDS[11]], pa.int8()),
        ("non-negative", "holds -1"),
        row=3,
        count=2,
    ),
    Refusal(
        "cache_id-int64-negative",
        "cache_id",
        lambda: pa.array([-(2**63)] * N, pa.int64()),
        ("non-negative", str(-(2**63))),
        row=0,
        count=N,
    ),
    # Weights of other types.
    Refusal("weight-bool", "weight", lambda: pa.array([True] * N), ("Bool",)),
    Refusal("weight-string", "weight", lambda: pa.array(["1.0"] * N), ("Utf8",)),
    Refusal(
        "weight-large-string",
        "weight",
        lambda: pa.array(["1.0"] * N, pa.large_string()),
        ("LargeUtf8",),
    ),
    Refusal("weight-decimal", "weight", lambda: _decimals(ONES), ("Decimal128",)),
    Refusal(
        "weight-dictionary",
        "weight",
        lambda: pa.array([1.0] * N).dictionary_encode(),
        ("Dictionary",),
    ),
    Refusal("weight-date", "weight", lambda: pa.array(ONES, pa.date32()), ("Date32",)),
    Refusal("weight-null-type", "weight", lambda: pa.nulls(N), ("Null",)),
    # Integer weights past 2^53, named by row and count (2^60 is exact in Float64,
    # but the rule is a range).
    Refusal(
        "weight-int64-past-2^53",
        "weight",
        lambda: pa.array([1, 1, LIMIT + 1, 1, 2**60, *ONES[5:]], pa.int64()),
        (f"holds {LIMIT + 1}", "2\\^53"),
        row=2,
        count=2,
    ),
    Refusal(
        "weight-uint64-max",
        "weight",
        lambda: pa.array([*ONES[:-1], 2**64 - 1], pa.uint64()),
        (f"holds {2**64 - 1}",),
        row=N - 1,
        count=1,
    ),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[c.id for c in REFUSALS])
def test_refused_columns_name_the_fault_and_change_nothing(
    opened: tuple[drt.CachedDataset, pa.Table], case: Refusal
) -> None:
    dataset, base = opened
    before = dataset.get_metadata(), served(dataset), len(dataset)

    with pytest.raises(drt.InvalidPopulationError) as info:
        dataset.update_metadata(retyped(base, case.column, case.array()))

    error = info.value
    text = str(error)
    assert error.column == case.column, text
    assert f"'{case.column}'" in text, text
    if case.row is None:
        assert (error.row, error.count) == (None, None), text
        assert (WEIGHT_TYPES if case.column == "weight" else IDENTITY_TYPES) in text, text
    else:
        assert (error.row, error.count) == (case.row, case.count), text
        assert re.search(rf"\brow {case.row}\b", text), text
    for word in case.words:
        assert re.search(word, text), (word, text)

    assert_frame_equal(dataset.get_metadata(), before[0])
    assert served(dataset) == before[1]
    assert len(dataset) == before[2]


# -- over Flight -------------------------------------------------------------------


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory, runtime: drt.DatasetRuntime) -> tuple[Path, ...]:
    return build_caches(tmp_path_factory.mktemp("toy"), runtime)


@pytest.fixture
def raw(
    tmp_path: Path, runtime: drt.DatasetRuntime, toy: tuple[Path, ...]
) -> Iterator[flight.FlightClient]:
    with (
        serve(make_catalog(tmp_path, runtime, caches=toy)) as server,
        flight.connect(server.location) as client,
    ):
        yield client


def test_do_put_holds_the_same_rule(raw: flight.FlightClient) -> None:
    metadata = {"dataset": DATASET, "metadata": True}
    base = flight_stream(raw, metadata).slice(0, 20)
    sample_ids = base["sample_id"].to_pylist()
    heavy = [LIMIT - i for i in range(20)]  # exact in Float64, far past Int32
    narrow = retyped(base, "sample_id", pa.array(sample_ids, pa.int32()))
    narrow = retyped(narrow, "weight", pa.array(heavy, pa.int64()))

    answer = put(raw, narrow)
    assert active(raw)["population"] == answer["population"]
    returned = flight_stream(raw, metadata)
    assert returned.schema.field("sample_id").type == pa.int32()
    assert returned["weight"].to_pylist() == heavy
    epoch = {"dataset": DATASET, "seed": 1, "epoch": 0, "shuffle": False, "columns": ["weight"]}
    streamed = flight_stream(raw, epoch)
    assert streamed.schema.field("sample_id").type == pa.uint64()
    assert streamed["sample_id"].to_pylist() == sample_ids
    assert streamed["weight"].to_pylist() == [float(w) for w in heavy]

    # A weight Float64 would round, and identities of a float type: refused with
    # INVALID_ARGUMENT, and the population put above stays active.
    rounded = retyped(narrow, "weight", pa.array([*heavy[:4], LIMIT + 1, *heavy[5:]]))
    with pytest.raises(pa.ArrowInvalid) as info:
        put(raw, rounded)
    text = message(info.value)
    for words in ("'weight'", "row 4", f"holds {LIMIT + 1}"):
        assert words in text, text

    floats = retyped(narrow, "sample_id", pa.array(sample_ids, pa.float64()))
    with pytest.raises(pa.ArrowInvalid) as info:
        put(raw, floats)
    text = message(info.value)
    for words in ("'sample_id'", "Float64", IDENTITY_TYPES):
        assert words in text, text

    assert active(raw)["population"] == answer["population"]
    assert flight_stream(raw, metadata) == returned
    assert flight_stream(raw, epoch) == streamed
