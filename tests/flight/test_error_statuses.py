"""Every error kind has one Flight status, pinned here, including failures met in
the middle of a ``do_get`` stream; the client resumes on another replica after
INTERNAL (a damaged replica or a failed worker), never after a user error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from conftest import ListSource

import dataset_rt as drt
from flight_client import DatasetClient
from flight_server import Catalog, DatasetSpec
from flight_server.errors import ProtocolError, Redactor, to_flight_error

from .conftest import DATASET, message, serve, ticket

RECORDS = 64
SIZE = 256
CORRUPT_SAMPLE = 40  # read after the first batches of an ordered epoch
SERVER_BATCH_ROWS = 8
ORDERED = {"dataset": DATASET, "seed": 3, "epoch": 0, "shuffle": False}

# (error class, Flight exception the client sees). pyarrow sends ArrowInvalid as
# INVALID_ARGUMENT and ArrowKeyError as NOT_FOUND.
STATUSES: list[tuple[type[Exception], type[Exception]]] = [
    (ProtocolError, pa.ArrowInvalid),
    (drt.InvalidArgumentError, pa.ArrowInvalid),
    (drt.InvalidPopulationError, pa.ArrowInvalid),
    (drt.SchemaMismatchError, pa.ArrowInvalid),
    (drt.NotFoundError, pa.ArrowKeyError),
    (drt.CorruptCacheError, flight.FlightInternalError),
    (drt.CacheIOError, flight.FlightInternalError),
    (drt.StorageFullError, flight.FlightUnavailableError),
    (drt.StoreUnavailableError, flight.FlightUnavailableError),
    (drt.InternalError, flight.FlightInternalError),
    (drt.FencedError, flight.FlightCancelledError),
    (drt.SourceError, flight.FlightServerError),
    (drt.DatasetRTError, flight.FlightServerError),
]


def test_every_error_class_is_covered() -> None:
    classes = {getattr(drt, name) for name in drt.errors.__all__}
    assert classes == {cls for cls, _ in STATUSES if cls is not ProtocolError}


@pytest.mark.parametrize(("error", "status"), STATUSES, ids=[c.__name__ for c, _ in STATUSES])
def test_each_error_class_maps_to_one_status(
    error: type[Exception], status: type[Exception]
) -> None:
    mapped = to_flight_error(error("what went wrong at /srv/state/x"))
    assert isinstance(mapped, status)
    if error is drt.StorageFullError:  # its own words: the error's name a server path
        assert "state volume is full" in str(mapped)
    else:
        assert "what went wrong" in str(mapped)
    assert "/srv/state" not in str(mapped), "no server path reaches a client"


def test_server_paths_are_named_where_they_stand_as_paths_never_inside_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state directory given as ``state`` (relative) is named ``<state>`` in
    ``state/runs/x.json``, not in the words of a message ("cannot save its
    state"); a path inside a longer one is not it."""
    monkeypatch.chdir(tmp_path)
    redact = Redactor({Path("state"): "<state>", Path("caches/demo"): "<cache demo>"})
    words = "It stops here and cannot save its state, so it cannot overwrite the checkpoint"
    assert redact(words) == words
    assert redact("cannot read state/runs/x.json") == "cannot read <state>/runs/x.json"
    assert redact(f"cannot read {tmp_path}/state/runs/x.json.") == (
        "cannot read <state>/runs/x.json."
    )
    assert redact(f"no directory {tmp_path}/state.") == "no directory <state>."
    assert redact("caches/demo/shard-00001.bin is damaged") == (
        "<cache demo>/shard-00001.bin is damaged"
    )
    assert redact("caches/demo2/shard-00001.bin") == "caches/demo2/shard-00001.bin"
    assert redact(f"{tmp_path}/state2/x") == "<path>"  # another directory: not the state


def test_a_fenced_run_is_told_in_the_servers_words_with_a_relative_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime: drt.DatasetRuntime
) -> None:
    """``--state-dir state``: the fencing message says "cannot save its state",
    not "cannot save its <state>"."""
    monkeypatch.chdir(tmp_path)
    write_cache(Path("caches"), runtime)
    relative = Catalog([DatasetSpec(DATASET, (Path("caches/plain"),))], "state", runtime)
    run = "3c1f" * 8
    with serve(relative) as server, DatasetClient(server.location) as client:
        assert client.claim_run(DATASET, run, after=0, epoch=0, position=8) == 1
        with pytest.raises(drt.FencedError, match="resumed elsewhere") as fenced:
            client.check_run(DATASET, run, 0)
    assert "cannot save its state, so" in str(fenced.value)
    assert "<state>" not in str(fenced.value)


def test_internal_errors_are_retried_by_the_client_and_user_errors_are_not() -> None:
    from flight_client.client import RETRYABLE

    for error, status in STATUSES:
        retried = issubclass(status, RETRYABLE)
        internal = error in (
            drt.CorruptCacheError,
            drt.CacheIOError,
            drt.StorageFullError,
            drt.StoreUnavailableError,
            drt.InternalError,
        )
        assert retried == internal, error.__name__


def test_the_extension_raises_the_classes_dataset_rt_exports(tmp_path: Path) -> None:
    """The classes are created by the extension; the package re-exports the same objects."""
    from dataset_rt import _native

    for name in drt.errors.__all__:
        assert getattr(_native, name) is getattr(drt, name)
        assert getattr(drt, name).__module__ == "dataset_rt.errors"
    with pytest.raises(drt.NotFoundError) as info:
        _native.check_cache(str(tmp_path / "missing"), False)
    assert isinstance(info.value, LookupError)
    with pytest.raises(drt.InvalidArgumentError) as invalid:
        drt.DatasetRuntime(num_workers=0)
    assert isinstance(invalid.value, ValueError)


# -- end to end: a record damaged under a running server -------------------------


def payload(index: int) -> bytes:
    return bytes([index % 251]) * SIZE


def write_cache(root: Path, runtime: drt.DatasetRuntime) -> Path:
    records = [drt.CacheInput(payload(i), {"label": i % 3}) for i in range(RECORDS)]
    config = drt.WriterConfig(show_progress=False)
    (result,) = runtime.write_cache(ListSource("plain", records), root, writer_config=config)
    assert isinstance(result, drt.CacheWriteSuccess), result
    return result.path


def damage(cache: Path, sample_id: int) -> Path:
    """Flip one byte of an uncompressed record (records are stored back to back)."""
    shard = cache / "shard-00000.bin"
    with shard.open("r+b") as file:
        file.seek(sample_id * SIZE + 7)
        byte = file.read(1)[0]
        file.seek(sample_id * SIZE + 7)
        file.write(bytes([byte ^ 0x20]))
    return shard


def catalog(root: Path, cache: Path, runtime: drt.DatasetRuntime) -> Catalog:
    return Catalog([DatasetSpec(DATASET, (cache,))], root / "state", runtime)


def collect(reader: Any, into: list[int]) -> None:
    """Append the sample ids of every batch to ``into`` until the stream ends or fails."""
    for item in reader:
        batch = getattr(item, "data", item)  # a Flight chunk or a record batch
        into += batch.column("sample_id").to_pylist()


def read_epoch(reader: Any) -> list[int]:
    return [i for chunk in reader for i in chunk.data.column("sample_id").to_pylist()]


def test_a_corrupt_record_met_mid_stream_is_internal_and_names_the_file(
    tmp_path: Path, runtime: drt.DatasetRuntime
) -> None:
    cache = write_cache(tmp_path / "caches", runtime)
    with serve(catalog(tmp_path, cache, runtime), batch_size=SERVER_BATCH_ROWS) as server:
        raw = flight.connect(server.location)
        assert read_epoch(raw.do_get(ticket(ORDERED))) == list(range(RECORDS))
        shard = damage(cache, CORRUPT_SAMPLE)
        reader = raw.do_get(ticket(ORDERED))
        delivered: list[int] = []
        with pytest.raises(flight.FlightInternalError) as info:
            collect(reader, delivered)
        assert 0 < len(delivered) <= CORRUPT_SAMPLE, "the failure must come mid-stream"
        text = message(info.value)
        # Named by dataset, cache and file: never by the server's path.
        assert f"<cache {cache.name}>/{shard.name}" in text, text
        assert "dataset 'toy'" in text, text
        assert str(shard.parent) not in text, text
        assert "Traceback" not in str(info.value).split("Detail:")[0]
        # The server keeps serving what is intact.
        head = {**ORDERED, "epoch_len": CORRUPT_SAMPLE}
        assert read_epoch(raw.do_get(ticket(head))) == list(range(CORRUPT_SAMPLE))
        raw.close()


def test_the_client_fails_over_to_a_healthy_replica_after_internal(
    tmp_path: Path, runtime: drt.DatasetRuntime
) -> None:
    healthy_cache = write_cache(tmp_path / "healthy", runtime)
    damaged_cache = write_cache(tmp_path / "damaged", runtime)
    healthy = catalog(tmp_path / "a", healthy_cache, runtime)
    damaged = catalog(tmp_path / "b", damaged_cache, runtime)
    with (
        serve(damaged, batch_size=SERVER_BATCH_ROWS) as bad,
        serve(healthy, batch_size=SERVER_BATCH_ROWS) as good,
    ):
        damage(damaged_cache, CORRUPT_SAMPLE)
        with DatasetClient([bad.location, good.location], backoff=0.01) as client:
            samples = list(client.epoch(DATASET, seed=3, epoch=0, shuffle=False))
            assert [s.sample_id for s in samples] == list(range(RECORDS))
            assert [s.payload for s in samples] == [payload(i) for i in range(RECORDS)]
            assert [f[1] for f in client.failovers] == [bad.location]
            assert client.failovers[0][2] == "FlightInternalError"


def test_the_client_does_not_retry_a_user_error(
    tmp_path: Path, runtime: drt.DatasetRuntime
) -> None:
    cache = write_cache(tmp_path / "caches", runtime)
    with (
        serve(catalog(tmp_path, cache, runtime)) as server,
        DatasetClient([server.location, server.location]) as client,
    ):
        with pytest.raises(pa.ArrowInvalid, match="nope"):
            list(client.epoch(DATASET, seed=0, epoch=0, columns=["nope"]))
        assert client.failovers == []


def test_iter_batches_raises_corrupt_cache_error_like_the_sample_iterator(
    tmp_path: Path, runtime: drt.DatasetRuntime
) -> None:
    cache = write_cache(tmp_path / "caches", runtime)
    config = drt.ReaderConfig(seed=0, shuffle=False)
    dataset = runtime.cached_dataset([cache], reader_config=config)
    shard = damage(cache, CORRUPT_SAMPLE)
    reader = dataset.iter_batches(batch_size=SERVER_BATCH_ROWS)
    delivered: list[int] = []
    with pytest.raises(drt.CorruptCacheError, match=str(shard)):
        collect(reader, delivered)
    assert 0 < len(delivered) <= CORRUPT_SAMPLE
    with pytest.raises(drt.CorruptCacheError, match=str(shard)):
        list(dataset)
