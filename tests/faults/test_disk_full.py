"""Issue 22, findings 4 and 8 (retention): a full state volume, and keeping it small.

Before: a put on a full volume was INTERNAL "the server's data is damaged:
cannot write <server path>: No space left on device", its temporary file
stayed until a restart (so after space came back fewer puts fitted), and
stored populations were never removed. Now a full volume is its own error
(`StorageFullError`, over Flight UNAVAILABLE "the server's state volume is
full", no path; clients retry another replica), a failed put removes its
temporary file at once, and ``--keep-populations N`` bounds the store.

The full volume is a small tmpfs mounted for the test (it needs the right to
mount: root, as in CI; the test is skipped, saying why, elsewhere).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight.conftest import (
    active,
    build_caches,
    make_catalog,
    message,
    metadata,
    populations,
    put,
    reweighted,
    serve,
)
from volumes import fill, small_volume

import dataset_rt as drt
from flight_server import cli


def temp_files(state: Path) -> list[str]:
    return sorted(str(p.relative_to(state)) for p in state.rglob(".tmp-*"))


def test_a_put_on_a_full_volume_is_unavailable_and_leaves_nothing(
    tmp_path: Path, runtime: drt.DatasetRuntime
) -> None:
    with small_volume(tmp_path / "state") as state:
        catalog = make_catalog(tmp_path, runtime)  # stores the first population
        with serve(catalog) as server:
            raw = flight.connect(server.location)
            before = active(raw)
            edited = reweighted(metadata(raw))
            filler = fill(state)
            for _ in range(3):  # each attempt fails alike and leaves nothing behind
                with pytest.raises(flight.FlightUnavailableError) as failed:
                    put(raw, edited)
                text = message(failed.value)
                assert "state volume is full" in text, text
                assert str(tmp_path) not in text, text
                assert temp_files(state) == [], "a failed put removes its temporary file"
            assert active(raw) == before, "the active population is as it was"
            filler.unlink()
            answer = put(raw, edited)  # space is back: the put fits at once
            assert active(raw)["population"] == answer["population"]
            raw.close()


def test_the_library_raises_storage_full(tmp_path: Path, runtime: drt.DatasetRuntime) -> None:
    with small_volume(tmp_path / "state") as state:
        catalog = make_catalog(tmp_path, runtime)
        service = catalog.get(catalog.names()[0])
        table = reweighted(pl.DataFrame(service.metadata()))
        fill(state)
        with pytest.raises(drt.StorageFullError) as failed:
            service.put(table, True)
        assert isinstance(failed.value, drt.CacheIOError)  # what 0.4.8 code catches
        assert isinstance(failed.value, OSError)
        text = str(failed.value)
        assert "volume is full" in text
        assert temp_files(state) == []
        # It names the store's directory (state/<dataset>/caches-<key>/populations),
        # not the temporary file that the failed put removed.
        assert ".tmp-" not in text, text
        assert f"cannot write a population to {state}/" in text, text
        assert "/populations: the volume is full" in text, text


# -- retention (--keep-populations) --------------------------------------------------


def test_keep_populations_bounds_the_store_and_never_removes_the_active_one(
    tmp_path: Path, runtime: drt.DatasetRuntime
) -> None:
    catalog = make_catalog(tmp_path, runtime)
    service = catalog.get(catalog.names()[0])
    service.set_keep_populations(2)
    with serve(catalog) as server:
        raw = flight.connect(server.location)
        base = metadata(raw)
        ids = []
        for factor in (2.0, 3.0, 4.0):
            table = base.with_columns(pl.col("weight") * factor)
            ids.append(put(raw, table)["population"])
        assert sorted(populations(raw)) == sorted(ids[-2:]), "the active one and the newest other"
        assert active(raw)["population"] == ids[-1]
        # Stored without activating: the active one stays, whatever its age.
        extra = put(raw, base.with_columns(pl.col("weight") * 5.0), activate=False)["population"]
        assert set(populations(raw)) == {ids[-1], extra}
        # A ticket pinning a removed population: NOT_FOUND, as after remove_population.
        ticket = flight.Ticket(
            f'{{"dataset": "toy", "seed": 0, "epoch": 0, "population": "{ids[0]}", '
            '"epoch_len": 10}'.encode()
        )
        with pytest.raises(pa.ArrowKeyError, match="not in the store"):
            raw.do_get(ticket).read_all()
        raw.close()


def test_keep_populations_must_not_be_negative(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["--data-dir", str(tmp_path / "data"), "--keep-populations", "-1"])
    err = capsys.readouterr().err
    assert code != 0
    assert "--keep-populations must be >= 0" in err, err
    assert not (tmp_path / "data").exists(), "refused before anything is written"


# -- a nearly full volume (issue 46, finding 1) --------------------------------------

# Runs in a child process: before the fix a put whose rows file fitted its keys but
# not its alias table died of SIGBUS (exit -7) writing through a mapping, taking the
# whole server with it. The child sweeps the space left free one page at a time.
NEARLY_FULL_PUTS = """
import json, os, sys
import polars as pl
import dataset_rt as drt
from dataset_rt import service as engine

caches, state, pages = json.loads(sys.argv[1])
runtime = drt.DatasetRuntime(num_workers=2)
service = engine.DatasetService(runtime.native, "toy", caches, state)
before = service.active().population
table = pl.DataFrame(service.metadata()).with_columns(pl.col("weight") * 3.0)
filler = os.path.join(state, "filler")
outcomes = []
for free in range(pages):
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    for size in (1 << 16, 1 << 12):
        for _ in range(100_000):
            try:
                os.write(fd, b"\\0" * size)
            except OSError:
                break
    os.ftruncate(fd, max(0, os.fstat(fd).st_size - free * 4096))
    os.close(fd)
    try:
        population, _ = service.put(table, False)
    except drt.StorageFullError as error:
        outcomes.append(["full", str(error)])
    else:
        outcomes.append(["stored", population])
        service.remove_population(population)
    os.unlink(filler)
    leftovers = sorted(p for p in os.listdir(state) if ".tmp-" in p)
    assert not leftovers, (free, leftovers)
    assert service.active().population == before
print(json.dumps(outcomes))
"""


def test_a_put_on_a_nearly_full_volume_never_kills_the_process(
    tmp_path: Path, runtime: drt.DatasetRuntime
) -> None:
    caches = [str(p) for p in build_caches(tmp_path, runtime)]
    with small_volume(tmp_path / "state") as state:
        pages = 40  # far more than a put of `toy` needs (its files are a few pages)
        child = subprocess.run(
            [sys.executable, "-c", NEARLY_FULL_PUTS, json.dumps([caches, str(state), pages])],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert child.returncode == 0, (
            f"the process putting on a nearly full volume ended with {child.returncode}"
            f" (-7 is SIGBUS): {child.stderr[-2000:]}"
        )
        outcomes = json.loads(child.stdout.strip().splitlines()[-1])
        kinds = [kind for kind, _ in outcomes]
        assert "full" in kinds, kinds
        assert kinds[-1] == "stored", "with room enough the put is stored"
        assert all("volume is full" in text for kind, text in outcomes if kind == "full")


# -- a cache written on a full volume (issue 47: metadata.arrow written as it grows) --

# Runs in a child process, as above: a columnar write whose metadata.arrow (a long
# string column: most of the cache's bytes) meets a full volume at several points,
# the free space swept from an eighth of the cache's size to a page short of it.
FULL_VOLUME_WRITES = """
import json, os, shutil, sys
import pyarrow as pa
import dataset_rt as drt
from dataset_rt import _native

base, rows = sys.argv[1], int(sys.argv[2])
table = pa.table({
    "data": pa.array([bytes([i % 251]) for i in range(rows)], pa.binary()),
    "label": pa.array(range(rows), pa.int64()),
    "text": pa.array([f"{i:08d}" * 36 for i in range(rows)], pa.string()),
})
runtime = drt.DatasetRuntime(num_workers=2)
config = drt.WriterConfig(show_progress=False)
options = config.options
probe = os.path.join(base, "probe")
_native.write_arrow(runtime.native, table, probe, "c", "data", options)
sizes = [os.path.getsize(os.path.join(probe, "c", f)) for f in os.listdir(os.path.join(probe, "c"))]
size, pages = sum(sizes), sum(-(-n // 4096) for n in sizes)  # tmpfs allocates pages
metadata_share = os.path.getsize(os.path.join(probe, "c", "metadata.arrow")) / size
shutil.rmtree(probe)

def fill(free):
    filler = os.path.join(base, "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    for chunk in (1 << 20, 1 << 16, 1 << 12):
        for _ in range(1_000_000):
            try:
                os.write(fd, b"\\0" * chunk)
            except OSError:
                break
    os.ftruncate(fd, max(0, os.fstat(fd).st_size - free))
    os.close(fd)
    return filler

def left(path):
    return sorted(os.listdir(path)) if os.path.exists(path) else []

outcomes = []
# An eighth of the cache to 7/8, then a page or two short of it (the last writes:
# metadata.arrow's last batch and footer, the manifest).
for free in [size * k // 8 for k in range(1, 8)] + [(pages - 2) * 4096, (pages - 1) * 4096]:
    filler = fill(free)
    out = os.path.join(base, "out")
    try:
        _native.write_arrow(runtime.native, table, out, "c", "data", options)
    except drt.StorageFullError as error:
        outcome = ["full", str(error)]
    else:
        outcome = ["written", ""]
    written = runtime.write_arrow(table, out, name="c", payload_column="data", writer_config=config)
    opened = runtime.from_arrow(
        table, out, name="c", payload_column="data", writer_config=config,
        reader_config=drt.ReaderConfig(seed=0),
    )
    outcomes.append(outcome + [
        type(written).__name__, getattr(written, "message", ""),
        type(opened).__name__, getattr(opened, "message", ""),
        left(out), sorted(p for p in os.listdir(base) if p != "filler" and p != "out"),
    ])
    os.unlink(filler)
    shutil.rmtree(out, ignore_errors=True)
written = runtime.write_arrow(table, base, name="c", payload_column="data", writer_config=config)
assert isinstance(written, drt.CacheWriteSuccess), written
report = _native.verify_cache(str(written.path))
opened = runtime.from_arrow(
    table, base, name="c", payload_column="data", writer_config=config,
    reader_config=drt.ReaderConfig(seed=0),
)
assert isinstance(opened, drt.CacheSourcesDatasetSuccess), opened
print(json.dumps({"size": size, "metadata_share": metadata_share, "records": report.records,
                  "outcomes": outcomes}))
"""


def test_a_columnar_write_on_a_full_volume_fails_cleanly_and_succeeds_once_there_is_room(
    tmp_path: Path,
) -> None:
    """`write_arrow` / `from_arrow` into a volume that fills while metadata.arrow is
    written (as it grows, storage/metadata_out.rs): each attempt is
    `StorageFullError` (a `CacheWriteError` naming a full volume from the
    result-returning calls), the process lives, no partial cache or temporary file
    is left, and the same write succeeds once the space is back."""
    rows = 100_000  # more than one metadata batch (2^16 rows)
    with small_volume(tmp_path / "volume", size="64m") as volume:
        child = subprocess.run(
            [sys.executable, "-c", FULL_VOLUME_WRITES, str(volume), str(rows)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert child.returncode == 0, (
            f"the process writing on a full volume ended with {child.returncode}"
            f" (-7 is SIGBUS): {child.stderr[-3000:]}"
        )
        result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["records"] == rows, "with room enough the write succeeds"
    assert result["metadata_share"] > 0.7, result["metadata_share"]
    failed_in_metadata = 0
    for kind, text, written, written_text, opened, opened_text, out, others in result["outcomes"]:
        assert kind == "full", (kind, text)
        assert "volume is full" in text, text
        failed_in_metadata += "metadata.arrow" in text
        # The cache being written, not the temporary directory the failed write removed.
        assert ".partial-" not in text, text
        assert f"{volume}/out/c" in text, text
        assert ".partial-" not in written_text
        assert ".partial-" not in opened_text
        assert written == "CacheWriteError", written
        assert "volume is full" in written_text, written_text
        assert opened == "CacheSourcesDatasetError", opened
        assert "volume is full" in opened_text, opened_text
        assert out == [], f"a failed write leaves nothing in its base directory: {out}"
        assert others == [], f"nothing is left beside it either: {others}"
    assert failed_in_metadata >= 4, [outcome[1] for outcome in result["outcomes"]]
