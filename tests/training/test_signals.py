"""Input signals: how long a rank waited for its batches and how often its
streams restarted on another replica (`DatasetLoader.input_stats`)."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

import dataset_rt as drt
from dataset_rt.loader import LocalSource
from dataset_rt.torch import DatasetLoader
from flight_client.torch import FlightLoader
from flight_server.catalog import Catalog, DatasetSpec
from flight_server.server import DatasetFlightServer

from .conftest import DATASET, RECORDS, SEED

KEYS = ("rank", "batches", "wait_p50_ms", "wait_p99_ms", "wait_max_ms", "wait_total_s",
        "stream_restarts", "trainer_batches")  # fmt: skip


@pytest.fixture
def server(cache: Path, tmp_path: Path, runtime: drt.DatasetRuntime) -> Iterator[str]:
    catalog = Catalog([DatasetSpec(DATASET, (cache,))], tmp_path / "state", runtime)
    with DatasetFlightServer(catalog, "grpc://127.0.0.1:0") as running:
        yield running.location


def dead_location() -> str:
    """A loopback port nobody listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"grpc://127.0.0.1:{port}"


@pytest.mark.parametrize("workers", [0, 2])
def test_waits_are_counted_per_batch(source: LocalSource, workers: int) -> None:
    loader = DatasetLoader(
        source,
        DATASET,
        batch_size=10,
        seed=SEED,
        num_workers=workers,
        multiprocessing_context="forkserver" if workers else None,
    )
    before = loader.input_stats()
    assert before["batches"] == 0
    assert before["wait_p50_ms"] is None
    steps = sum(1 for _ in loader)
    stats = loader.input_stats()
    assert tuple(stats) == KEYS
    assert stats["batches"] == steps == RECORDS // 10
    assert 0 <= stats["wait_p50_ms"] <= stats["wait_p99_ms"] <= stats["wait_max_ms"]
    assert stats["wait_total_s"] > 0
    assert stats["stream_restarts"] == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_restarts_on_another_replica_are_counted_and_logged(
    server: str, workers: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A stream of partition ``p`` starts at replica ``p mod 2``; replica 0 is
    down. With no worker, rank 0's one stream fails over once in this process;
    with 2, worker 0 reads partition 0 (fails over once, in the worker process)
    and worker 1 partition 1 (starts at the live replica). The failover is
    logged at WARNING in the trainer, naming both replicas and the offset.
    (Workers started afresh: a persistent loader's first batches would be read
    by the trainer while they start, which splits the streams at a point that
    depends on how long they take; tests/training/test_first_batch.py.)"""
    dead = dead_location()
    loader = FlightLoader(
        [dead, server],
        DATASET,
        batch_size=10,
        seed=SEED,
        num_workers=workers,
        multiprocessing_context="forkserver" if workers else None,
        persistent_workers=False,
    )
    with caplog.at_level(logging.WARNING, logger="dataset_rt.input"):
        assert sum(1 for _ in loader) == RECORDS // 10
    assert loader.input_stats()["stream_restarts"] == 1
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    reader = 0 if workers else -1
    assert warning.getMessage() == (
        f"rank 0, reader {reader}: rank 0's stream from {dead} broke "
        f"(FlightUnavailableError) at offset 0; resuming there on {server}"
    )


def test_input_stats_are_logged_on_request(
    source: LocalSource, caplog: pytest.LogCaptureFixture
) -> None:
    loader = DatasetLoader(source, DATASET, batch_size=10, seed=SEED, log_input_every=20)
    with caplog.at_level(logging.INFO, logger="dataset_rt.input"):
        for _ in loader:
            pass
    lines = [r for r in caplog.records if r.name == "dataset_rt.input"]
    assert len(lines) == (RECORDS // 10) // 20
    assert "rank 0 input: 20 batches, wait p50" in lines[0].getMessage()
    with pytest.raises(drt.InvalidArgumentError, match="log_input_every"):
        DatasetLoader(source, DATASET, batch_size=10, seed=SEED, log_input_every=0)
