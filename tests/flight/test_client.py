"""`flight_client.DatasetClient`: the friendly API over the Flight protocol.

Every test runs an in-process server on port 0 (the ``server``/``client`` fixtures
of this folder's conftest) over dataset ``toy``: caches ``alpha`` (200 records,
seed 1) and ``beta`` (100 records, seed 2) with the metadata of ``make_records``.
"""

from __future__ import annotations

import importlib.util
import json
import re
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from conftest import make_records, payload

from dataset_rt import Partition
from flight_client import DatasetClient, EpochSample
from flight_client.client import PUT_MESSAGE_BYTES
from flight_server import Catalog

from .conftest import DATASET, ROWS, ROWS_A, ROWS_B, STORED_COLUMNS, STREAM_COLUMNS, payload_size

SEED = 7
HEX32 = re.compile(r"[0-9a-f]{32}")


def expected_records(catalog: Catalog) -> dict[tuple[int, int], tuple[bytes, dict[str, Any]]]:
    """``(cache_id, sample_id) -> (payload, stored metadata)`` of every record of ``toy``."""
    cache_ids = catalog.get(DATASET).cache_ids
    assert len(cache_ids) == 2, cache_ids
    expected = {}
    for cache_id, rows, seed in zip(cache_ids, (ROWS_A, ROWS_B), (1, 2), strict=True):
        for index, record in enumerate(make_records(rows, seed=seed)):
            data = payload(index, payload_size(index), seed)
            expected[(cache_id, index)] = (data, dict(record.metadata))
    return expected


def triples(samples: list[EpochSample]) -> list[tuple[int, int, int]]:
    return [(s.position, s.cache_id, s.sample_id) for s in samples]


# -- datasets, health, metadata ------------------------------------------------------


def test_datasets_and_health(client: DatasetClient) -> None:
    assert client.datasets() == [DATASET]
    health = client.health()
    assert health["status"] == "ok"
    assert health["datasets"] == [DATASET]


def test_get_metadata_returns_polars_frame_of_every_record(
    client: DatasetClient, catalog: Catalog
) -> None:
    table = client.get_metadata(DATASET)
    assert isinstance(table, pl.DataFrame)
    assert table.height == ROWS
    assert {"cache_id", "sample_id", *STORED_COLUMNS, "weight"} <= set(table.columns)
    rows = table.select("cache_id", "sample_id", "label", "name").rows()
    expected = expected_records(catalog)
    assert {(c, s) for c, s, _, _ in rows} == set(expected)
    for cache_id, sample_id, label, name in rows:
        assert label == expected[(cache_id, sample_id)][1]["label"]
        assert name == expected[(cache_id, sample_id)][1]["name"]


def test_update_metadata_returns_content_addressed_population_id(client: DatasetClient) -> None:
    original = client.get_metadata(DATASET)
    before = client.populations(DATASET)
    edited = original.filter(pl.col("label") != 0).with_columns(pl.col("weight") * 2.0)

    population = client.update_metadata(DATASET, edited)

    assert isinstance(population, str)
    assert HEX32.fullmatch(population), population
    answer = client.populations(DATASET)
    assert answer["active"]["population"] == population
    assert answer["active"]["rows"] == edited.height
    assert set(answer["populations"]) == {*before["populations"], population}
    stored = client.get_metadata(DATASET, population=population)
    assert stored.height == edited.height
    assert sorted(stored.select("cache_id", "sample_id").rows()) == sorted(
        edited.select("cache_id", "sample_id").rows()
    )
    # The same content is the same population; activate=False leaves the active one.
    assert client.update_metadata(DATASET, edited) == population
    other = client.update_metadata(DATASET, original.head(10), activate=False)
    assert HEX32.fullmatch(other), other
    assert other != population
    assert other in client.populations(DATASET)["populations"]
    assert client.populations(DATASET)["active"]["population"] == population


def test_putting_back_the_default_table_names_the_default_population(
    client: DatasetClient,
) -> None:
    """Content addressing: the caches' full table, fetched and put back unchanged, is
    the population the server started with (same content, same id)."""
    default = client.populations(DATASET)["active"]["population"]
    table = client.get_metadata(DATASET)
    assert client.update_metadata(DATASET, table, activate=False) == default


def test_set_epoch_len_changes_the_epoch(client: DatasetClient) -> None:
    assert client.set_epoch_len(DATASET, 50) == 50
    assert client.populations(DATASET)["active"]["epoch_len"] == 50
    samples = list(client.epoch(DATASET, SEED, 3))
    assert [s.position for s in samples] == list(range(150, 200))


# -- epochs -----------------------------------------------------------------------


def test_epoch_yields_samples_with_payload_metadata_and_position(
    client: DatasetClient, catalog: Catalog
) -> None:
    samples = list(client.epoch(DATASET, SEED, 1, columns=["label", "name"]))

    assert len(samples) == ROWS
    assert [s.position for s in samples] == list(range(ROWS, 2 * ROWS))
    expected = expected_records(catalog)
    for sample in samples:
        assert isinstance(sample, EpochSample)
        assert isinstance(sample.payload, bytes)
        data, stored = expected[(sample.cache_id, sample.sample_id)]
        assert sample.payload == data
        assert sample.metadata == {"label": stored["label"], "name": stored["name"]}
    # Without columns the samples carry no metadata.
    bare = list(client.epoch(DATASET, SEED, 1))
    assert triples(bare) == triples(samples)
    assert all(s.metadata == {} for s in bare)


def test_epoch_is_deterministic_per_seed_and_epoch(client: DatasetClient) -> None:
    first = triples(list(client.epoch(DATASET, SEED, 0)))
    assert triples(list(client.epoch(DATASET, SEED, 0))) == first
    ids = [(c, s) for _, c, s in first]
    other_epoch = [(s.cache_id, s.sample_id) for s in client.epoch(DATASET, SEED, 1)]
    other_seed = [(s.cache_id, s.sample_id) for s in client.epoch(DATASET, SEED + 1, 0)]
    assert ids != other_epoch
    assert ids != other_seed


def test_epoch_batches_are_record_batches_of_the_same_stream(client: DatasetClient) -> None:
    batches = list(client.epoch(DATASET, SEED, 2, columns=["score", "flag"], batches=True))

    assert batches
    assert all(isinstance(batch, pa.RecordBatch) for batch in batches)
    assert batches[0].schema.names == [*STREAM_COLUMNS, "score", "flag"]
    table = pa.Table.from_batches(batches)
    samples = list(client.epoch(DATASET, SEED, 2, columns=["score", "flag"]))
    assert table.num_rows == len(samples) == ROWS
    assert table.column("position").to_pylist() == [s.position for s in samples]
    assert table.column("cache_id").to_pylist() == [s.cache_id for s in samples]
    assert table.column("sample_id").to_pylist() == [s.sample_id for s in samples]
    assert table.column("payload").to_pylist() == [s.payload for s in samples]
    assert table.column("score").to_pylist() == [s.metadata["score"] for s in samples]


@pytest.mark.parametrize("world_size", [2, 3, 7])
def test_ranks_partition_the_epoch(client: DatasetClient, world_size: int) -> None:
    epoch = 1
    full = {s.position: (s.cache_id, s.sample_id) for s in client.epoch(DATASET, SEED, epoch)}
    per_rank = ROWS // world_size
    seen: set[int] = set()
    for rank in range(world_size):
        share = Partition(rank=rank, world_size=world_size)
        samples = list(client.epoch(DATASET, SEED, epoch, partition=share))
        positions = [s.position for s in samples]
        start = epoch * ROWS + rank
        assert positions == [start + k * world_size for k in range(per_rank)]
        assert not seen & set(positions)
        seen |= set(positions)
        assert [(s.cache_id, s.sample_id) for s in samples] == [full[p] for p in positions]
    assert seen == set(range(epoch * ROWS, epoch * ROWS + per_rank * world_size))


@pytest.mark.parametrize("offset", [0, 1, 37, 99, 100])
def test_offset_is_the_tail_of_the_rank_stream(client: DatasetClient, offset: int) -> None:
    whole = triples(list(client.epoch(DATASET, SEED, 0, partition=Partition(rank=1, world_size=3))))
    assert len(whole) == 100
    resumed = Partition(rank=1, world_size=3, offset=offset)
    tail = triples(list(client.epoch(DATASET, SEED, 0, partition=resumed)))
    assert tail == whole[offset:]


@pytest.mark.parametrize(("rank", "world_size"), [(2, 2), (5, 3), (-1, 2), (0, 0)])
def test_rank_outside_the_world_is_a_value_error(
    client: DatasetClient, rank: int, world_size: int
) -> None:
    with pytest.raises(ValueError, match="rank"):
        list(client.epoch(DATASET, SEED, 0, partition=Partition(rank=rank, world_size=world_size)))


def test_client_rejects_an_empty_location_list() -> None:
    with pytest.raises(ValueError, match="location"):
        DatasetClient([])


# -- the torch adapter ----------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_torch_loader_without_torch_raises_import_error_naming_torch() -> None:
    with pytest.raises(ImportError, match="torch"):
        import flight_client.torch  # noqa: F401


class _RecordingPutServer(flight.FlightServerBase):  # type: ignore[misc]
    """A plain pyarrow Flight server that records the Arrow bytes of each
    message of a ``do_put`` and answers as ours does."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.messages: list[int] = []
        self.rows = 0

    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        for chunk in reader:
            if chunk.data is not None:
                self.messages.append(chunk.data.nbytes)
                self.rows += chunk.data.num_rows
        answer = {"population": "0" * 32, "rows": self.rows, "epoch_len": self.rows}
        writer.write(pa.py_buffer(json.dumps(answer).encode()))


@pytest.mark.parametrize("form", ["DataFrame", "pyarrow.Table", "LazyFrame"])
def test_a_put_is_sent_in_bounded_messages_whatever_the_table_form(form: str) -> None:
    """An eager table of one 16 MiB chunk goes out as messages of at most
    PUT_MESSAGE_BYTES (with slack for slicing), as a streamed one does: the
    server never holds a whole table in one gRPC message."""
    rows = 2 << 20
    frame = pl.DataFrame({"cache_id": pl.Series([7] * rows, dtype=pl.UInt64)}).with_columns(
        sample_id=pl.int_range(rows, dtype=pl.UInt64)
    )
    table: Any = {
        "DataFrame": frame,
        "pyarrow.Table": frame.to_arrow(),
        "LazyFrame": frame.lazy(),
    }[form]
    server = _RecordingPutServer()
    client = DatasetClient([f"grpc://127.0.0.1:{server.port}"])
    try:
        assert client.update_metadata(DATASET, table) == "0" * 32
    finally:
        client.close()
        server.shutdown()
    assert server.rows == rows
    assert len(server.messages) >= 4, server.messages
    assert max(server.messages) <= PUT_MESSAGE_BYTES * 1.01, server.messages
