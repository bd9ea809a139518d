"""Writing a cache that exists: one rule, every entry point (`dataset_rt.existing`).

- The writing calls (`write_cache`, `write_arrow` from a table, a Parquet file or a
  reader of unknown length, ``python -m dataset_rt import``) read the records: the
  same records (the same ``cache_id``) reuse the cache and write nothing; other
  records are refused with an error that names the directory and what to do, and
  the cache stays as it was.
- The open-or-write calls (`from_cache_sources`, `ensure_caches`, `from_arrow`,
  ``python -m dataset_rt write``) open an existing cache without reading their
  source: the name stands for the records.
- Every call refuses a damaged existing cache, naming the file, and leaves it alone.
- Writers of the same records that meet both succeed; an interrupted write over an
  existing cache leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ListSource, make_records

import dataset_rt as drt
from dataset_rt import _native, cli

NAME = "kept"
QUIET = drt.WriterConfig(show_progress=False)
ZSTD = drt.WriterConfig(
    show_progress=False, shard_compression=drt.ShardCompression(algo="zstd", level=3)
)
READ = drt.ReaderConfig(seed=1, shuffle=False)
COLUMNS = ("label", "score", "flag", "name")

# What the open-or-write test of ``python -m dataset_rt write`` imports by name.
OTHER_RECORDS = ListSource(NAME, make_records(7, seed=5))


def _table(records: list[drt.CacheInput]) -> pa.Table:
    columns: dict[str, Any] = {"data": pa.array([r.data for r in records], pa.binary())}
    for key in COLUMNS:
        columns[key] = [r.metadata[key] for r in records]
    return pa.table(columns)


# An outcome: ("ok", the cache's path) or ("error", the message).
Outcome = tuple[str, Any]
Writer = Callable[[drt.DatasetRuntime, Path, list[drt.CacheInput]], Outcome]


def _result(result: drt.CacheWriteResult) -> Outcome:
    if isinstance(result, drt.CacheWriteSuccess):
        assert result.source_name == NAME
        return "ok", result.path
    return "error", result.message


def _write_cache(runtime: drt.DatasetRuntime, base: Path, records: list[drt.CacheInput]) -> Outcome:
    [result] = runtime.write_cache(ListSource(NAME, records), base, writer_config=QUIET)
    return _result(result)


def _write_table(runtime: drt.DatasetRuntime, base: Path, records: list[drt.CacheInput]) -> Outcome:
    return _result(
        runtime.write_arrow(
            _table(records), base, name=NAME, payload_column="data", writer_config=QUIET
        )
    )


def _parquet(base: Path, records: list[drt.CacheInput]) -> Path:
    """The records as a Parquet file beside ``base`` (never inside it)."""
    digest = hashlib.sha256(b"".join(bytes(r.data) for r in records)).hexdigest()[:12]
    path = base.parent / f"{base.name}-{digest}.parquet"
    pq.write_table(_table(records), path)
    return path


def _write_parquet(
    runtime: drt.DatasetRuntime, base: Path, records: list[drt.CacheInput]
) -> Outcome:
    path = _parquet(base, records)
    return _result(
        runtime.write_arrow(path, base, name=NAME, payload_column="data", writer_config=QUIET)
    )


def _write_reader(
    runtime: drt.DatasetRuntime, base: Path, records: list[drt.CacheInput]
) -> Outcome:
    """A reader's length is unknown: no count to compare, the records are compared."""
    table = _table(records)
    reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=3))
    return _result(
        runtime.write_arrow(reader, base, name=NAME, payload_column="data", writer_config=QUIET)
    )


def _run_import(base: Path, records: list[drt.CacheInput]) -> tuple[int, str, str]:
    path = _parquet(base, records)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        argv = ["import", str(path), "--payload-column", "data", "--name", NAME]
        code = cli.main([*argv, "--base-dir", str(base)])
    return code, out.getvalue(), err.getvalue()


def _import(runtime: drt.DatasetRuntime, base: Path, records: list[drt.CacheInput]) -> Outcome:
    code, out, err = _run_import(base, records)
    if code == 0:
        assert err == ""
        assert out.startswith(f"ok: {NAME} -> {base / NAME}: ")
        return "ok", base / NAME
    assert code in (1, 2), err  # exit codes: test_the_import_command_exits_2_or_1
    assert out == ""
    assert err.startswith("error: "), err
    assert err.count("\n") == 1, err  # one line, no traceback
    return "error", err.removeprefix("error: ").strip()


WRITERS: dict[str, Writer] = {
    "write_cache": _write_cache,
    "write_arrow-table": _write_table,
    "write_arrow-parquet": _write_parquet,
    "write_arrow-reader": _write_reader,
    "import": _import,
}


def _tree(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``root``: its sha256 and modification time."""
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _entries(base: Path) -> list[str]:
    return sorted(p.name for p in base.iterdir())


@pytest.mark.parametrize("writer", WRITERS.values(), ids=WRITERS.keys())
def test_the_same_records_reuse_the_cache(
    runtime: drt.DatasetRuntime, tmp_path: Path, writer: Writer
) -> None:
    base = tmp_path / "caches"
    records = make_records(12)
    first = writer(runtime, base, records)
    assert first == ("ok", base / NAME)
    before = _tree(base / NAME)

    second = writer(runtime, base, make_records(12))  # equal records, new objects
    assert second == ("ok", base / NAME)
    assert _tree(base / NAME) == before  # nothing written, renamed or touched
    assert _entries(base) == [NAME]  # and no scratch left behind


@pytest.mark.parametrize("change", ["values", "count"])
@pytest.mark.parametrize("writer", WRITERS.values(), ids=WRITERS.keys())
def test_other_records_are_refused_and_the_cache_is_kept(
    runtime: drt.DatasetRuntime, tmp_path: Path, writer: Writer, change: str
) -> None:
    base = tmp_path / "caches"
    assert writer(runtime, base, make_records(12)) == ("ok", base / NAME)
    before = _tree(base / NAME)
    cache_id = _native.inspect_cache(str(base / NAME)).cache_id
    other = make_records(12, seed=3) if change == "values" else make_records(11)

    kind, message = writer(runtime, base, other)

    assert kind == "error"
    assert message.startswith(f"{base / NAME} already exists and holds other records")
    assert f"cache_id {cache_id}, 12 records" in message
    assert f"another name (e.g. {NAME}_v2) or another base directory" in message
    assert f"remove {base / NAME} to write it again" in message
    assert _tree(base / NAME) == before
    assert _entries(base) == [NAME]


@pytest.mark.parametrize("writer", WRITERS.values(), ids=WRITERS.keys())
def test_a_damaged_cache_is_refused_and_left_alone(
    runtime: drt.DatasetRuntime, tmp_path: Path, writer: Writer
) -> None:
    base = tmp_path / "caches"
    records = make_records(12)
    assert writer(runtime, base, records) == ("ok", base / NAME)
    manifest = base / NAME / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:-20])
    before = _tree(base / NAME)

    kind, message = writer(runtime, base, records)

    assert kind == "error"
    assert str(manifest) in message
    assert _tree(base / NAME) == before
    assert _entries(base) == [NAME]


def test_the_import_command_exits_2_or_1(runtime: drt.DatasetRuntime, tmp_path: Path) -> None:
    """Other records are the command's bad input (exit 2, as a bad column is); the
    same records print that the cache was reused (exit 0); a damaged cache is
    damage (exit 1, as `verify` exits on damage)."""
    records = make_records(12)
    assert _run_import(tmp_path, records)[0] == 0
    code, out, _ = _run_import(tmp_path, records)
    assert code == 0
    assert out.startswith(f"ok: {NAME} -> {tmp_path / NAME}: reused (it holds these records), ")
    assert _run_import(tmp_path, make_records(12, seed=3))[0] == 2
    (tmp_path / NAME / "manifest.json").write_text("{}")
    assert _run_import(tmp_path, records)[0] == 1


def test_compression_and_the_writing_path_are_not_part_of_the_identity(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    """A cache written compressed from an iterable is the cache of the same records
    given uncompressed as a table: reused, and it keeps its compression."""
    records = make_records(20, payload_size=256)
    [written] = runtime.write_cache(ListSource(NAME, records), tmp_path, writer_config=ZSTD)
    assert isinstance(written, drt.CacheWriteSuccess), written
    before = _tree(written.path)
    assert _write_table(runtime, tmp_path, records) == ("ok", written.path)
    assert _tree(written.path) == before
    assert _native.inspect_cache(str(written.path)).codec == "zstd"


# -- the open-or-write calls: the name stands for the records ------------------------


def _from_cache_sources(runtime: drt.DatasetRuntime, base: Path, source: ListSource) -> Path:
    result = runtime.from_cache_sources(source, base, reader_config=READ, writer_config=QUIET)
    assert isinstance(result, drt.CacheSourcesDatasetSuccess), result
    [path] = result.dataset.cache_paths
    return Path(path)


def _ensure_caches(runtime: drt.DatasetRuntime, base: Path, source: ListSource) -> Path:
    [result] = runtime.ensure_caches(source, base, writer_config=QUIET)
    assert isinstance(result, drt.CacheWriteSuccess), result
    return result.path


def _from_arrow(runtime: drt.DatasetRuntime, base: Path, source: ListSource) -> Path:
    # The records arrive as a generator of batches: any read of them shows as an iteration.
    def batches() -> Iterator[pa.RecordBatch]:
        yield from _table(list(source)).to_batches()

    table = _table(source.records)
    reader = pa.RecordBatchReader.from_batches(table.schema, batches())
    result = runtime.from_arrow(
        reader, base, name=NAME, payload_column="data", reader_config=READ, writer_config=QUIET
    )
    assert isinstance(result, drt.CacheSourcesDatasetSuccess), result
    [path] = result.dataset.cache_paths
    return Path(path)


def _write_command(runtime: drt.DatasetRuntime, base: Path, source: ListSource) -> Path:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["write", f"{__name__}:OTHER_RECORDS", str(base)])
    assert code == 0
    assert out.getvalue() == f"ok: {NAME} -> {base / NAME}\n"
    return base / NAME


OPENERS: dict[str, Callable[[drt.DatasetRuntime, Path, ListSource], Path]] = {
    "from_cache_sources": _from_cache_sources,
    "ensure_caches": _ensure_caches,
    "from_arrow": _from_arrow,
    "write-command": _write_command,
}


@pytest.mark.parametrize("opener", OPENERS.values(), ids=OPENERS.keys())
def test_open_or_write_calls_reuse_a_cache_without_reading_their_source(
    runtime: drt.DatasetRuntime, tmp_path: Path, opener: Callable[..., Path]
) -> None:
    base = tmp_path / "caches"
    assert _write_cache(runtime, base, make_records(12)) == ("ok", base / NAME)
    before = _tree(base / NAME)
    OTHER_RECORDS.iterations = 0

    assert opener(runtime, base, OTHER_RECORDS) == base / NAME

    assert OTHER_RECORDS.iterations == 0  # the name stands for the records
    assert _tree(base / NAME) == before
    assert _entries(base) == [NAME]


def test_open_or_write_calls_write_a_missing_cache(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    for label, opener in OPENERS.items():
        OTHER_RECORDS.iterations = 0
        base = tmp_path / label
        assert opener(runtime, base, OTHER_RECORDS) == base / NAME
        assert OTHER_RECORDS.iterations == 1, label
        assert _native.inspect_cache(str(base / NAME)).record_count == 7


# -- writers that meet ---------------------------------------------------------------


def test_two_writers_of_the_same_new_cache_both_succeed(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    """The rule is the engine's, at publication: two writers of the same records
    that start before either has published both succeed (the second keeps the
    first's cache), where the second used to fail with "already exists"."""
    results: list[drt.CacheWriteResult] = []

    def write() -> None:
        [result] = runtime.write_cache(
            ListSource(NAME, make_records(400)), tmp_path, writer_config=QUIET
        )
        results.append(result)

    threads = [threading.Thread(target=write) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert results == [drt.CacheWriteSuccess(NAME, tmp_path / NAME)] * 2
    assert _entries(tmp_path) == [NAME]


class Interrupted(ListSource):
    def __iter__(self) -> Iterator[drt.CacheInput]:
        yield from self.records[:5]
        raise KeyboardInterrupt


def test_an_interrupted_comparison_leaves_nothing_behind(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    records = make_records(12)
    assert _write_cache(runtime, tmp_path, records) == ("ok", tmp_path / NAME)
    before = _tree(tmp_path / NAME)
    with pytest.raises(KeyboardInterrupt):
        runtime.write_cache(Interrupted(NAME, records), tmp_path, writer_config=QUIET)
    assert _entries(tmp_path) == [NAME]
    assert _tree(tmp_path / NAME) == before
