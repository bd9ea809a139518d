"""Crash safety: a writer killed at any point leaves no cache or a complete one."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ListSource, make_records

import dataset_rt as drt
from dataset_rt import _native

RECORDS = 3000
RECORD_BYTES = 4096
NAME = "victim"

WRITER_SCRIPT = textwrap.dedent(
    """
    import hashlib, sys, time
    import dataset_rt as drt

    base, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])

    def payload(i):
        return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=64).digest() * 64

    class SlowSource:
        name = sys.argv[2]

        def __iter__(self):
            for i in range(n):
                if i % 30 == 0:
                    time.sleep(0.005)
                yield drt.CacheInput(payload(i), {"i": i, "even": i % 2 == 0})

    runtime = drt.DatasetRuntime(num_workers=2)
    config = drt.WriterConfig(max_shard_bytes=64 * 1024, prefetch_size=16, show_progress=False)
    print("ready", flush=True)
    (result,) = runtime.write_cache(SlowSource(), base, writer_config=config)
    print(type(result).__name__, getattr(result, "message", ""), flush=True)
    """
)


def payload(i: int) -> bytes:
    return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=64).digest() * 64


def start_writer(base: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER_SCRIPT, str(base), NAME, str(RECORDS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the writer is imported and about to write
    assert line == "ready\n", (line, proc.stderr.read() if proc.stderr else "")
    return proc


def partials(base: Path) -> list[Path]:
    return sorted(base.glob(f".{NAME}.partial-*")) if base.exists() else []


def assert_complete(runtime: drt.DatasetRuntime, cache: Path) -> None:
    """The cache passes full verification and holds exactly what the writer wrote."""
    report = _native.verify_cache(str(cache))
    assert report.records == RECORDS
    dataset = runtime.cached_dataset(
        [cache], reader_config=drt.ReaderConfig(seed=0, validate_cache=True)
    )
    table = dataset.get_metadata()
    assert table["sample_id"].to_list() == list(range(RECORDS))
    assert table["i"].to_list() == list(range(RECORDS))
    cache_id = int(table["cache_id"][0])
    for sample_id in (0, 1, RECORDS // 2, RECORDS - 1):
        item = dataset.get_item(cache_id, sample_id)
        assert item.data == payload(sample_id)
        assert item.metadata == {"i": sample_id, "even": sample_id % 2 == 0}


def fresh_write_cleans_up(runtime: drt.DatasetRuntime, base: Path) -> None:
    """A new write of the same name succeeds and removes dead writers' leftovers."""
    source = ListSource(NAME, make_records(50, payload_size=RECORD_BYTES))
    config = drt.WriterConfig(max_shard_bytes=64 * 1024, show_progress=False)
    (result,) = runtime.write_cache(source, base, writer_config=config)
    assert result == drt.CacheWriteSuccess(NAME, base / NAME)
    assert partials(base) == []
    assert sorted(p.name for p in base.iterdir()) == [NAME]
    _native.verify_cache(str(base / NAME))


def measure_write_seconds(tmp_path: Path) -> float:
    """Run one writer to completion (itself a check) and time it from 'ready'."""
    base = tmp_path / "uninterrupted"
    proc = start_writer(base)
    started = time.monotonic()
    out, err = proc.communicate(timeout=120)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, err
    assert out.startswith("CacheWriteSuccess"), out
    assert partials(base) == []
    assert len(list((base / NAME).glob("shard-*.bin"))) > 100  # many rotations happened
    return elapsed


def kill_loop(runtime: drt.DatasetRuntime, tmp_path: Path, *, kills: int, seed: int) -> None:
    write_seconds = measure_write_seconds(tmp_path)
    rng = random.Random(seed)
    base = tmp_path / "killed"
    interrupted = 0
    for _ in range(kills):
        delay = rng.uniform(0.0, 1.1 * write_seconds)
        proc = start_writer(base)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        assert proc.returncode in (0, -signal.SIGKILL)

        target = base / NAME
        if target.exists():
            assert_complete(runtime, target)
            shutil.rmtree(target)  # make room for the next kill
        else:
            assert proc.returncode == -signal.SIGKILL
            interrupted += bool(partials(base))
    # The loop must really have interrupted writes, or it tested nothing.
    assert interrupted >= 1
    fresh_write_cleans_up(runtime, base)


def test_a_killed_writer_leaves_nothing_or_a_complete_cache(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    kill_loop(runtime, tmp_path, kills=4, seed=20240601)


@pytest.mark.slow
def test_many_kills_at_random_points(runtime: drt.DatasetRuntime, tmp_path: Path) -> None:
    kill_loop(runtime, tmp_path, kills=25, seed=7)


def test_a_killed_cache_can_be_reused_after_completion(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    base = tmp_path / "base"
    proc = start_writer(base)
    # Kill it once its temporary directory holds data, i.e. mid-write.
    deadline = time.monotonic() + 60
    while not any(any(p.glob("shard-*.bin")) for p in partials(base)):
        assert proc.poll() is None, "the writer finished before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (base / NAME).exists()
    assert len(partials(base)) == 1

    # from_cache_sources sees no cache, writes one, and the leftover is gone.
    source = ListSource(NAME, make_records(10))
    result = runtime.from_cache_sources(
        source,
        base,
        reader_config=drt.ReaderConfig(seed=1),
        writer_config=drt.WriterConfig(show_progress=False),
    )
    assert isinstance(result, drt.CacheSourcesDatasetSuccess), result
    assert source.iterations == 1
    assert partials(base) == []
    assert len(result.dataset) == 10


def test_a_live_writers_temporary_directory_is_left_alone(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    """Liveness is the writer's lock on its directory, never the pid in its name."""
    base = tmp_path / "base"
    base.mkdir()
    live_dir = base / f".{NAME}.partial-1-1"
    holder_script = (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    live_dir.mkdir()
    live = subprocess.Popen(
        [sys.executable, "-c", holder_script, str(live_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert live.stdout is not None
        assert live.stdout.readline() == "ready\n"
        # Unlocked: their writers are gone, whatever pid their names carry
        # (in containers every writer is pid 1; here a live one's and our own).
        dead_dir = base / f".{NAME}.partial-{live.pid}-2"
        own_pid_dir = base / f".{NAME}.partial-{os.getpid()}-3"
        other_dir = base / f".other.partial-{live.pid}-4"
        for d in (live_dir, dead_dir, own_pid_dir, other_dir):
            d.mkdir(exist_ok=True)
            (d / "shard-00000.bin").write_bytes(b"partial")

        source = ListSource(NAME, make_records(5))
        (result,) = runtime.write_cache(
            source, base, writer_config=drt.WriterConfig(show_progress=False)
        )
        assert isinstance(result, drt.CacheWriteSuccess)
        assert live_dir.exists()  # its writer may still finish
        assert not dead_dir.exists()
        assert not own_pid_dir.exists()
        assert not other_dir.exists()  # any source's abandoned work is cleaned
    finally:
        live.kill()
        live.wait(timeout=60)
        if live.stdout is not None:
            live.stdout.close()
    assert os.path.exists(base / NAME)
