"""Writing, reusing and reading immutable caches (`write_cache`, `from_cache_sources`)."""

from __future__ import annotations

import array
import hashlib
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import ListSource, make_records, write
from pydantic import ValidationError

import dataset_rt as drt

QUIET = drt.WriterConfig(show_progress=False)
READ = drt.ReaderConfig(seed=7, shuffle=False)


# -- helpers ----------------------------------------------------------------------


def tree_digest(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root`` (directories included by name)."""
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "<dir>"
    return out


def partials(base: Path) -> list[str]:
    """Temporary directories of interrupted or failed writes under ``base``."""
    if not base.exists():
        return []
    return sorted(p.name for p in base.iterdir() if ".partial-" in p.name)


def cache_id_of(runtime: drt.DatasetRuntime, path: Path) -> int:
    ids = runtime.cached_dataset([path], reader_config=READ).get_metadata()["cache_id"].unique()
    assert len(ids) == 1
    return int(ids[0])


def manifest_of(path: Path) -> dict[str, Any]:
    return json.loads((path / "manifest.json").read_text())["manifest"]  # type: ignore[no-any-return]


def read_all(runtime: drt.DatasetRuntime, path: Path, n: int) -> list[bytes]:
    dataset = runtime.cached_dataset([path], reader_config=READ)
    cache_id = cache_id_of(runtime, path)
    return [dataset.get_item(cache_id, i).data for i in range(n)]


class RaisingSource:
    """Yields ``good`` records, then raises."""

    def __init__(self, name: str, good: int) -> None:
        self.name = name
        self.good = good

    def __iter__(self) -> Iterator[drt.CacheInput]:
        yield from make_records(self.good, payload_size=64)
        raise RuntimeError("the source broke mid-way")


class NotIterable:
    def __init__(self, name: str) -> None:
        self.name = name

    def __iter__(self) -> Iterator[drt.CacheInput]:
        raise TypeError(f"{self.name} cannot be iterated")


# -- write_cache ------------------------------------------------------------------


def test_a_single_good_source_round_trips(runtime: drt.DatasetRuntime, tmp_path: Path) -> None:
    records = make_records(50)
    (result,) = runtime.write_cache(ListSource("one", records), tmp_path, writer_config=QUIET)
    assert result == drt.CacheWriteSuccess("one", tmp_path / "one")
    assert read_all(runtime, result.path, 50) == [r.data for r in records]
    assert partials(tmp_path) == []


FAILING_SOURCES: list[tuple[Any, str]] = [
    (RaisingSource("raises", good=100), "the source broke mid-way"),
    (ListSource("not_input", [*make_records(3), 42]), "record 3"),  # type: ignore[list-item]
    (
        ListSource("bad_type", [drt.CacheInput(b"x", {"label": [1, 2]})]),
        "label",
    ),
    (
        ListSource("missing_key", [*make_records(20), drt.CacheInput(b"x", {"label": 1})]),
        "record 20",
    ),
    (
        ListSource(
            "extra_key",
            [*make_records(2), drt.CacheInput(b"x", {**make_records(1)[0].metadata, "extra": 1})],
        ),
        "extra",
    ),
    (
        ListSource("changed_type", [*make_records(2), drt.CacheInput(b"x", {"label": "a"})]),
        "label",
    ),
    (ListSource("reserved", [drt.CacheInput(b"x", {"weight": 2.0})]), "weight"),
    (ListSource("reserved_late", [drt.CacheInput(b"x", {"sample_id": 2})]), "sample_id"),
    (ListSource("str_data", [drt.CacheInput("text", {"label": 1})]), "bytes"),  # type: ignore[arg-type]
    (ListSource("list_metadata", [drt.CacheInput(b"x", [("label", 1)])]), "dict"),  # type: ignore[arg-type]
    (ListSource("int_key", [drt.CacheInput(b"x", {1: 1})]), "str"),  # type: ignore[dict-item]
    (ListSource("huge_int", [drt.CacheInput(b"x", {"label": 2**70})]), "label"),
    (NotIterable("not_iterable"), "not_iterable"),
    (ListSource("empty", []), "yielded no samples"),
    (ListSource("../x", make_records(3)), "../x"),
    (ListSource("a/b", make_records(3)), "a/b"),
    (ListSource(".hidden", make_records(3)), ".hidden"),
    (ListSource("", make_records(3)), "empty"),
]


def test_each_failing_source_is_reported_and_never_stops_the_others(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    base = tmp_path / "base"
    first, last = make_records(30, seed=1), make_records(30, seed=2)
    sources: list[Any] = [ListSource("first", first)]
    for source, _ in FAILING_SOURCES:
        sources += [source, ListSource(f"after_{len(sources)}", make_records(5, seed=len(sources)))]
    sources.append(ListSource("last", last))

    results = runtime.write_cache(sources, base, writer_config=QUIET)

    assert [r.source_name for r in results] == [s.name for s in sources]
    failing = {id(s): hint for s, hint in FAILING_SOURCES}
    for source, result in zip(sources, results, strict=True):
        if id(source) in failing:
            assert isinstance(result, drt.CacheWriteError), result
            assert failing[id(source)] in result.message, result.message
        else:
            assert result == drt.CacheWriteSuccess(source.name, base / source.name)
    assert read_all(runtime, base / "first", 30) == [r.data for r in first]
    assert read_all(runtime, base / "last", 30) == [r.data for r in last]
    # A failed source leaves nothing: no cache directory, no temporary directory.
    good = {s.name for s in sources if id(s) not in failing}
    assert sorted(p.name for p in base.iterdir()) == sorted(good)
    assert not (tmp_path / "x").exists()
    assert partials(base) == []


def test_a_source_failing_after_several_shards_leaves_no_partial_directory(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    config = drt.WriterConfig(show_progress=False, max_shard_bytes=256, prefetch_size=4)
    (result,) = runtime.write_cache(RaisingSource("late", good=300), tmp_path, writer_config=config)
    assert isinstance(result, drt.CacheWriteError)
    assert "RuntimeError" in result.message
    assert list(tmp_path.iterdir()) == []


def test_a_single_source_needs_no_list(runtime: drt.DatasetRuntime, tmp_path: Path) -> None:
    results = runtime.write_cache(
        ListSource("solo", make_records(3)), tmp_path, writer_config=QUIET
    )
    assert results == [drt.CacheWriteSuccess("solo", tmp_path / "solo")]


def test_a_source_without_a_name_is_an_error_for_that_source_only(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    results = runtime.write_cache(
        [make_records(2), ListSource("named", make_records(2))], tmp_path, writer_config=QUIET
    )
    assert isinstance(results[0], drt.CacheWriteError)
    assert "name" in results[0].message
    assert results[1] == drt.CacheWriteSuccess("named", tmp_path / "named")


def test_an_existing_cache_is_never_overwritten(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    path = write(tmp_path, ListSource("fixed", make_records(10)))
    before = tree_digest(path)
    (result,) = runtime.write_cache(
        ListSource("fixed", make_records(10, seed=9)), tmp_path, writer_config=QUIET
    )
    assert isinstance(result, drt.CacheWriteError)
    assert str(path) in result.message
    assert "already exists" in result.message
    assert tree_digest(path) == before
    assert partials(tmp_path) == []


def test_tuples_bytearray_and_memoryview_payloads(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    raw = [
        b"plain bytes",
        b"a bytearray",
        b"abcdefgh",
        array.array("i", [1, -2, 3]).tobytes(),
        b"",
        b"cdef",
        b"",
    ]
    inputs: list[Any] = [
        drt.CacheInput(raw[0], {"k": 0}),
        drt.CacheInput(bytearray(raw[1]), {"k": 1}),
        drt.CacheInput(memoryview(b"aabbccddeeffgghh")[::2], {"k": 2}),
        drt.CacheInput(memoryview(array.array("i", [1, -2, 3])), {"k": 3}),
        (b"", {"k": 4}),  # a plain (data, metadata) tuple is a CacheInput too
        drt.CacheInput(memoryview(bytearray(b"abcdefgh"))[2:6], {"k": 5}),
        drt.CacheInput(memoryview(b"xyz")[3:], {"k": 6}),
    ]
    path = write(tmp_path, ListSource("views", inputs))
    data = read_all(runtime, path, len(raw))
    assert data == raw
    assert all(type(d) is bytes for d in data)


def test_large_payloads_are_written_whole_and_no_reference_to_them_is_kept(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    """Payloads of 16 KiB and more are lent to the writer, not copied: each must
    still land whole, in order, beside small and mutable ones, and the writer
    must let go of every one of them by the time the cache is written."""
    sizes = [16 << 10, 100, (16 << 10) - 1, 300 << 10, 0, 70_000, 5 << 20, 20_000]
    lent = [bytes((i * 7 + j) % 251 for j in range(n)) for i, n in enumerate(sizes)]
    mutable = bytearray(b"m" * (64 << 10))
    inputs: list[Any] = [drt.CacheInput(d, {"k": i}) for i, d in enumerate(lent)]
    inputs.append(drt.CacheInput(mutable, {"k": len(lent)}))
    before = [sys.getrefcount(d) for d in lent]
    path = write(tmp_path, ListSource("lent", inputs))
    mutable[:] = b"x" * len(mutable)  # the cache holds what was passed, not this
    assert [sys.getrefcount(d) for d in lent] == before
    assert read_all(runtime, path, len(inputs)) == [*lent, b"m" * (64 << 10)]


def test_an_int_is_accepted_in_a_float_column_and_nothing_else_is_converted(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    inputs = [drt.CacheInput(b"a", {"score": 0.5}), drt.CacheInput(b"b", {"score": 2})]
    path = write(tmp_path, ListSource("floats", inputs))
    table = runtime.cached_dataset([path], reader_config=READ).get_metadata()
    assert table.schema["score"] == pl.Float64
    assert table["score"].to_list() == [0.5, 2.0]
    item = runtime.cached_dataset([path], reader_config=READ).get_item(
        cache_id_of(runtime, path), 1
    )
    assert item.metadata == {"score": 2.0}
    assert type(item.metadata["score"]) is float

    rejected = [
        ("float_in_int", [{"n": 1}, {"n": 1.5}]),
        ("bool_in_int", [{"n": 1}, {"n": True}]),
        ("int_in_bool", [{"n": True}, {"n": 1}]),
        ("str_in_float", [{"n": 1.0}, {"n": "1.0"}]),
        ("int_in_str", [{"n": "1"}, {"n": 1}]),
    ]
    sources = [
        ListSource(name, [drt.CacheInput(b"x", m) for m in metas]) for name, metas in rejected
    ]
    for result in runtime.write_cache(sources, tmp_path / "rejected", writer_config=QUIET):
        assert isinstance(result, drt.CacheWriteError), result
        assert "record 1" in result.message
        assert "'n'" in result.message
    assert partials(tmp_path / "rejected") == []


def test_stored_metadata_types_and_get_item(runtime: drt.DatasetRuntime, tmp_path: Path) -> None:
    records = make_records(12, payload_size=40)
    path = write(tmp_path, ListSource("typed", records))
    dataset = runtime.cached_dataset([path], reader_config=READ)
    table = dataset.get_metadata()
    # The table lists the stored columns by name (dataset-rt 0.4.8's order);
    # `metadata_columns` keeps the order the records gave them.
    assert table.schema == pl.Schema(
        {
            "cache_id": pl.UInt64,
            "sample_id": pl.UInt64,
            "flag": pl.Boolean,
            "label": pl.Int64,
            "name": pl.String,
            "score": pl.Float64,
            "weight": pl.Float64,
        }
    )
    assert table["sample_id"].to_list() == list(range(12))
    assert dataset.metadata_columns == ["label", "score", "flag", "name"]
    cache_id = cache_id_of(runtime, path)
    for sample_id in (0, 5, 11):
        item = dataset.get_item(cache_id, sample_id)
        assert isinstance(item, drt.CachedSample)
        assert item == drt.CachedSample(
            records[sample_id].data, dict(records[sample_id].metadata), cache_id, sample_id
        )
        assert [type(v) for v in item.metadata.values()] == [int, float, bool, str]
    # An identity this dataset does not have is out of range, as for a sequence
    # (IndexError, dataset-rt 0.4.8's class); an id that is not an int is a TypeError.
    with pytest.raises(IndexError, match="sample_id 12 is out of range"):
        dataset.get_item(cache_id, 12)
    with pytest.raises(IndexError, match=r"cache_id \d+ is out of range"):
        dataset.get_item(cache_id ^ 1, 0)
    for bad_id in (-1, 2**64):
        with pytest.raises(IndexError, match="out of range"):
            dataset.get_item(bad_id, 0)
        with pytest.raises(IndexError, match="out of range"):
            dataset.get_item(cache_id, bad_id)
    for not_int in (True, "0", 1.0, None):
        with pytest.raises(TypeError, match="must be integers"):
            dataset.get_item(not_int, 0)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="must be integers"):
            dataset.get_item(cache_id, not_int)  # type: ignore[arg-type]


# -- compression and shards -------------------------------------------------------


def mixed_records(n: int) -> list[drt.CacheInput]:
    """Compressible, incompressible, empty and large payloads."""
    out = []
    for i, record in enumerate(make_records(n, payload_size=300)):
        kind = i % 4
        if kind == 0:
            data = bytes([i % 251]) * (1000 + i)
        elif kind == 1:
            data = record.data
        elif kind == 2:
            data = b""
        else:
            data = (b"%d," % i) * 500
        out.append(drt.CacheInput(data, record.metadata))
    return out


@pytest.mark.parametrize(
    "compression",
    [
        drt.ShardCompression(),
        drt.ShardCompression(algo="lz4"),
        drt.ShardCompression(algo="zstd"),
        drt.ShardCompression(algo="zstd", level=19),
    ],
    ids=["none", "lz4", "zstd", "zstd-19"],
)
def test_every_compression_round_trips(
    runtime: drt.DatasetRuntime, tmp_path: Path, compression: drt.ShardCompression
) -> None:
    records = mixed_records(40)
    path = write(tmp_path, ListSource("codec", records), shard_compression=compression)
    assert read_all(runtime, path, 40) == [r.data for r in records]
    dataset = runtime.cached_dataset([path], reader_config=READ)
    assert [s.data for s in dataset] == [r.data for r in records]  # shuffle off: in order

    manifest = manifest_of(path)
    assert manifest["compression"]["codec"] == compression.algo
    raw = sum(len(r.data) for r in records)
    assert manifest["payload_bytes"] == raw
    if compression.algo == "none":
        assert manifest["stored_bytes"] == raw
    else:
        assert manifest["stored_bytes"] < raw / 2  # three in four payloads are repetitive
    drt._native.verify_cache(str(path))


def test_the_cache_id_does_not_depend_on_how_the_cache_is_stored(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    records = mixed_records(20)
    ids = {
        cache_id_of(
            runtime,
            write(tmp_path / algo, ListSource("same", records), shard_compression=compression),
        )
        for algo, compression in [
            ("none", drt.ShardCompression()),
            ("lz4", drt.ShardCompression(algo="lz4")),
            ("zstd", drt.ShardCompression(algo="zstd", level=9)),
        ]
    }
    ids.add(
        cache_id_of(
            runtime, write(tmp_path / "small", ListSource("same", records), max_shard_bytes=100)
        )
    )
    assert len(ids) == 1


def test_shards_rotate_at_max_shard_bytes(runtime: drt.DatasetRuntime, tmp_path: Path) -> None:
    records = make_records(100, payload_size=300)
    records[50] = drt.CacheInput(b"L" * 5000, records[50].metadata)  # larger than a shard
    path = write(tmp_path, ListSource("rotating", records), max_shard_bytes=1000)

    manifest = manifest_of(path)
    shard_files = sorted(p.name for p in path.glob("shard-*.bin"))
    assert shard_files == [s["file"] for s in manifest["shards"]]
    assert shard_files == [f"shard-{i:05d}.bin" for i in range(len(shard_files))]
    assert len(shard_files) >= 34  # at most three 300-byte records fit in 1000 bytes
    assert sum(s["records"] for s in manifest["shards"]) == 100
    for shard in manifest["shards"]:
        size = (path / shard["file"]).stat().st_size
        assert size == shard["bytes"]
        assert size <= 1000 or shard["records"] == 1
    assert any(s["bytes"] == 5000 and s["records"] == 1 for s in manifest["shards"])
    assert read_all(runtime, path, 100) == [r.data for r in records]
    report = drt._native.verify_cache(str(path))
    assert report.records == 100
    assert report.files == 3 + len(shard_files)


# -- cache identity -----------------------------------------------------------------


def test_cache_id_is_stable_across_locations(runtime: drt.DatasetRuntime, tmp_path: Path) -> None:
    a = write(tmp_path / "one", ListSource("stable", make_records(30)))
    b = write(tmp_path / "two" / "deeper", ListSource("stable", make_records(30)))
    assert cache_id_of(runtime, a) == cache_id_of(runtime, b)
    assert manifest_of(a)["cache_id"] == cache_id_of(runtime, a)
    # The same content gives the same bytes on disk, so the id is truly a content id.
    assert tree_digest(a) == tree_digest(b)


def _variant(kind: str) -> ListSource:
    records = make_records(30)
    name = "stable"
    if kind == "name":
        name = "stable2"
    elif kind == "payload":
        data = bytearray(records[17].data)
        data[3] ^= 0x01
        records[17] = drt.CacheInput(bytes(data), records[17].metadata)
    elif kind == "metadata_value":
        records[29] = drt.CacheInput(records[29].data, {**records[29].metadata, "name": "other"})
    elif kind == "metadata_type":
        # 1 and 1.0 are equal numbers but values of different column types.
        records = [
            drt.CacheInput(r.data, {**r.metadata, "label": float(r.metadata["label"])})
            for r in records
        ]
    elif kind == "fewer_records":
        records = records[:29]
    elif kind == "order":
        records[0], records[1] = records[1], records[0]
    return ListSource(name, records)


@pytest.mark.parametrize(
    "kind", ["name", "payload", "metadata_value", "metadata_type", "fewer_records", "order"]
)
def test_another_name_or_content_gives_another_cache_id(
    runtime: drt.DatasetRuntime, tmp_path: Path, kind: str
) -> None:
    reference = cache_id_of(runtime, write(tmp_path / "ref", _variant("same")))
    assert cache_id_of(runtime, write(tmp_path / "ref2", _variant("same"))) == reference
    assert cache_id_of(runtime, write(tmp_path / kind, _variant(kind))) != reference


# -- from_cache_sources -------------------------------------------------------------


def test_existing_caches_are_reused_without_iterating_missing_ones_are_written(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    old = ListSource("old", make_records(20, seed=1))
    write(tmp_path, old)
    assert old.iterations == 1
    before = tree_digest(tmp_path / "old")
    new = ListSource("new", make_records(10, seed=2))

    result = runtime.from_cache_sources(
        [old, new], tmp_path, reader_config=READ, writer_config=QUIET
    )

    assert isinstance(result, drt.CacheSourcesDatasetSuccess), result
    assert result.results == [
        drt.CacheWriteSuccess("old", tmp_path / "old"),
        drt.CacheWriteSuccess("new", tmp_path / "new"),
    ]
    assert old.iterations == 1  # reused: never iterated again
    assert new.iterations == 1
    assert tree_digest(tmp_path / "old") == before
    dataset = result.dataset
    assert len(dataset) == 30
    assert [s.data for s in dataset] == [r.data for r in old.records + new.records]

    again = runtime.from_cache_sources(
        [old, new], tmp_path, reader_config=READ, writer_config=QUIET
    )
    assert isinstance(again, drt.CacheSourcesDatasetSuccess)
    assert (old.iterations, new.iterations) == (1, 1)
    assert again.dataset.get_metadata().equals(dataset.get_metadata())


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at % len(data)] ^= 0x01
    path.write_bytes(bytes(data))


DAMAGES = {
    "index.bin": lambda d: _flip(d / "index.bin", 10),
    "metadata.arrow": lambda d: _flip(d / "metadata.arrow", 300),
    "manifest.json": lambda d: _flip(d / "manifest.json", 40),
    "truncated manifest.json": lambda d: (d / "manifest.json").write_bytes(
        (d / "manifest.json").read_bytes()[:50]
    ),
    "missing manifest.json": lambda d: (d / "manifest.json").unlink(),
    "missing shard-00000.bin": lambda d: (d / "shard-00000.bin").unlink(),
    "truncated shard-00000.bin": lambda d: (d / "shard-00000.bin").write_bytes(
        (d / "shard-00000.bin").read_bytes()[:-1]
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_existing_cache_is_reported_never_used_never_deleted(
    runtime: drt.DatasetRuntime, tmp_path: Path, damage: str
) -> None:
    broken = ListSource("broken", make_records(20, seed=3))
    path = write(tmp_path, broken)
    DAMAGES[damage](path)
    before = tree_digest(path)
    fine = ListSource("fine", make_records(5, seed=4))

    result = runtime.from_cache_sources(
        [broken, fine], tmp_path, reader_config=READ, writer_config=QUIET
    )

    assert isinstance(result, drt.CacheSourcesDatasetSuccess), result
    error, ok = result.results
    assert isinstance(error, drt.CacheWriteError), error
    assert error.source_name == "broken"
    file_name = damage.split()[-1]
    assert str(path / file_name) in error.message
    assert broken.iterations == 1  # not silently rewritten
    assert tree_digest(path) == before  # not deleted, not repaired
    assert ok == drt.CacheWriteSuccess("fine", tmp_path / "fine")
    assert len(result.dataset) == 5  # only the good cache is read
    assert [s.data for s in result.dataset] == [r.data for r in fine.records]


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_the_damaged_cache_error_names_the_fix(
    runtime: drt.DatasetRuntime, tmp_path: Path, damage: str
) -> None:
    broken = ListSource("broken", make_records(20, seed=3))
    path = write(tmp_path, broken)
    DAMAGES[damage](path)
    (result,) = runtime.from_cache_sources(
        broken, tmp_path, reader_config=READ, writer_config=QUIET
    ).results
    assert isinstance(result, drt.CacheWriteError)
    message = result.message.lower()
    assert "delete" in message or "remove" in message, result.message
    assert path.exists()


def test_a_directory_without_a_cache_is_incomplete_not_reused(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    (tmp_path / "stray").mkdir()
    (tmp_path / "stray" / "notes.txt").write_text("not a cache")
    stray = ListSource("stray", make_records(3))
    result = runtime.from_cache_sources(stray, tmp_path, reader_config=READ, writer_config=QUIET)
    assert isinstance(result, drt.CacheSourcesDatasetError), result
    (error,) = result.results
    assert isinstance(error, drt.CacheWriteError)
    assert "manifest.json" in error.message
    assert "stray" in result.message
    assert stray.iterations == 0
    assert sorted(p.name for p in (tmp_path / "stray").iterdir()) == ["notes.txt"]


def test_a_shard_flip_is_caught_at_reuse_only_with_validate_cache(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    source = ListSource("flipped", make_records(20, payload_size=64, seed=5))
    path = write(tmp_path, source)
    _flip(path / "shard-00000.bin", 64 * 7 + 3)  # inside record 7
    before = tree_digest(path)

    strict = drt.WriterConfig(show_progress=False, validate_cache=True)
    result = runtime.from_cache_sources(source, tmp_path, reader_config=READ, writer_config=strict)
    assert isinstance(result, drt.CacheSourcesDatasetError), result
    (error,) = result.results
    assert isinstance(error, drt.CacheWriteError)
    assert str(path / "shard-00000.bin") in error.message

    # Without full validation the cache opens, but the damaged record is refused on read.
    lax = runtime.from_cache_sources(source, tmp_path, reader_config=READ, writer_config=QUIET)
    assert isinstance(lax, drt.CacheSourcesDatasetSuccess)
    dataset = lax.dataset
    cache_id = cache_id_of(runtime, path)
    with pytest.raises(drt.CorruptCacheError, match=r"shard-00000\.bin"):
        dataset.get_item(cache_id, 7)
    for sample_id in (6, 8):
        assert dataset.get_item(cache_id, sample_id).data == source.records[sample_id].data
    assert source.iterations == 1
    assert tree_digest(path) == before


def test_nothing_usable_is_an_error_with_every_result(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    result = runtime.from_cache_sources(
        [ListSource("empty", []), ListSource("../bad", make_records(2))],
        tmp_path,
        reader_config=READ,
        writer_config=QUIET,
    )
    assert isinstance(result, drt.CacheSourcesDatasetError)
    assert [r.source_name for r in result.results] == ["empty", "../bad"]
    assert all(isinstance(r, drt.CacheWriteError) for r in result.results)
    assert "empty" in result.message
    assert "../bad" in result.message


# -- metadata updates never touch cache files ----------------------------------------


def test_updates_and_reads_never_modify_cache_files(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    a = write(tmp_path, ListSource("a", make_records(40, seed=1)), max_shard_bytes=200)
    b = write(
        tmp_path,
        ListSource("b", make_records(30, seed=2)),
        shard_compression=drt.ShardCompression(algo="zstd"),
    )
    before = tree_digest(tmp_path)
    dataset = runtime.cached_dataset([a, b], reader_config=drt.ReaderConfig(seed=3))

    table = dataset.get_metadata()
    reweighted = table.with_columns(
        (pl.col("label") + 1).cast(pl.Float64).alias("weight"), pl.lit("x").alias("extra")
    )
    dataset.update_metadata(reweighted)
    dataset.set_epoch_len(100)
    assert len(list(dataset)) == 100
    dataset.update_metadata(reweighted.filter(pl.col("flag")).reverse())
    assert sum(batch.num_rows for batch in dataset.iter_batches()) == len(dataset)
    dataset.get_item(int(table["cache_id"][0]), 3)
    dataset.set_samples_metadata(pl.concat([table, table]))
    assert len(list(dataset)) == 140
    del dataset

    assert tree_digest(tmp_path) == before


# -- configuration ------------------------------------------------------------------


BAD_CONFIGS: list[tuple[Any, dict[str, Any], str]] = [
    (drt.ReaderConfig, {"seed": 1.5}, "seed"),
    (drt.ReaderConfig, {"seed": True}, "seed"),
    (drt.ReaderConfig, {"seed": "1"}, "seed"),
    (drt.ReaderConfig, {"seed": 2**64}, "seed"),
    (drt.ReaderConfig, {"seed": -(2**63) - 1}, "seed"),
    (drt.ReaderConfig, {"seed": 1, "prefetch_size": 0}, "prefetch_size"),
    (drt.ReaderConfig, {"seed": 1, "prefetch_size": 2.0}, "prefetch_size"),
    (drt.ReaderConfig, {"seed": 1, "shuffle": 1}, "shuffle"),
    (drt.ReaderConfig, {"seed": 1, "validate_cache": "yes"}, "validate_cache"),
    (drt.WriterConfig, {"prefetch_size": 0}, "prefetch_size"),
    (drt.WriterConfig, {"prefetch_size": -5}, "prefetch_size"),
    (drt.WriterConfig, {"max_shard_bytes": 0}, "max_shard_bytes"),
    (drt.WriterConfig, {"max_shard_bytes": 1e6}, "max_shard_bytes"),
    (drt.WriterConfig, {"shard_compression": "lz4"}, "shard_compression"),
    (drt.WriterConfig, {"show_progress": None}, "show_progress"),
    (drt.WriterConfig, {"validate_cache": 0}, "validate_cache"),
    (drt.ShardCompression, {"algo": "gzip"}, "algo"),
    (drt.ShardCompression, {"algo": "LZ4"}, "algo"),
    (drt.ShardCompression, {"algo": "zstd", "level": 0}, "level"),
    (drt.ShardCompression, {"algo": "zstd", "level": 23}, "level"),
    (drt.ShardCompression, {"algo": "zstd", "level": "3"}, "level"),
]


@pytest.mark.parametrize(
    ("cls", "kwargs", "field"), BAD_CONFIGS, ids=[f"{c.__name__}-{k}" for c, k, _ in BAD_CONFIGS]
)
def test_bad_config_values_raise_validation_error(
    cls: Any, kwargs: dict[str, Any], field: str
) -> None:
    # The configs are pydantic models (as in dataset-rt 0.4.8): a bad field is a
    # pydantic ValidationError, which is a ValueError naming the class and field.
    with pytest.raises(ValidationError, match=field) as info:
        cls(**kwargs)
    assert isinstance(info.value, ValueError)
    assert cls.__name__ in str(info.value)
    # From a YAML/Hydra mapping, the same.
    with pytest.raises(ValidationError, match=field):
        cls.model_validate(kwargs)


def test_configs_are_frozen_and_have_documented_defaults() -> None:
    reader = drt.ReaderConfig(seed=-1)
    assert (reader.prefetch_size, reader.shuffle, reader.validate_cache) == (64, True, False)
    assert reader.seed_u64 == 2**64 - 1
    writer = drt.WriterConfig()
    assert writer.prefetch_size == 64
    assert writer.max_shard_bytes == 64 * 1024 * 1024
    assert writer.shard_compression == drt.ShardCompression(algo="none")
    assert (writer.show_progress, writer.validate_cache) == (True, False)
    for config, field in [
        (reader, "seed"),
        (writer, "prefetch_size"),
        (writer.shard_compression, "algo"),
    ]:
        with pytest.raises(ValidationError, match="frozen"):
            setattr(config, field, 1)
    drt.ReaderConfig(seed=2**64 - 1)
    drt.ReaderConfig(seed=-(2**63))
    drt.ShardCompression(algo="zstd", level=22)


def test_runtime_and_call_arguments_are_validated(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    assert runtime.num_workers == 2
    for bad in (0, -1, 1.0, True):
        with pytest.raises(drt.InvalidArgumentError, match="num_workers"):
            drt.DatasetRuntime(num_workers=bad)
    with pytest.raises(drt.InvalidArgumentError, match="writer_config"):
        runtime.write_cache(ListSource("s", make_records(1)), tmp_path, writer_config={})  # type: ignore[arg-type]
    path = write(tmp_path, ListSource("s", make_records(1)))
    with pytest.raises(drt.InvalidArgumentError, match="reader_config"):
        runtime.cached_dataset([path], reader_config=None)  # type: ignore[arg-type]
    assert partials(tmp_path) == []


def test_opening_the_same_cache_twice_or_mismatched_schemas_is_refused(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    a = write(tmp_path, ListSource("a", make_records(3)))
    b = write(tmp_path, ListSource("b", [drt.CacheInput(b"x", {"other": 1})]))
    with pytest.raises(drt.InvalidArgumentError, match="cache_id"):
        runtime.cached_dataset([a, a], reader_config=READ)
    copy = tmp_path / "copy"
    shutil.copytree(a, copy)
    with pytest.raises(drt.InvalidArgumentError, match="same cache_id"):
        runtime.cached_dataset([a, copy], reader_config=READ)
    with pytest.raises(drt.SchemaMismatchError):
        runtime.cached_dataset([a, b], reader_config=READ)


def test_config_rules_live_in_the_engine() -> None:
    """The native option types enforce the rules themselves: no Python path skips them."""
    from dataset_rt import _native

    with pytest.raises(drt.InvalidArgumentError, match="level"):
        _native.CompressionOptions(algo="zstd", level=99)
    with pytest.raises(drt.InvalidArgumentError, match="algo"):
        _native.CompressionOptions(algo="gzip", level=3)
    compression = _native.CompressionOptions(algo="lz4", level=3)
    with pytest.raises(drt.InvalidArgumentError, match="prefetch_size"):
        _native.WriteOptions(
            prefetch_size=0,
            max_shard_bytes=1,
            compression=compression,
            show_progress=False,
            validate_cache=False,
        )
    with pytest.raises(drt.InvalidArgumentError, match="prefetch_size"):
        _native.ReaderOptions(seed=0, prefetch_size=0, shuffle=True, validate_cache=False)
    assert (
        _native.ReaderOptions(seed=-1, prefetch_size=1, shuffle=True, validate_cache=False).seed
        == 2**64 - 1
    )
