"""What the Flight service streams, held against the `dataset_rt` library.

Epoch ``e`` of length ``L`` is positions ``[e*L, (e+1)*L)`` of the seed's stream
over the pinned population; rank ``r`` of ``w`` takes every ``w``-th position from
``r`` (``floor(L/w)`` each); populations are immutable and content-addressed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from polars.testing import assert_frame_equal

import dataset_rt as drt
from flight_client import DatasetClient
from flight_server import Catalog, DatasetFlightServer, DatasetSpec

from .conftest import (
    DATASET,
    ROWS,
    ROWS_A,
    ROWS_B,
    STORED_COLUMNS,
    STREAM_COLUMNS,
    act,
    active,
    command,
    ids,
    make_catalog,
    metadata,
    populations,
    put,
    reweighted,
    serve,
    stream,
)

SEED = 20_240_607
POPULATION_ID = re.compile(r"[0-9a-f]{32}")


def library(
    caches: tuple[Path, ...], runtime: drt.DatasetRuntime, *, seed: int = SEED, shuffle: bool = True
) -> drt.CachedDataset:
    config = drt.ReaderConfig(seed=seed, shuffle=shuffle)
    return runtime.cached_dataset(list(caches), reader_config=config)


def window_ids(dataset: drt.CachedDataset, start: int, count: int) -> list[tuple[int, int]]:
    """The library's ``(cache_id, sample_id)`` at positions ``[start, start + count)``."""
    return ids(dataset.stream(start=start, count=count).read_all())


def epoch_ticket(**fields: Any) -> dict[str, Any]:
    return {"dataset": DATASET, "seed": SEED, "epoch": 0} | fields


def info_tickets(info: flight.FlightInfo) -> list[dict[str, Any]]:
    return [json.loads(endpoint.ticket.ticket) for endpoint in info.endpoints]


def cyclic(table: pl.DataFrame, start: int, count: int) -> list[tuple[int, int]]:
    """Unshuffled stream: the table's rows in order, cyclically, from ``start``."""
    rows = list(zip(table["cache_id"].to_list(), table["sample_id"].to_list(), strict=True))
    return [rows[(start + i) % len(rows)] for i in range(count)]


# -- discovery ---------------------------------------------------------------------


def test_list_flights_has_one_info_per_dataset(
    tmp_path: Path, runtime: drt.DatasetRuntime, toy_caches: tuple[Path, Path]
) -> None:
    specs = [DatasetSpec(DATASET, toy_caches), DatasetSpec("solo", (toy_caches[1],))]
    catalog = Catalog(specs, tmp_path / "state", runtime)
    with serve(catalog) as server, flight.connect(server.location) as raw:
        infos = {info.descriptor.path[0].decode(): info for info in raw.list_flights()}
        assert sorted(infos) == sorted([DATASET, "solo"])
        for name, rows in ((DATASET, ROWS), ("solo", ROWS_B)):
            info = infos[name]
            assert info.descriptor.descriptor_type == flight.DescriptorType.PATH
            assert info.descriptor.path == [name.encode()]
            assert info.schema.names[:4] == list(STREAM_COLUMNS)
            assert info.total_records == rows
        subset = metadata(raw).filter(pl.col("label") == 1)
        put(raw, subset)
        infos = {info.descriptor.path[0].decode(): info for info in raw.list_flights()}
        assert infos[DATASET].total_records == subset.height
        assert infos["solo"].total_records == ROWS_B


def test_flight_info_has_one_self_contained_endpoint_per_rank(
    server: DatasetFlightServer, raw: flight.FlightClient
) -> None:
    population = active(raw)["population"]
    body = epoch_ticket(epoch=2, epoch_len=120, world_size=3, columns=["label"])
    info = raw.get_flight_info(command(body))
    assert info.total_records == 120
    assert len(info.endpoints) == 3
    for rank, (endpoint, ticket) in enumerate(zip(info.endpoints, info_tickets(info), strict=True)):
        assert ticket["rank"] == rank
        assert ticket["population"] == population
        assert ticket["epoch_len"] == 120
        assert ticket["seed"] == SEED
        assert ticket["epoch"] == 2
        assert ticket["world_size"] == 3
        assert ticket["columns"] == ["label"]
        assert ticket.get("shuffle", True) is True
        assert ticket.get("offset", 0) == 0
        uris = [
            loc.uri.decode() if isinstance(loc.uri, bytes) else loc.uri
            for loc in endpoint.locations
        ]
        assert uris == [server.location]
        batches = raw.do_get(endpoint.ticket).read_all()
        assert batches.schema.names == info.schema.names
        assert batches.num_rows == 40


def test_flight_info_pins_the_active_epoch_len_when_the_command_has_none(
    raw: flight.FlightClient,
) -> None:
    info = raw.get_flight_info(command(epoch_ticket(world_size=2)))
    assert info.total_records == ROWS
    assert [t["epoch_len"] for t in info_tickets(info)] == [ROWS, ROWS]
    act(raw, "set_epoch_len", {"dataset": DATASET, "epoch_len": 77})
    info = raw.get_flight_info(command(epoch_ticket(world_size=2)))
    assert info.total_records == 77
    assert [t["epoch_len"] for t in info_tickets(info)] == [77, 77]


def test_flight_info_for_a_path_descriptor_describes_the_dataset(raw: flight.FlightClient) -> None:
    info = raw.get_flight_info(flight.FlightDescriptor.for_path(DATASET))
    assert info.total_records == ROWS
    assert info.descriptor.path == [DATASET.encode()]


# -- the stream ---------------------------------------------------------------------


def test_stream_schema_and_columns(
    raw: flight.FlightClient, runtime: drt.DatasetRuntime, toy_caches: tuple[Path, Path]
) -> None:
    columns = ["name", "label", "score", "flag"]
    table = stream(raw, epoch_ticket(epoch=1, epoch_len=90, columns=columns))
    schema = table.schema
    assert schema.names == [*STREAM_COLUMNS, *columns]
    for name in ("position", "cache_id", "sample_id"):
        assert schema.field(name).type == pa.uint64(), name
    assert schema.field("payload").type in (pa.binary(), pa.large_binary())
    assert pa.types.is_integer(schema.field("label").type)
    assert pa.types.is_floating(schema.field("score").type)
    assert pa.types.is_boolean(schema.field("flag").type)
    assert pa.types.is_string(schema.field("name").type) or pa.types.is_large_string(
        schema.field("name").type
    )
    assert table.num_rows == 90
    # Every row carries its record's payload and stored metadata.
    dataset = library(toy_caches, runtime)
    rows = table.to_pylist()
    for row in rows:
        record = dataset.get_item(row["cache_id"], row["sample_id"])
        assert row["payload"] == record.data
        assert {c: row[c] for c in columns} == {c: record.metadata[c] for c in columns}
    bare = stream(raw, epoch_ticket(epoch=1, epoch_len=90))
    assert bare.schema.names == list(STREAM_COLUMNS)
    assert ids(bare) == ids(table)


@pytest.mark.parametrize("shuffle", [True, False])
def test_epoch_e_is_positions_e_times_len_of_the_seed_stream(
    raw: flight.FlightClient,
    runtime: drt.DatasetRuntime,
    toy_caches: tuple[Path, Path],
    shuffle: bool,
) -> None:
    length = 70
    dataset = library(toy_caches, runtime, shuffle=shuffle)
    epochs = {}
    for epoch in (0, 1, 5, 9):
        table = stream(raw, epoch_ticket(epoch=epoch, epoch_len=length, shuffle=shuffle))
        assert table.column("position").to_pylist() == list(
            range(epoch * length, (epoch + 1) * length)
        )
        assert ids(table) == window_ids(dataset, epoch * length, length), epoch
        epochs[epoch] = ids(table)
    # Consecutive windows of one stream: epoch 0 with L=140 is epochs 0 and 1 with L=70.
    double = stream(raw, epoch_ticket(epoch=0, epoch_len=2 * length, shuffle=shuffle))
    assert ids(double) == epochs[0] + epochs[1]
    if shuffle:
        assert len({tuple(e) for e in epochs.values()}) == len(epochs)
    else:
        assert epochs[0] == cyclic(metadata(raw), 0, length)
        assert epochs[5] == cyclic(metadata(raw), 5 * length, length)


def test_seeds_name_different_streams(raw: flight.FlightClient) -> None:
    first = ids(stream(raw, epoch_ticket(seed=1, epoch_len=100)))
    again = ids(stream(raw, epoch_ticket(seed=1, epoch_len=100)))
    other = ids(stream(raw, epoch_ticket(seed=2, epoch_len=100)))
    assert first == again
    assert first != other


@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffle", "in-order"])
@pytest.mark.parametrize("epoch_len_from", ["action", "command"])
def test_server_epochs_equal_library_iterators_after_the_same_update(
    client: DatasetClient,
    raw: flight.FlightClient,
    runtime: drt.DatasetRuntime,
    toy_caches: tuple[Path, Path],
    shuffle: bool,
    epoch_len_from: str,
) -> None:
    """The library's e-th iterator after ``update_metadata(T)`` + ``set_epoch_len(L)``
    and the server's epoch e after ``do_put(T)`` deliver the same samples in order."""
    length = 137
    epochs = (0, 1, 2, 4)
    table = reweighted(metadata(raw))
    assert table.height != length

    dataset = library(toy_caches, runtime, shuffle=shuffle)
    dataset.update_metadata(table)
    dataset.set_epoch_len(length)
    iterators = [[(s.cache_id, s.sample_id) for s in dataset] for _ in range(max(epochs) + 1)]
    assert all(len(it) == length for it in iterators)

    answer = put(raw, table)
    served: dict[int, list[tuple[int, int]]] = {}
    if epoch_len_from == "action":
        assert client.set_epoch_len(DATASET, length) == length
        for epoch in epochs:
            samples = client.epoch(DATASET, SEED, epoch, shuffle=shuffle)
            served[epoch] = [(s.cache_id, s.sample_id) for s in samples]
    else:
        for epoch in epochs:
            body = epoch_ticket(epoch=epoch, epoch_len=length, shuffle=shuffle)
            info = raw.get_flight_info(command(body))
            assert info_tickets(info)[0]["population"] == answer["population"]
            served[epoch] = ids(raw.do_get(info.endpoints[0].ticket).read_all())

    for epoch in epochs:
        assert served[epoch] == iterators[epoch], f"epoch {epoch} differs from the library"
        if not shuffle:
            assert served[epoch] == cyclic(table, epoch * length, length)
    if shuffle:
        # The reweighting shows: label 0 is gone, duplicates are drawn.
        labels = dict(
            zip(
                zip(table["cache_id"].to_list(), table["sample_id"].to_list(), strict=True),
                table["label"].to_list(),
                strict=False,
            )
        )
        assert all(labels[key] != 0 for key in served[0])


# -- partitions and offsets ----------------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 2, 3, 7])
def test_partitions_are_equal_disjoint_and_cover_the_epoch(
    raw: flight.FlightClient, world_size: int
) -> None:
    length, epoch = 100, 3
    per_rank = length // world_size
    full = stream(raw, epoch_ticket(epoch=epoch, epoch_len=length))
    by_position = dict(zip(full.column("position").to_pylist(), ids(full), strict=True))
    info = raw.get_flight_info(
        command(epoch_ticket(epoch=epoch, epoch_len=length, world_size=world_size))
    )
    assert len(info.endpoints) == world_size
    seen: list[int] = []
    for rank, endpoint in enumerate(info.endpoints):
        part = raw.do_get(endpoint.ticket).read_all()
        positions = part.column("position").to_pylist()
        assert part.num_rows == per_rank, f"rank {rank}"
        assert positions == [epoch * length + rank + i * world_size for i in range(per_rank)]
        assert ids(part) == [by_position[p] for p in positions]
        seen += positions
    assert len(set(seen)) == len(seen), "partitions overlap"
    assert sorted(seen) == list(range(epoch * length, epoch * length + world_size * per_rank))


@pytest.mark.parametrize("rank", [0, 2])
def test_offset_resumes_a_rank_stream(raw: flight.FlightClient, rank: int) -> None:
    """Hand-written JSON tickets: offset=k is the tail of the rank's stream from k."""
    base = epoch_ticket(epoch=2, epoch_len=100, world_size=3, rank=rank, columns=["name"])
    full = stream(raw, base)
    assert full.num_rows == 33
    for offset in (0, 1, 10, 32, 33, 40):
        tail = stream(raw, base | {"offset": offset})
        assert tail.num_rows == max(0, 33 - offset), offset
        assert tail.to_pylist() == full.slice(min(offset, 33)).to_pylist(), offset


def test_offset_on_a_flight_info_ticket(raw: flight.FlightClient) -> None:
    info = raw.get_flight_info(command(epoch_ticket(epoch=1, world_size=2)))
    ticket = info_tickets(info)[1]
    full = ids(stream(raw, ticket))
    assert ids(stream(raw, ticket | {"offset": 25})) == full[25:]


# -- populations ---------------------------------------------------------------------


def test_default_population_is_the_caches_full_table(
    raw: flight.FlightClient, runtime: drt.DatasetRuntime, toy_caches: tuple[Path, Path]
) -> None:
    table = metadata(raw)
    # The stored columns by name, as the library's get_metadata() (dataset-rt 0.4.8's order).
    assert table.columns == ["cache_id", "sample_id", *sorted(STORED_COLUMNS), "weight"]
    assert table.height == ROWS
    assert table["weight"].to_list() == [1.0] * ROWS
    assert_frame_equal(table, library(toy_caches, runtime).get_metadata())
    sizes = sorted(table.group_by("cache_id").agg(pl.col("sample_id").n_unique())["sample_id"])
    assert sizes == sorted([ROWS_A, ROWS_B])
    state = active(raw)
    assert state["rows"] == ROWS
    assert state["epoch_len"] == ROWS
    assert populations(raw) == [state["population"]]


def test_ticket_without_population_uses_the_active_one(raw: flight.FlightClient) -> None:
    default = active(raw)["population"]
    bare = epoch_ticket(epoch=1, world_size=2, rank=1)
    before = ids(stream(raw, bare))
    assert before == ids(stream(raw, bare | {"population": default, "epoch_len": ROWS}))
    table = reweighted(metadata(raw))
    answer = put(raw, table)
    after = ids(stream(raw, bare))
    pinned = bare | {"population": answer["population"], "epoch_len": table.height}
    assert after == ids(stream(raw, pinned))
    assert len(after) == table.height // 2
    assert after != before
    act(raw, "set_epoch_len", {"dataset": DATASET, "epoch_len": 60})
    assert len(ids(stream(raw, bare))) == 30


def test_do_put_answers_population_rows_and_epoch_len(raw: flight.FlightClient) -> None:
    table = reweighted(metadata(raw))
    answer = put(raw, table)
    assert set(answer) == {"population", "rows", "epoch_len"}
    assert POPULATION_ID.fullmatch(answer["population"])
    assert answer["rows"] == table.height
    assert answer["epoch_len"] == table.height
    assert active(raw) == {
        "population": answer["population"],
        "rows": table.height,
        "epoch_len": table.height,
    }
    assert answer["population"] in populations(raw)


def test_populations_are_content_addressed(
    tmp_path: Path,
    raw: flight.FlightClient,
    runtime: drt.DatasetRuntime,
    toy_caches: tuple[Path, Path],
) -> None:
    table = reweighted(metadata(raw))
    first = put(raw, table)["population"]
    stored = populations(raw)
    assert put(raw, table)["population"] == first
    assert put(raw, table, activate=False)["population"] == first
    assert populations(raw) == stored, "the same table was stored twice"
    assert put(raw, table.reverse())["population"] != first
    assert put(raw, table.with_columns(weight=pl.col("weight") * 2))["population"] != first
    # Another server with its own state directory names the same table the same way.
    other = make_catalog(tmp_path / "other", runtime, caches=toy_caches)
    with serve(other) as server, flight.connect(server.location) as second:
        assert put(second, table)["population"] == first


def test_activate_false_stores_without_activating(raw: flight.FlightClient) -> None:
    before = active(raw)
    table = metadata(raw).filter(pl.col("flag")).reverse()
    answer = put(raw, table, activate=False)
    assert answer["rows"] == table.height
    assert isinstance(answer["epoch_len"], int)
    assert active(raw) == before
    assert answer["population"] in populations(raw)
    assert_frame_equal(metadata(raw, answer["population"]), table)
    pinned = epoch_ticket(population=answer["population"], epoch_len=40, shuffle=False)
    assert ids(stream(raw, pinned)) == cyclic(table, 0, 40)


def test_get_metadata_returns_the_table_as_supplied(
    client: DatasetClient, raw: flight.FlightClient
) -> None:
    base = metadata(raw)
    edited = (
        pl.concat([base.filter(pl.col("label") == 2), base.head(5), base.head(5), base.tail(3)])
        .with_columns(
            note=pl.format("n{}", pl.col("sample_id")),
            fold=(pl.col("sample_id") % 5).cast(pl.Int32),
        )
        .reverse()
    )
    population = client.update_metadata(DATASET, edited)
    assert_frame_equal(client.get_metadata(DATASET), edited)
    assert_frame_equal(client.get_metadata(DATASET, population), edited)
    assert_frame_equal(metadata(raw, population), edited)
    # Populations stay readable by id after another becomes active.
    client.update_metadata(DATASET, base)
    assert_frame_equal(client.get_metadata(DATASET, population), edited)
    assert_frame_equal(client.get_metadata(DATASET), base)


def test_extra_columns_can_be_streamed(raw: flight.FlightClient) -> None:
    """Extra annotation columns of the population are metadata columns of the stream."""
    table = metadata(raw).with_columns(note=pl.format("n{}-{}", pl.col("label"), pl.col("name")))
    put(raw, table)
    streamed = stream(raw, epoch_ticket(epoch_len=50, columns=["note", "label"]))
    notes = dict(
        zip(
            zip(table["cache_id"].to_list(), table["sample_id"].to_list(), strict=True),
            table["note"].to_list(),
            strict=True,
        )
    )
    assert streamed.column("note").to_pylist() == [notes[key] for key in ids(streamed)]


def test_pinned_ticket_survives_later_puts_and_a_restart(
    tmp_path: Path, runtime: drt.DatasetRuntime, toy_caches: tuple[Path, Path]
) -> None:
    """A ticket names its population by id: later do_puts and a restart over the same
    state directory do not change what it streams."""
    with (
        serve(make_catalog(tmp_path, runtime, caches=toy_caches)) as server,
        flight.connect(server.location) as raw,
    ):
        info = raw.get_flight_info(command(epoch_ticket(epoch=1, world_size=2, columns=["label"])))
        tickets = info_tickets(info)
        expected = [stream(raw, t) for t in tickets]
        table = reweighted(metadata(raw))
        hidden = metadata(raw).filter(pl.col("label") == 1)
        parked = put(raw, hidden, activate=False)["population"]
        parked_expected = stream(raw, epoch_ticket(population=parked, epoch_len=64))
        answer = put(raw, table)
        act(raw, "set_epoch_len", {"dataset": DATASET, "epoch_len": 55})
        assert [stream(raw, t) for t in tickets] == expected
        unpinned = stream(raw, epoch_ticket(epoch=1))
        assert unpinned.num_rows == 55
        state = active(raw)
        stored = populations(raw)
    assert state["population"] == answer["population"]

    with (
        serve(make_catalog(tmp_path, runtime, caches=toy_caches)) as server,
        flight.connect(server.location) as raw,
    ):
        assert active(raw) == state
        assert populations(raw) == stored
        assert [stream(raw, t) for t in tickets] == expected
        assert stream(raw, epoch_ticket(population=parked, epoch_len=64)) == parked_expected
        assert stream(raw, epoch_ticket(epoch=1)) == unpinned
        assert_frame_equal(metadata(raw), table)


# -- actions -------------------------------------------------------------------------


def test_set_epoch_len_action(client: DatasetClient, raw: flight.FlightClient) -> None:
    answer = act(raw, "set_epoch_len", {"dataset": DATASET, "epoch_len": 42})
    assert answer == {"dataset": DATASET, "epoch_len": 42}
    state = active(raw)
    assert state["epoch_len"] == 42
    assert state["rows"] == ROWS
    assert raw.get_flight_info(command(epoch_ticket())).total_records == 42
    assert stream(raw, epoch_ticket(epoch=3)).num_rows == 42
    assert stream(raw, epoch_ticket(epoch=3)).column("position")[0].as_py() == 3 * 42
    # The dataset's description still counts the active rows.
    (info,) = list(raw.list_flights())
    assert info.total_records == ROWS
    assert client.set_epoch_len(DATASET, ROWS * 3) == ROWS * 3
    assert sum(1 for _ in client.epoch(DATASET, SEED, 0)) == ROWS * 3
    # An update resets the epoch length to the new row count (as in the library).
    table = metadata(raw).head(10)
    assert put(raw, table)["epoch_len"] == 10
    assert active(raw)["epoch_len"] == 10


def test_stats_count_streams_rows_and_bytes(raw: flight.FlightClient) -> None:
    before = act(raw, "stats")
    assert set(before) == {DATASET}
    assert before[DATASET]["rows"] == ROWS
    assert before[DATASET]["populations"] == 1
    lengths = (10, 20, 30)
    payload_bytes = 0
    for length in lengths:
        table = stream(raw, epoch_ticket(epoch=1, epoch_len=length))
        assert table.num_rows == length
        payload_bytes += sum(len(p) for p in table.column("payload").to_pylist())
    after = act(raw, "stats")[DATASET]
    assert after["streams"] - before[DATASET]["streams"] == len(lengths)
    assert after["rows_sent"] - before[DATASET]["rows_sent"] == sum(lengths)
    assert after["bytes_sent"] - before[DATASET]["bytes_sent"] >= payload_bytes
    put(raw, metadata(raw).head(17))
    assert act(raw, "stats")[DATASET]["rows"] == 17
    assert act(raw, "stats")[DATASET]["populations"] == 2


def test_stats_count_streams_served_not_discovery_calls(raw: flight.FlightClient) -> None:
    """``streams`` counts the streams served by do_get; listing and describing flights
    serve none."""
    before = act(raw, "stats")[DATASET]["streams"]
    list(raw.list_flights())
    info = raw.get_flight_info(command(epoch_ticket(epoch_len=30, world_size=3)))
    raw.get_flight_info(flight.FlightDescriptor.for_path(DATASET))
    assert act(raw, "stats")[DATASET]["streams"] == before, "discovery counted as streams"
    for endpoint in info.endpoints:
        assert raw.do_get(endpoint.ticket).read_all().num_rows == 10
    after = act(raw, "stats")[DATASET]
    assert after["streams"] - before == len(info.endpoints)


def test_health(client: DatasetClient, raw: flight.FlightClient) -> None:
    assert act(raw, "health") == {"status": "ok", "datasets": [DATASET]}
    assert client.health() == {"status": "ok", "datasets": [DATASET]}
    assert client.datasets() == [DATASET]
