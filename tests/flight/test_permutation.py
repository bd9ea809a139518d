"""The permutation stream mode (``shuffle: "permutation"``) on both faces: every
row once per cycle of ``rows`` positions, a fresh order each cycle, weights
ignored, duplicated rows as often as listed; the server's streams equal the
library's sample for sample with every partition key, ids-only streams and the
audit. The construction's own properties (bijection, uniformity) are tested in
Rust (native/src/sampling.rs)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from pydantic import ValidationError

import dataset_rt as drt
from flight_client import DatasetClient

from .conftest import DATASET, ROWS, command, ids, message, metadata, put, reweighted, stream

SEED = 31
PERMUTATION = "permutation"


def library(
    runtime: drt.DatasetRuntime, caches: tuple[Path, Path], table: pl.DataFrame, epoch_len: int
) -> drt.CachedDataset:
    dataset = runtime.cached_dataset(
        list(caches), reader_config=drt.ReaderConfig(seed=SEED, shuffle=PERMUTATION)
    )
    dataset.update_metadata(table)
    dataset.set_epoch_len(epoch_len)
    return dataset


def test_every_cycle_holds_every_row_once_in_a_fresh_order(raw: flight.FlightClient) -> None:
    body = {"dataset": DATASET, "seed": SEED, "epoch": 0, "epoch_len": 3 * ROWS}
    served = ids(stream(raw, body | {"shuffle": PERMUTATION}))
    table = metadata(raw)
    every_row = sorted(zip(table["cache_id"].to_list(), table["sample_id"].to_list(), strict=True))
    cycles = [served[c * ROWS : (c + 1) * ROWS] for c in range(3)]
    for cycle in cycles:
        assert sorted(cycle) == every_row
    assert cycles[0] != cycles[1] != cycles[2]
    assert cycles[0] != every_row  # not the table order
    other_seed = ids(stream(raw, body | {"seed": SEED + 1, "shuffle": PERMUTATION}))
    assert other_seed[:ROWS] != cycles[0]


def test_weights_are_ignored_and_duplicates_count_as_listed(raw: flight.FlightClient) -> None:
    table = reweighted(metadata(raw))  # very unequal weights
    doubled = pl.concat([table, table.head(10)])  # the first 10 rows listed twice
    population = put(raw, doubled, activate=False)["population"]
    rows = doubled.height
    body = {"dataset": DATASET, "seed": SEED, "epoch": 0, "epoch_len": rows}
    served = Counter(ids(stream(raw, body | {"shuffle": PERMUTATION, "population": population})))
    listed = Counter(
        zip(doubled["cache_id"].to_list(), doubled["sample_id"].to_list(), strict=True)
    )
    assert served == listed


@pytest.mark.parametrize(
    ("world_size", "start", "stop", "block", "offset"),
    [(1, 0, None, 1, 0), (3, 0, None, 1, 2), (2, 10, 700, 4, 3), (4, 57, 900, 8, 0)],
)
def test_server_and_library_agree_with_every_partition_key(
    raw: flight.FlightClient,
    runtime: drt.DatasetRuntime,
    toy_caches: tuple[Path, Path],
    world_size: int,
    start: int,
    stop: int | None,
    block: int,
    offset: int,
) -> None:
    epoch_len, epoch = 1000, 5  # epoch 5 spans cycles 16 to 19 of 300 rows
    table = reweighted(metadata(raw))
    put(raw, table)
    local = library(runtime, toy_caches, table, epoch_len)
    keys = {"world_size": world_size, "start": start, "block": block}
    if stop is not None:
        keys["stop"] = stop
    body = {"dataset": DATASET, "seed": SEED, "epoch": epoch, "epoch_len": epoch_len}
    body |= {"shuffle": PERMUTATION} | keys
    info = raw.get_flight_info(command(body))
    assert len(info.endpoints) == world_size
    for rank in range(world_size):
        ticket = body | {"rank": rank, "offset": offset}
        served = stream(raw, ticket)
        mine = local.epoch(
            epoch, partition=drt.Partition(rank=rank, offset=offset, **keys)
        ).read_all()
        assert served.column("position").to_pylist() == mine.column("position").to_pylist()
        assert ids(served) == ids(mine), f"rank {rank}: the library differs from the server"
        bare = stream(raw, ticket | {"payload": False})
        assert "payload" not in bare.column_names
        assert ids(bare) == ids(served)


def test_the_python_client_and_the_iterator_take_the_mode(
    client: DatasetClient, runtime: drt.DatasetRuntime, toy_caches: tuple[Path, Path]
) -> None:
    table = client.get_metadata(DATASET)
    local = library(runtime, toy_caches, table, ROWS)
    over_flight = [
        (s.cache_id, s.sample_id)
        for s in client.epoch(DATASET, SEED, 0, epoch_len=ROWS, shuffle=PERMUTATION)
    ]
    in_process = [(s.cache_id, s.sample_id) for s in local]
    assert over_flight == in_process
    assert len(set(in_process)) == ROWS


@pytest.mark.parametrize("bad", ["random", "Permutation", 1, None])
def test_a_bad_mode_names_the_valid_ones(raw: flight.FlightClient, bad: object) -> None:
    body = {"dataset": DATASET, "seed": SEED, "epoch": 0, "shuffle": bad}
    with pytest.raises(pa.ArrowInvalid) as info:
        raw.get_flight_info(command(body))
    assert "shuffle" in message(info.value)
    # The config is a pydantic model (dataset-rt 0.4.8's kind): a ValidationError.
    with pytest.raises(ValidationError, match="permutation"):
        drt.ReaderConfig(seed=1, shuffle=bad)  # type: ignore[arg-type]
