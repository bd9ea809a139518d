"""One rank read as K interleaved sub-streams (``DatasetClient.epoch(streams=K)``,
flight_client/substreams.py): the merged rows are the single stream's, in order,
for every partition, offset and K; bad values of ``streams`` are refused. The
failover of a sub-stream is in test_failover.py."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

import dataset_rt as drt
from flight_client import DatasetClient

from .conftest import DATASET

EPOCH_LEN = 1000


def rows(client: DatasetClient, streams: int, epoch_len: int = EPOCH_LEN, **keys: Any) -> pa.Table:
    batches = client.epoch(
        DATASET, 3, 1, batches=True, epoch_len=epoch_len, streams=streams, **keys
    )
    return pa.Table.from_batches(list(batches))


PARTITIONS = {
    "whole epoch": drt.Partition(),
    "rank 1 of 2, blocks of 3": drt.Partition(rank=1, world_size=2, block=3),
    "a range, mid-block offset": drt.Partition(
        rank=2, world_size=3, start=5, stop=900, block=4, offset=7
    ),
    "offset in the tail": drt.Partition(rank=0, world_size=2, block=7, offset=490),
    "blocks larger than a piece": drt.Partition(rank=1, world_size=2, block=5000),
}
EPOCH_LENS = {"blocks larger than a piece": 50_000}


@pytest.mark.parametrize("streams", [2, 3, 4])
@pytest.mark.parametrize("name", list(PARTITIONS))
def test_the_merged_sub_streams_are_the_single_stream(
    client: DatasetClient, streams: int, name: str
) -> None:
    partition, epoch_len = PARTITIONS[name], EPOCH_LENS.get(name, EPOCH_LEN)
    expected = rows(client, 1, epoch_len, partition=partition)
    assert expected.num_rows > 0
    got = rows(client, streams, epoch_len, partition=partition)
    assert got.combine_chunks().equals(expected.combine_chunks())


def test_ids_only_sub_streams_merge_alike(client: DatasetClient) -> None:
    partition = drt.Partition(rank=1, world_size=3, block=2, offset=3)
    expected = rows(client, 1, partition=partition, payload=False)
    got = rows(client, 4, partition=partition, payload=False)
    assert got.combine_chunks().equals(expected.combine_chunks())
    assert "payload" not in got.column_names


def test_samples_come_alike(client: DatasetClient) -> None:
    single = list(client.epoch(DATASET, 3, 1, epoch_len=50))
    merged = list(client.epoch(DATASET, 3, 1, epoch_len=50, streams=3))
    assert merged == single


@pytest.mark.parametrize("streams", [0, -1, 65, 2.0, True, "2"])
def test_bad_stream_counts_are_invalid_arguments(client: DatasetClient, streams: Any) -> None:
    with pytest.raises(drt.InvalidArgumentError, match="'streams' must be"):
        client.epoch(DATASET, 3, 1, streams=streams)
