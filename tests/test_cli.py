"""The command line: ``python -m dataset_rt inspect | verify | demo``."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ListSource, make_records, write

import dataset_rt as drt
from dataset_rt import _native, cli


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dataset_rt", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("cli")
    compression = drt.ShardCompression(algo="lz4")
    source = ListSource("cli_source", make_records(30, payload_size=500))
    return write(base, source, max_shard_bytes=4000, shard_compression=compression)


def manifest_of(path: Path) -> dict[str, object]:
    return json.loads((path / "manifest.json").read_text())["manifest"]  # type: ignore[no-any-return]


def test_inspect_prints_the_manifest_summary(cache: Path) -> None:
    result = run("inspect", str(cache))
    assert result.returncode == 0, result.stderr
    manifest = manifest_of(cache)
    out = result.stdout
    assert re.search(r"^source\s+cli_source$", out, re.M)
    assert re.search(rf"^cache_id\s+{manifest['cache_id']}$", out, re.M)
    assert re.search(r"^records\s+30$", out, re.M)
    assert re.search(r"^format\s+version 1\b", out, re.M)
    assert re.search(r"^compression\s+lz4\b", out, re.M)
    shards = manifest["shards"]
    assert isinstance(shards, list)
    assert len(shards) > 1
    assert re.search(rf"^shards\s+{len(shards)}$", out, re.M)
    for shard in shards:
        assert shard["file"] in out
    columns = out.split("columns\n", 1)[1].split()
    assert columns == [
        *("sample_id:", "uint64"),
        *("label:", "int64"),
        *("score:", "float64"),
        *("flag:", "bool"),
        *("name:", "string"),
    ]
    assert result.stderr == ""


def test_inspect_from_the_manifest_alone_reads_no_other_file(cache: Path, tmp_path: Path) -> None:
    """``describe_manifest`` (what ``import`` prints from) describes a cache by its
    checked manifest: the other files are not read, so damage to them goes unseen
    here and is refused by a full inspect."""
    copy = tmp_path / cache.name
    shutil.copytree(cache, copy)
    with (copy / "metadata.arrow").open("r+b") as metadata:
        metadata.seek(9)
        byte = metadata.read(1)[0]
        metadata.seek(9)
        metadata.write(bytes([byte ^ 0x55]))
    with pytest.raises(drt.CorruptCacheError, match=r"metadata\.arrow"):
        _native.inspect_cache(str(copy))
    full = _native.inspect_cache(str(cache))
    alone = _native.describe_manifest(str(copy))
    fields = ("source_name", "cache_id", "record_count", "payload_bytes", "stored_bytes")
    assert [getattr(alone, f) for f in fields] == [getattr(full, f) for f in fields]
    assert [s.file for s in alone.shards] == [s.file for s in full.shards]
    assert alone.columns == full.columns
    (copy / "manifest.json").write_text((copy / "manifest.json").read_text().replace("30", "31"))
    with pytest.raises(drt.CorruptCacheError, match=r"manifest\.json"):
        _native.describe_manifest(str(copy))


def test_inspect_json_is_the_manifest(cache: Path) -> None:
    result = run("inspect", "--json", str(cache))
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    manifest = manifest_of(cache)
    for key, value in manifest.items():
        assert info[key] == value, key
    assert info["format_version"] == 1
    assert info["path"] == str(cache)
    assert info["record_count"] == 30
    assert [c["name"] for c in info["columns"]] == ["label", "score", "flag", "name"]


@pytest.mark.parametrize("args", [("inspect", "--json"), ("inspect",), ("verify",)])
def test_a_reader_that_stops_early_ends_the_command_quietly(
    cache: Path, args: tuple[str, ...]
) -> None:
    """``inspect --json CACHE | head``: the reader goes away before the output is
    written. The command stops as Unix tools do (non-zero, nothing on stderr),
    with no ``BrokenPipeError`` traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write
    try:
        result = subprocess.run(
            [sys.executable, "-m", "dataset_rt", *args, str(cache)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode == 1


def test_verify_a_good_cache(cache: Path) -> None:
    result = run("verify", str(cache))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")
    assert "30 records" in result.stdout
    files = 3 + len(list(cache.glob("shard-*.bin")))
    assert f"{files} files" in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize("file_name", ["shard-00001.bin", "index.bin"])
def test_verify_a_corrupt_cache_fails_naming_the_file(
    cache: Path, tmp_path: Path, file_name: str
) -> None:
    damaged = tmp_path / "damaged"
    shutil.copytree(cache, damaged)
    data = bytearray((damaged / file_name).read_bytes())
    data[len(data) // 2] ^= 0x10
    (damaged / file_name).write_bytes(bytes(data))
    result = run("verify", str(damaged))
    assert result.returncode != 0
    assert str(damaged / file_name) in result.stderr
    assert "Traceback" not in result.stderr
    assert "ok" not in result.stdout


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_a_missing_path_is_a_clear_error(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "no_such_cache"
    result = run(command, str(missing))
    assert result.returncode != 0
    assert str(missing) in result.stderr
    assert "does not exist" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_help_of_the_module(tmp_path: Path) -> None:
    result = run("--help", cwd=tmp_path)
    assert result.returncode == 0
    for command in ("inspect", "verify", "demo"):
        assert command in result.stdout
    assert list(tmp_path.iterdir()) == []  # --help does not run the demo


@pytest.mark.parametrize(
    ("command", "words"),
    [
        # the argument(s), and what the command does (as in the top-level command list)
        ("inspect", ["cache", "--json", "schema"]),
        ("verify", ["cache", "checksum"]),
        ("demo", ["--data-dir", "balanced"]),
    ],
)
def test_help_of_each_command(
    capsys: pytest.CaptureFixture[str], command: str, words: list[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m dataset_rt {command}")
    for word in words:
        assert word in out


def test_bad_usage_exits_non_zero(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["inspect"], ["verify"], ["frobnicate"], ["inspect", "a", "b"]):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(argv)
        assert exit_info.value.code != 0
        assert "usage:" in capsys.readouterr().err


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_the_demo_runs_without_arguments_and_is_reproducible(tmp_path: Path) -> None:
    first = run(cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    cache = tmp_path / ".data" / "demo_imbalanced"
    _ = drt._native.verify_cache(str(cache))
    match = re.search(r"1200 weighted draws, class counts: \[(\d+), (\d+)\]", first.stdout)
    assert match, first.stdout
    zeros, ones = int(match[1]), int(match[2])
    assert zeros + ones == 1200
    # Balanced weights: each class has probability 1/2; sd = sqrt(1200/4) ~ 17.3, 5 sd ~ 87.
    assert abs(zeros - 600) <= 87
    before = tree_digest(tmp_path)

    # A second run reuses the cache (unchanged) and reproduces the same stream.
    second = run(cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    assert tree_digest(tmp_path) == before


def test_the_demo_command_takes_a_data_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["demo", "--data-dir", str(tmp_path / "elsewhere")]) == 0
    assert "class counts" in capsys.readouterr().out
    drt._native.verify_cache(str(tmp_path / "elsewhere" / "demo_imbalanced"))


def test_the_console_script(cache: Path) -> None:
    script = Path(sys.executable).parent / "dataset-rt"
    if not script.exists():
        pytest.skip("the dataset-rt console script is not installed in this environment")
    result = subprocess.run(
        [str(script), "verify", str(cache)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")


def test_write_job_writes_then_reuses_a_source(tmp_path: Path) -> None:
    """`write MODULE:ATTR BASE_DIR` is idempotent: the second run reuses the cache."""
    first = run("write", "flight_server.demo:DemoSource", str(tmp_path / "caches"), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "ok: demo_v1 ->" in first.stdout
    manifest = tmp_path / "caches" / "demo_v1" / "manifest.json"
    written = manifest.stat().st_mtime_ns
    again = run("write", "flight_server.demo:DemoSource", str(tmp_path / "caches"), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert manifest.stat().st_mtime_ns == written


@pytest.mark.parametrize("spec", ["no_such_module:Source", "flight_server.demo:Nope", "nocolon"])
def test_write_job_rejects_a_bad_source(tmp_path: Path, spec: str) -> None:
    result = run("write", spec, str(tmp_path / "caches"), cwd=tmp_path)
    assert result.returncode != 0
    assert "error:" in result.stderr
    assert "Traceback" not in result.stderr
