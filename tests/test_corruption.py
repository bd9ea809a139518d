"""Damaged caches: every flipped, truncated or missing byte is an error, never wrong data."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from conftest import ListSource, make_records, write
from hypothesis import given, settings
from hypothesis import strategies as st

import dataset_rt as drt
from dataset_rt import _native, cli

RECORDS = 24
PAYLOAD = 64
SMALL_FILES = ("manifest.json", "index.bin", "metadata.arrow")
SHARD = "shard-00000.bin"
SHARD_PATTERN = re.escape(SHARD)
ALL_FILES = (*SMALL_FILES, SHARD)

LAX = drt.ReaderConfig(seed=1, shuffle=False)
STRICT = drt.ReaderConfig(seed=1, shuffle=False, validate_cache=True)

PROPERTY = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
)


@pytest.fixture(scope="module", params=["none", "zstd"])
def pristine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small complete cache (never modified: each test damages a copy)."""
    base = tmp_path_factory.mktemp(f"pristine-{request.param}")
    records = make_records(RECORDS, payload_size=PAYLOAD)
    compression = drt.ShardCompression(algo=request.param)
    return write(base, ListSource("cache", records), shard_compression=compression)


def expected_payloads() -> list[bytes]:
    return [bytes(r.data) for r in make_records(RECORDS, payload_size=PAYLOAD)]


def damaged_copy(pristine: Path, into: Path) -> Path:
    target = into / "cache"
    shutil.copytree(pristine, target)
    return target


def flip(path: Path, position: int, mask: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= mask
    path.write_bytes(bytes(data))


def assert_open_fails(runtime: drt.DatasetRuntime, cache: Path, file_name: str) -> None:
    """Opening (lax and strict) and verifying all refuse the cache, naming ``file_name``."""
    for config in (LAX, STRICT):
        with pytest.raises(drt.CorruptCacheError) as info:
            runtime.cached_dataset([cache], reader_config=config)
        assert isinstance(info.value, OSError)
        assert str(cache / file_name) in str(info.value)
    with pytest.raises(drt.CorruptCacheError) as info:
        _native.verify_cache(str(cache))
    assert str(cache / file_name) in str(info.value)


def _read_all_in_order(dataset: drt.CachedDataset, expected: list[bytes]) -> None:
    for sample in dataset:
        assert sample.data == expected[sample.sample_id]


def _read_all_batches(dataset: drt.CachedDataset, expected: list[bytes]) -> None:
    for batch in dataset.iter_batches(batch_size=4):
        ids = batch.column("sample_id").to_pylist()
        assert batch.column("payload").to_pylist() == [expected[i] for i in ids]


def reads_never_return_wrong_data(runtime: drt.DatasetRuntime, cache: Path) -> list[int]:
    """Read every record three ways; return the sample ids that were refused.

    Each read returns the exact original bytes or raises an error naming the shard.
    """
    expected = expected_payloads()
    dataset = runtime.cached_dataset([cache], reader_config=LAX)
    cache_id = int(dataset.get_metadata()["cache_id"][0])
    refused: list[int] = []
    errors: list[str] = []
    for sample_id in range(RECORDS):
        try:
            item = dataset.get_item(cache_id, sample_id)
        except drt.CorruptCacheError as error:
            refused.append(sample_id)
            errors.append(str(error))
        else:
            assert item.data == expected[sample_id]
    for sample_id, message in zip(refused, errors, strict=True):
        assert str(cache / SHARD) in message
        assert f"record {sample_id} " in message

    # The per-sample iterator (shuffle off reads records in order) stops with the error.
    with pytest.raises(drt.CorruptCacheError, match=SHARD_PATTERN):
        _read_all_in_order(dataset, expected)
    # The columnar path fails too (as an Arrow error carrying the message).
    with pytest.raises(Exception, match=SHARD_PATTERN):
        _read_all_batches(dataset, expected)
    return refused


def cli_verify(cache: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``python -m dataset_rt verify CACHE`` in-process (test_cli.py runs it as a process)."""
    capsys.readouterr()
    code = cli.main(["verify", str(cache)])
    out, err = capsys.readouterr()
    return code, out, err


def check_flip(
    runtime: drt.DatasetRuntime, pristine: Path, file_name: str, pos: int, mask: int
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        cache = damaged_copy(pristine, Path(scratch))
        size = (cache / file_name).stat().st_size
        flip(cache / file_name, pos % size, mask)
        if file_name != SHARD:
            assert_open_fails(runtime, cache, file_name)
            return
        # A shard is memory-mapped and not hashed at open: the damaged record is refused
        # on every read, the full checks (strict open, verify) refuse the whole cache.
        assert len(reads_never_return_wrong_data(runtime, cache)) == 1
        with pytest.raises(drt.CorruptCacheError, match="checksum mismatch") as info:
            runtime.cached_dataset([cache], reader_config=STRICT)
        assert str(cache / SHARD) in str(info.value)
        with pytest.raises(drt.CorruptCacheError) as info:
            _native.verify_cache(str(cache))
        assert str(cache / SHARD) in str(info.value)


# -- flipped bytes -------------------------------------------------------------------


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("file_name", ALL_FILES)
def test_a_flipped_byte_is_detected(
    runtime: drt.DatasetRuntime,
    pristine: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    file_name: str,
    where: str,
) -> None:
    size = (pristine / file_name).stat().st_size
    position = {"first": 0, "middle": size // 2, "last": size - 1}[where]
    check_flip(runtime, pristine, file_name, position, 0x01)

    cache = damaged_copy(pristine, tmp_path)
    flip(cache / file_name, position, 0x80)
    code, out, err = cli_verify(cache, capsys)
    assert code != 0
    assert str(cache / file_name) in err
    assert out == ""


@PROPERTY
@given(position=st.integers(min_value=0, max_value=2**20), mask=st.integers(1, 255))
@pytest.mark.parametrize("file_name", ["index.bin", "metadata.arrow", SHARD])
def test_any_byte_changed_in_a_binary_file_is_detected(
    runtime: drt.DatasetRuntime, pristine: Path, file_name: str, position: int, mask: int
) -> None:
    check_flip(runtime, pristine, file_name, position, mask)


@PROPERTY
@given(position=st.integers(min_value=0, max_value=2**20), bit=st.integers(0, 7))
def test_any_bit_flipped_in_the_manifest_is_detected(
    runtime: drt.DatasetRuntime, pristine: Path, position: int, bit: int
) -> None:
    # Single-bit flips: replacing one JSON whitespace byte by another (e.g. a space by a
    # tab) changes no value and is not corruption; no single-bit flip does that.
    check_flip(runtime, pristine, "manifest.json", position, 1 << bit)


# -- truncated and missing files ---------------------------------------------------------


@pytest.mark.parametrize("keep", ["empty", "last byte cut", "half"])
@pytest.mark.parametrize("file_name", ALL_FILES)
def test_a_truncated_file_is_detected_at_open(
    runtime: drt.DatasetRuntime, pristine: Path, tmp_path: Path, file_name: str, keep: str
) -> None:
    cache = damaged_copy(pristine, tmp_path)
    data = (cache / file_name).read_bytes()
    # The manifest ends with a newline, which is only whitespace: cut the last JSON byte.
    end = len(data.rstrip()) if file_name == "manifest.json" else len(data)
    length = {"empty": 0, "last byte cut": end - 1, "half": len(data) // 2}[keep]
    (cache / file_name).write_bytes(data[:length])
    assert_open_fails(runtime, cache, file_name)


def test_an_appended_byte_is_detected_at_open(
    runtime: drt.DatasetRuntime, pristine: Path, tmp_path: Path
) -> None:
    for file_name in (*SMALL_FILES[1:], SHARD):
        cache = damaged_copy(pristine, tmp_path / file_name)
        with (cache / file_name).open("ab") as f:
            f.write(b"\0")
        assert_open_fails(runtime, cache, file_name)


@pytest.mark.parametrize("file_name", ALL_FILES)
def test_a_missing_file_is_detected_at_open(
    runtime: drt.DatasetRuntime,
    pristine: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    file_name: str,
) -> None:
    cache = damaged_copy(pristine, tmp_path)
    (cache / file_name).unlink()
    assert_open_fails(runtime, cache, file_name)
    code, _, err = cli_verify(cache, capsys)
    assert code != 0
    assert str(cache / file_name) in err


def test_a_missing_directory_is_a_clear_error(runtime: drt.DatasetRuntime, tmp_path: Path) -> None:
    with pytest.raises(drt.NotFoundError, match="does not exist"):
        runtime.cached_dataset([tmp_path / "absent"], reader_config=LAX)
    (tmp_path / "file").write_text("x")
    with pytest.raises(drt.CorruptCacheError, match="not a directory"):
        runtime.cached_dataset([tmp_path / "file"], reader_config=LAX)


# -- format version ----------------------------------------------------------------------


def _set_version(cache: Path, version: Any) -> None:
    envelope = json.loads((cache / "manifest.json").read_text())
    assert envelope["format_version"] == _native.FORMAT_VERSION == 1
    envelope["format_version"] = version
    (cache / "manifest.json").write_text(json.dumps(envelope, indent=2))


@pytest.mark.parametrize("version", [0, 2, 99, 2**40])
def test_an_unknown_format_version_is_a_clear_error(
    runtime: drt.DatasetRuntime,
    pristine: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    version: int,
) -> None:
    cache = damaged_copy(pristine, tmp_path)
    _set_version(cache, version)
    with pytest.raises(
        drt.CorruptCacheError, match=f"unsupported format version {version}"
    ) as info:
        runtime.cached_dataset([cache], reader_config=LAX)
    assert str(cache / "manifest.json") in str(info.value)
    assert "version 1" in str(info.value)  # says what this build reads
    code, _, err = cli_verify(cache, capsys)
    assert code != 0
    assert f"unsupported format version {version}" in err


def test_a_rewritten_manifest_keeps_working_and_a_non_integer_version_is_refused(
    runtime: drt.DatasetRuntime, pristine: Path, tmp_path: Path
) -> None:
    # Re-encoding the same JSON differently is not damage: the values are unchanged.
    cache = damaged_copy(pristine, tmp_path / "same")
    _set_version(cache, 1)
    dataset = runtime.cached_dataset([cache], reader_config=LAX)
    assert [s.data for s in dataset] == expected_payloads()

    cache = damaged_copy(pristine, tmp_path / "text")
    _set_version(cache, "1")
    with pytest.raises(drt.CorruptCacheError, match="format_version"):
        runtime.cached_dataset([cache], reader_config=LAX)


def test_an_edited_manifest_value_is_detected(
    runtime: drt.DatasetRuntime, pristine: Path, tmp_path: Path
) -> None:
    edits: dict[str, Any] = {
        "record_count": lambda m: m.__setitem__("record_count", m["record_count"] - 1),
        "cache_id": lambda m: m.__setitem__("cache_id", m["cache_id"] + 1),
        "source_name": lambda m: m.__setitem__("source_name", "other"),
    }
    for field, edit in edits.items():
        cache = damaged_copy(pristine, tmp_path / field)
        envelope = json.loads((cache / "manifest.json").read_text())
        edit(envelope["manifest"])
        (cache / "manifest.json").write_text(json.dumps(envelope, indent=2))
        with pytest.raises(drt.CorruptCacheError, match="checksum mismatch"):
            runtime.cached_dataset([cache], reader_config=LAX)
