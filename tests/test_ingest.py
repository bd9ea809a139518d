"""Columnar ingest: Arrow and Parquet data written with no Python object per record.

The same records written as `CacheInput`s and as columns give the same cache,
byte for byte; bad columnar input fails as the iterable path fails (the same
error classes) and leaves no cache.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ListSource, make_records
from terminal import on_a_terminal

import dataset_rt as drt
from dataset_rt import _native

NAME = "columns"
COLUMNS = ("label", "score", "flag", "name")
SMALL_SHARDS = drt.WriterConfig(max_shard_bytes=600, show_progress=False)
ZSTD_SHARDS = drt.WriterConfig(
    max_shard_bytes=600,
    show_progress=False,
    shard_compression=drt.ShardCompression(algo="zstd", level=3),
)


def _table(records: list[drt.CacheInput], payload: str = "data") -> pa.Table:
    """The records as a table: the payload column first, then the metadata in key order."""
    columns: dict[str, Any] = {payload: pa.array([r.data for r in records], pa.binary())}
    for key in COLUMNS:
        columns[key] = [r.metadata[key] for r in records]
    return pa.table(columns)


def _files(cache: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(cache.iterdir())}


def _iterable_cache(
    runtime: drt.DatasetRuntime,
    base: Path,
    records: list[drt.CacheInput],
    config: drt.WriterConfig = SMALL_SHARDS,
) -> Path:
    [result] = runtime.write_cache(ListSource(NAME, records), base, writer_config=config)
    assert isinstance(result, drt.CacheWriteSuccess), result
    return result.path


def _arrow_cache(
    runtime: drt.DatasetRuntime,
    base: Path,
    data: object,
    config: drt.WriterConfig = SMALL_SHARDS,
    **keywords: Any,
) -> Path:
    result = runtime.write_arrow(
        data, base, name=NAME, payload_column="data", writer_config=config, **keywords
    )
    assert isinstance(result, drt.CacheWriteSuccess), result
    return result.path


def _assert_same_cache(ours: Path, theirs: Path) -> None:
    ours_info, theirs_info = _native.inspect_cache(str(ours)), _native.inspect_cache(str(theirs))
    assert ours_info.cache_id == theirs_info.cache_id
    assert len(ours_info.shards) > 1, "several shards"
    assert _files(ours) == _files(theirs)


@pytest.mark.parametrize("config", [SMALL_SHARDS, ZSTD_SHARDS], ids=["none", "zstd"])
def test_a_table_writes_the_cache_of_the_same_records(
    runtime: drt.DatasetRuntime, tmp_path: Path, config: drt.WriterConfig
) -> None:
    records = make_records(200)
    expected = _iterable_cache(runtime, tmp_path / "iterable", records, config)
    # Batches of 7 rows: records cross batch and chunk boundaries.
    written = _arrow_cache(runtime, tmp_path / "arrow", _table(records), config, batch_size=7)
    _assert_same_cache(written, expected)


def test_a_parquet_file_and_a_parquet_directory_write_the_same_cache(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    records = make_records(300)
    expected = _iterable_cache(runtime, tmp_path / "iterable", records)
    table = _table(records)
    pq.write_table(table, tmp_path / "one.parquet", row_group_size=50)
    _assert_same_cache(_arrow_cache(runtime, tmp_path / "file", tmp_path / "one.parquet"), expected)

    directory = tmp_path / "parts"
    directory.mkdir()
    for part, start in enumerate(range(0, 300, 120)):
        pq.write_table(table.slice(start, 120), directory / f"part-{part}.parquet")
    _assert_same_cache(
        _arrow_cache(runtime, tmp_path / "directory", str(directory), batch_size=33), expected
    )


def test_polars_frames_batches_and_readers_write_the_same_cache(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    records = make_records(120)
    expected = _iterable_cache(runtime, tmp_path / "iterable", records)
    table = _table(records)
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    sources: dict[str, object] = {
        "polars": frame,  # exports binary_view and string_view columns
        "lazy": frame.lazy(),
        "batches": table.to_batches(max_chunksize=50),
        "reader": table.to_reader(max_chunksize=11),
        "batch": table.combine_chunks().to_batches()[0],
    }
    for kind, data in sources.items():
        _assert_same_cache(_arrow_cache(runtime, tmp_path / kind, data), expected)


def test_other_binary_and_narrower_types_are_the_iterable_types(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    records = [
        drt.CacheInput(data=bytes([i]) * 16, metadata={"n": i, "x": i / 4, "s": f"s{i % 3}"})
        for i in range(64)
    ]
    expected = _iterable_cache(runtime, tmp_path / "iterable", records)
    payloads = [r.data for r in records]
    for payload_type in [pa.large_binary(), pa.binary_view(), pa.binary(16)]:
        table = pa.table(
            {
                "data": pa.array(payloads, payload_type),
                "n": pa.array(range(64), pa.uint8()),
                "x": pa.array([i / 4 for i in range(64)], pa.float32()),
                "s": pa.array([f"s{i % 3}" for i in range(64)]).dictionary_encode(),
            }
        )
        written = _arrow_cache(runtime, tmp_path / str(payload_type), table)
        _assert_same_cache(written, expected)


def _native_errors(
    runtime: drt.DatasetRuntime, tmp_path: Path, records: list[Any], table: pa.Table
) -> tuple[Exception, Exception]:
    """What each path raises for the same bad records (the engine's exceptions)."""
    options = drt.WriterConfig(show_progress=False).options
    with pytest.raises(drt.DatasetRTError) as iterable:
        _native.write_cache(runtime.native, iter(records), str(tmp_path / "i"), NAME, options)
    with pytest.raises(drt.DatasetRTError) as columnar:
        _native.write_arrow(runtime.native, table, str(tmp_path / "c"), NAME, "data", options)
    for base in ("i", "c"):
        assert not (tmp_path / base).exists() or not list((tmp_path / base).iterdir())
    return iterable.value, columnar.value


def test_bad_records_raise_what_the_iterable_path_raises(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    cases: list[tuple[list[Any], pa.Table, type[Exception], str]] = [
        # A null payload.
        (
            [(b"a", {"n": 1}), (None, {"n": 2})],
            pa.table({"data": pa.array([b"a", None]), "n": [1, 2]}),
            drt.SourceError,
            "record 1: the payload column 'data' is null",
        ),
        # A payload that is not bytes.
        (
            [("text", {"n": 1})],
            pa.table({"data": ["text"], "n": [1]}),
            drt.SourceError,
            "the payload column 'data' is Utf8; it must be binary",
        ),
        # A null metadata value.
        (
            [(b"a", {"n": 1}), (b"b", {"n": None})],
            pa.table({"data": pa.array([b"a", b"b"]), "n": [1, None]}),
            drt.SourceError,
            "record 1: metadata 'n' is null",
        ),
        # A metadata type neither path stores.
        (
            [(b"a", {"n": [1, 2]})],
            pa.table({"data": pa.array([b"a"]), "n": [[1, 2]]}),
            drt.SourceError,
            "metadata column 'n' is List",
        ),
        # An unsigned value past the signed 64-bit range.
        (
            [(b"a", {"n": 2**64 - 1})],
            pa.table({"data": pa.array([b"a"]), "n": pa.array([2**64 - 1], pa.uint64())}),
            drt.SourceError,
            "record 0: metadata 'n' is an int outside the 64-bit signed range",
        ),
        # A reserved column name.
        (
            [(b"a", {"weight": 1})],
            pa.table({"data": pa.array([b"a"]), "weight": [1]}),
            drt.SchemaMismatchError,
            "record 0: metadata key 'weight' is reserved",
        ),
        # An empty source.
        (
            [],
            pa.table({"data": pa.array([], pa.binary()), "n": pa.array([], pa.int64())}),
            drt.SourceError,
            "cache source yielded no samples",
        ),
    ]
    for number, (records, table, error_class, message) in enumerate(cases):
        iterable, columnar = _native_errors(runtime, tmp_path / str(number), records, table)
        assert type(iterable) is type(columnar) is error_class, (iterable, columnar)
        assert message in str(columnar), columnar


def test_a_missing_payload_column_names_the_columns(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    table = pa.table({"bytes": pa.array([b"a"]), "n": [1]})
    result = runtime.write_arrow(table, tmp_path, name=NAME, payload_column="data")
    assert isinstance(result, drt.CacheWriteError)
    assert result.message == (
        "the payload column 'data' is not in the data; its columns are ['bytes', 'n']"
    )
    assert list(tmp_path.iterdir()) == []


def test_bad_arguments_fail_as_write_cache_fails(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    table = _table(make_records(3))
    # A bad name is a failed write, reported as write_cache reports it.
    [iterable] = runtime.write_cache(ListSource("../up", make_records(3)), tmp_path)
    columnar = runtime.write_arrow(table, tmp_path, name="../up", payload_column="data")
    assert isinstance(columnar, drt.CacheWriteError)
    assert columnar == iterable
    unknown = runtime.write_arrow(object(), tmp_path, name=NAME, payload_column="data")
    assert isinstance(unknown, drt.CacheWriteError)
    assert unknown.message.startswith("data must be a Parquet path")
    missing = runtime.write_arrow(tmp_path / "nothing", tmp_path, name=NAME, payload_column="d")
    assert isinstance(missing, drt.CacheWriteError)
    assert missing.message.endswith(
        "nothing does not exist; expected a Parquet file or a directory of Parquet files"
    )
    with pytest.raises(drt.InvalidArgumentError, match="writer_config"):
        runtime.write_arrow(
            table,
            tmp_path,
            name=NAME,
            payload_column="data",
            writer_config=None,  # type: ignore[arg-type]
        )
    # An existing cache is never overwritten: the same records reuse it, other
    # records are refused (tests/test_existing.py, for every entry point).
    path = _arrow_cache(runtime, tmp_path, table)
    again = runtime.write_arrow(table, tmp_path, name=NAME, payload_column="data")
    assert again == drt.CacheWriteSuccess(NAME, path)
    other = runtime.write_arrow(table.slice(1), tmp_path, name=NAME, payload_column="data")
    assert isinstance(other, drt.CacheWriteError)
    assert "already exists and holds other records" in other.message


def test_a_failed_ingest_leaves_no_cache(runtime: drt.DatasetRuntime, tmp_path: Path) -> None:
    table = _table(make_records(500))

    def batches() -> Iterator[pa.RecordBatch]:
        yield from table.to_batches(max_chunksize=100)[:3]
        raise RuntimeError("the source broke")

    reader = pa.RecordBatchReader.from_batches(table.schema, batches())
    result = runtime.write_arrow(reader, tmp_path, name=NAME, payload_column="data")
    assert isinstance(result, drt.CacheWriteError)
    assert "the source broke" in result.message
    assert list(tmp_path.iterdir()) == []

    # A bad value in the last batch, after 400 records reached the shards.
    payloads = [*table.column("data").to_pylist()[:-1], None]
    bad = table.set_column(0, "data", pa.array(payloads, pa.binary()))
    result = runtime.write_arrow(bad, tmp_path, name=NAME, payload_column="data", batch_size=100)
    assert isinstance(result, drt.CacheWriteError)
    assert result.message.startswith("record 499: the payload column 'data' is null")
    assert list(tmp_path.iterdir()) == []


def test_from_arrow_opens_the_cache_and_reuses_it(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    records = make_records(40)
    config = drt.ReaderConfig(seed=3, shuffle=False)
    result = runtime.from_arrow(
        _table(records), tmp_path, name=NAME, payload_column="data", reader_config=config
    )
    assert isinstance(result, drt.CacheSourcesDatasetSuccess), result
    samples = list(result.dataset)
    assert [s.data for s in samples] == [r.data for r in records]
    assert [s.metadata["name"] for s in samples] == [r.metadata["name"] for r in records]
    # The cache exists: the data is not read again (here it could not be).
    again = runtime.from_arrow(
        None, tmp_path, name=NAME, payload_column="data", reader_config=config
    )
    assert isinstance(again, drt.CacheSourcesDatasetSuccess), again
    failed = runtime.from_arrow(
        pa.table({"data": [1]}), tmp_path, name="other", payload_column="data", reader_config=config
    )
    assert isinstance(failed, drt.CacheSourcesDatasetError)
    assert "must be binary" in failed.message


#: ``metadata.arrow`` holds a record batch per 2^16 records (issue 47): past it, a
#: cache has several; up to it, one, as every cache had before.
METADATA_BATCH_ROWS = 1 << 16
#: The ``cache_id`` of `_many_rows`'s table (3 * 2^16 + 1000 rows), as the writer of
#: one metadata batch gave it (measured with that build): batches do not enter it.
MANY_ROWS_CACHE_ID = 1016706060418032709


def _many_rows(rows: int) -> pa.Table:
    """``rows`` records of 4 bytes and four metadata columns, built without Python rows."""
    ids = np.arange(rows, dtype=np.int64)
    payloads = (ids * 2654435761 % (1 << 32)).astype("<u4").tobytes()
    offsets = np.arange(0, (rows + 1) * 4, 4, dtype=np.int32)
    data = pa.Array.from_buffers(
        pa.binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(payloads)]
    )
    names = pa.DictionaryArray.from_arrays(
        pa.array(ids % 97, pa.int32()), pa.array([f"n{i}" for i in range(97)])
    )
    return pa.table(
        {
            "data": data,
            "label": ids * 3 - 7,
            "score": ids / 8.0,
            "flag": ids % 3 == 0,
            "name": names,
        }
    )


def test_an_import_past_one_metadata_batch_is_the_cache_of_before(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    rows = 3 * METADATA_BATCH_ROWS + 1000
    table = _many_rows(rows)
    pq.write_table(table, tmp_path / "many.parquet", row_group_size=50_000)
    config = drt.WriterConfig(show_progress=False)
    path = _arrow_cache(runtime, tmp_path / "cache", tmp_path / "many.parquet", config)
    info = _native.inspect_cache(str(path))
    assert (info.cache_id, info.record_count) == (MANY_ROWS_CACHE_ID, rows)

    # The file: an Arrow IPC file of four batches, together the table's metadata.
    types = [("label", pa.int64()), ("score", pa.float64()), ("flag", pa.bool_())]
    expected = table.drop_columns(["data"]).cast(pa.schema([*types, ("name", pa.string())]))
    with pa.ipc.open_file(path / "metadata.arrow") as reader:
        batches = [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
        assert batches == [METADATA_BATCH_ROWS] * 3 + [1000]
        stored = reader.read_all()
    assert stored.column_names == ["sample_id", *expected.column_names]
    assert np.array_equal(stored["sample_id"].to_numpy(), np.arange(rows, dtype=np.uint64))
    # (Stored columns are never null, and their fields say so.)
    assert stored.drop_columns(["sample_id"]).cast(expected.schema).equals(expected)

    # The engine's readers: the population, one record, validation by sample id.
    dataset = runtime.cached_dataset([path], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    frame = dataset.get_metadata()
    assert frame.columns == ["cache_id", "sample_id", "flag", "label", "name", "score", "weight"]
    assert np.array_equal(frame["sample_id"].to_numpy(), np.arange(rows, dtype=np.uint64))
    for column in expected.column_names:
        assert (
            frame[column]
            .to_arrow()
            .cast(expected.schema.field(column).type)
            .equals(expected[column].combine_chunks())
        ), column
    for sample_id in (0, METADATA_BATCH_ROWS - 1, METADATA_BATCH_ROWS, rows - 1):
        sample = dataset.get_item(info.cache_id, sample_id)
        assert sample.metadata == {
            "label": sample_id * 3 - 7,
            "score": sample_id / 8.0,
            "flag": sample_id % 3 == 0,
            "name": f"n{sample_id % 97}",
        }
    dataset.update_metadata(frame.reverse())
    wrong = 2 * METADATA_BATCH_ROWS + 5
    changed = frame.with_columns(
        pl.when(pl.col("sample_id") == wrong).then(0).otherwise(pl.col("label")).alias("label")
    )
    with pytest.raises(drt.InvalidPopulationError) as error:
        dataset.update_metadata(changed)
    assert (error.value.column, error.value.row, error.value.count) == ("label", wrong, 1)


def _import_command(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "dataset_rt", "import", *map(str, args)]


def _cli(*args: str | Path) -> tuple[int, str, str]:
    done = subprocess.run(_import_command(*args), capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout, done.stderr


def test_the_import_command_writes_the_cache(runtime: drt.DatasetRuntime, tmp_path: Path) -> None:
    records = make_records(100)
    expected = _iterable_cache(runtime, tmp_path / "iterable", records, drt.WriterConfig())
    pq.write_table(_table(records, payload="image"), tmp_path / "data.parquet")
    code, out, err = _cli(
        tmp_path / "data.parquet", "--payload-column", "image", "--name", NAME,
        "--base-dir", tmp_path / "cli", "--batch-size", "16",
    )  # fmt: skip
    assert (code, err) == (0, ""), err  # no progress bar without a terminal
    info = _native.inspect_cache(str(tmp_path / "cli" / NAME))
    assert out.startswith(f"ok: {NAME} -> ")
    assert f"100 records, 1.6 KiB, cache_id {info.cache_id}" in out
    assert _files(tmp_path / "cli" / NAME) == _files(expected)


def test_the_import_summary_is_read_from_the_manifest_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The import's last line comes from the manifest it just published: opening the
    cache again mapped and hashed index.bin and metadata.arrow (5.5 GiB of RSS at
    10^8 rows). A reused cache is checked once (`check_cache`) and not opened again."""
    from dataset_rt import cli

    opened: list[str] = []
    inspect, check = _native.inspect_cache, _native.check_cache

    def spy_inspect(path: str) -> _native.CacheInfo:
        opened.append(f"inspect {path}")
        return inspect(path)

    def spy_check(path: str, full: bool) -> None:
        opened.append(f"check {path}")
        check(path, full)

    monkeypatch.setattr(_native, "inspect_cache", spy_inspect)
    monkeypatch.setattr(_native, "check_cache", spy_check)
    pq.write_table(_table(make_records(100)), tmp_path / "data.parquet")
    arguments = [
        "import", str(tmp_path / "data.parquet"), "--payload-column", "data",
        "--name", NAME, "--base-dir", str(tmp_path),
    ]  # fmt: skip
    assert cli.main(arguments) == 0
    assert opened == [], "the cache was opened after it was written"
    info = inspect(str(tmp_path / NAME))  # opened, checked: the figures printed are its own
    expected = f"100 records, 1.6 KiB, cache_id {info.cache_id}"
    assert capsys.readouterr().out == f"ok: {NAME} -> {tmp_path / NAME}: {expected}\n"
    assert cli.main(arguments) == 0
    assert opened == [f"check {tmp_path / NAME}"], "a reused cache is checked once"
    reused = "reused (it holds these records), "
    assert capsys.readouterr().out == f"ok: {NAME} -> {tmp_path / NAME}: {reused}{expected}\n"


def test_the_import_command_draws_progress_on_a_terminal(tmp_path: Path) -> None:
    pq.write_table(_table(make_records(3000)), tmp_path / "data.parquet")
    command = _import_command(
        tmp_path / "data.parquet", "--payload-column", "data", "--name", NAME,
        "--base-dir", tmp_path,
    )  # fmt: skip
    err = on_a_terminal(command)  # asserts the exit code 0, showing what was drawn
    assert f"writing {NAME}" in err
    assert "3000/3000 records" in err
    assert "MiB" in err


def test_the_import_command_exits_2_on_bad_input(tmp_path: Path) -> None:
    pq.write_table(_table(make_records(5)), tmp_path / "data.parquet")
    data = tmp_path / "data.parquet"
    cases = [
        ((tmp_path / "missing.parquet", "--payload-column", "data", "--name", "a"), "not exist"),
        ((data, "--payload-column", "image", "--name", "a"), "'image' is not in the data"),
        ((data, "--payload-column", "name", "--name", "a"), "'name' is Utf8"),
        ((data, "--payload-column", "data", "--name", "../a"), "source name"),
        ((data, "--payload-column", "data", "--name", "a", "--batch-size", "0"), "must be >= 1"),
    ]
    for arguments, message in cases:
        code, out, err = _cli(*arguments, "--base-dir", tmp_path / "out")
        assert code == 2, (arguments, err)
        assert out == ""
        assert message in err, err
        assert len(err.strip().splitlines()) == 1 or "usage:" in err, err
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []
    # An existing cache of other records is refused, and left as it is
    # (tests/test_existing.py: the same records reuse it).
    assert _cli(data, "--payload-column", "data", "--name", "a", "--base-dir", tmp_path)[0] == 0
    pq.write_table(_table(make_records(5, seed=1)), tmp_path / "other.parquet")
    other = tmp_path / "other.parquet"
    code, _, err = _cli(other, "--payload-column", "data", "--name", "a", "--base-dir", tmp_path)
    assert code == 2
    assert "already exists and holds other records" in err
