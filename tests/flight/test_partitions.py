"""The partition rule with ``start``, ``stop`` and ``block``, on both faces.

Sample ``i = j * block + t`` of rank ``r`` of ``w`` is epoch position
``start + (r + j * w) * block + t``; every rank gets ``floor(blocks / w) * block``
samples where ``blocks = floor((stop - start) / block)`` (docs/sampling.md). The
server's partitions and the library's ``CachedDataset.epoch`` agree sample for
sample.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest

import dataset_rt as drt
from flight_client import DatasetClient

from .conftest import DATASET, command, ids, message, metadata, put, reweighted, stream

SEED = 77
LENGTH = 113


def rule(epoch: int, rank: int, w: int, start: int, stop: int, block: int) -> list[int]:
    per_rank = (stop - start) // block // w * block
    return [
        epoch * LENGTH + start + (rank + (i // block) * w) * block + i % block
        for i in range(per_rank)
    ]


CASES = [
    # world_size, start, stop, block
    (1, 0, LENGTH, 1),
    (3, 0, LENGTH, 1),
    (2, 10, LENGTH, 4),
    (3, 7, 90, 5),
    (4, 0, LENGTH, 8),
    (5, 40, 41, 1),
    (2, LENGTH, LENGTH, 3),
    (6, 0, LENGTH, 64),
]


@pytest.mark.parametrize(("world_size", "start", "stop", "block"), CASES)
def test_server_and_library_partitions_follow_the_rule(
    raw: flight.FlightClient,
    runtime: drt.DatasetRuntime,
    toy_caches: tuple[Path, Path],
    world_size: int,
    start: int,
    stop: int,
    block: int,
) -> None:
    epoch = 2
    table = reweighted(metadata(raw))
    put(raw, table)
    library = runtime.cached_dataset(list(toy_caches), reader_config=drt.ReaderConfig(seed=SEED))
    library.update_metadata(table)
    library.set_epoch_len(LENGTH)
    keys = {"world_size": world_size, "start": start, "stop": stop, "block": block}
    whole = stream(
        raw,
        {"dataset": DATASET, "seed": SEED, "epoch": epoch, "epoch_len": LENGTH},
    )
    by_position = dict(zip(whole.column("position").to_pylist(), ids(whole), strict=True))
    body = {"dataset": DATASET, "seed": SEED, "epoch": epoch, "epoch_len": LENGTH} | keys
    info = raw.get_flight_info(command(body))
    assert len(info.endpoints) == world_size
    covered: list[int] = []
    for rank, endpoint in enumerate(info.endpoints):
        served = raw.do_get(endpoint.ticket).read_all()
        positions = served.column("position").to_pylist()
        assert positions == rule(epoch, rank, world_size, start, stop, block), f"rank {rank}"
        assert ids(served) == [by_position[p] for p in positions]
        local = library.epoch(epoch, partition=drt.Partition(rank=rank, **keys)).read_all()
        assert local.column("position").to_pylist() == positions
        assert ids(local) == ids(served), f"rank {rank}: the library differs from the server"
        covered += positions
    per_rank = (stop - start) // block // world_size * block
    first = epoch * LENGTH + start
    assert sorted(covered) == list(range(first, first + world_size * per_rank))


def test_offsets_fall_inside_blocks(raw: flight.FlightClient) -> None:
    base = {"dataset": DATASET, "seed": SEED, "epoch": 1, "epoch_len": LENGTH}
    ticket = base | {"world_size": 3, "rank": 1, "start": 5, "block": 4}
    full = stream(raw, ticket)
    assert full.num_rows == 36
    for offset in (1, 3, 4, 5, 35, 36, 50):
        tail = stream(raw, ticket | {"offset": offset})
        assert tail.to_pylist() == full.slice(min(offset, 36)).to_pylist(), offset


def test_resuming_at_start_plus_consumed_blocks_reads_the_rest_at_any_world_size(
    client: DatasetClient,
) -> None:
    """After every rank of w=2 took m blocks, start += m*w*block; w=3 reads the rest."""
    block, m = 4, 5
    halves = [drt.Partition(rank=r, world_size=2, block=block) for r in range(2)]
    before = [list(client.epoch(DATASET, SEED, 0, partition=half))[: m * block] for half in halves]
    consumed = sorted(s.position for part in before for s in part)
    assert consumed == list(range(m * 2 * block))
    start = m * 2 * block
    thirds = [drt.Partition(rank=r, world_size=3, start=start, block=block) for r in range(3)]
    after = [
        s.position for third in thirds for s in client.epoch(DATASET, SEED, 0, partition=third)
    ]
    assert len(set(after)) == len(after)
    assert min(after) == start
    assert not set(after) & set(consumed)


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"start": 400}, "start=400"),
        ({"start": 10, "stop": 5}, "stop=5"),
        ({"stop": 301}, "stop=301"),
        ({"block": 0}, "'block'"),
        ({"start": -1}, "'start'"),
        ({"block": "4"}, "'block'"),
    ],
)
def test_bad_partition_keys_are_invalid_arguments(
    raw: flight.FlightClient, keys: dict[str, object], named: str
) -> None:
    body = {"dataset": DATASET, "seed": SEED, "epoch": 0} | keys
    # INVALID_ARGUMENT arrives as pyarrow.ArrowInvalid.
    with pytest.raises(pa.ArrowInvalid) as info:
        raw.get_flight_info(command(body))
    assert named in message(info.value)


# -- ids-only streams ---------------------------------------------------------------


def test_ids_only_streams_have_the_payload_streams_ids_without_payloads(
    raw: flight.FlightClient,
    client: DatasetClient,
    runtime: drt.DatasetRuntime,
    toy_caches: tuple[Path, Path],
) -> None:
    base = {"dataset": DATASET, "seed": SEED, "epoch": 1, "epoch_len": LENGTH}
    keys = {"world_size": 2, "rank": 1, "block": 3, "start": 5, "columns": ["label"]}
    full = stream(raw, base | keys)
    ids_only = stream(raw, base | keys | {"payload": False})
    assert ids_only.schema.names == ["position", "cache_id", "sample_id", "label"]
    assert ids_only.to_pylist() == full.drop_columns(["payload"]).to_pylist()
    library = runtime.cached_dataset(list(toy_caches), reader_config=drt.ReaderConfig(seed=SEED))
    library.set_epoch_len(LENGTH)
    local = library.epoch(
        1,
        partition=drt.Partition(rank=1, world_size=2, block=3, start=5),
        columns=["label"],
        payload=False,
    )
    assert local.read_all().to_pylist() == ids_only.to_pylist()
    samples = list(client.epoch(DATASET, SEED, 1, epoch_len=LENGTH, payload=False))
    assert all(s.payload is None for s in samples)
    assert [s.sample_id for s in samples] == [s for _, s in ids(stream(raw, base))]


def test_payload_must_be_a_bool(raw: flight.FlightClient) -> None:
    body = {"dataset": DATASET, "seed": SEED, "epoch": 0, "payload": "no"}
    with pytest.raises(pa.ArrowInvalid) as info:
        raw.get_flight_info(command(body))
    assert "'payload'" in message(info.value)
