"""The audit against a server: the offline manifest equals, row for row, what the
server streams for the same description (payload streams, plain tickets), and
the report and the CLI work through `flight_client.FlightSource`."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.flight as flight
import pytest

from dataset_rt.audit import RunDescription, write_manifest
from dataset_rt.cli import main
from dataset_rt.loader import LocalSource
from dataset_rt.mixture import mixture_report
from flight_client.source import FlightSource
from flight_server.server import DatasetFlightServer

from .conftest import DATASET, SEED, balanced

EPOCH_LEN = 700


def served_rows(
    server: DatasetFlightServer,
    *,
    epochs: list[int],
    world: int,
    block: int,
    resume: int,
    switch: int,
    populations: tuple[str, str],
) -> list[dict[str, Any]]:
    """What the server streams, by plain tickets: for each epoch the rest of it
    from ``resume`` (epoch 0) or 0, cut at the absolute position ``switch``."""
    client = flight.connect(server.location)
    rows = []
    for epoch in epochs:
        first = epoch * EPOCH_LEN + (resume if epoch == epochs[0] else 0)
        end = (epoch + 1) * EPOCH_LEN
        cuts = [first, *([switch] if first < switch < end else []), end]
        for rank in range(world):
            step = 0
            for a, b in itertools.pairwise(cuts):
                ticket = {
                    "dataset": DATASET,
                    "seed": SEED,
                    "epoch": epoch,
                    "epoch_len": EPOCH_LEN,
                    "population": populations[0] if a < switch else populations[1],
                    "start": a - epoch * EPOCH_LEN,
                    "stop": b - epoch * EPOCH_LEN,
                    "block": block,
                    "world_size": world,
                    "rank": rank,
                    "columns": ["label"],
                }
                table = client.do_get(flight.Ticket(json.dumps(ticket).encode())).read_all()
                assert "payload" in table.column_names  # a full stream, not ids-only
                for i, (p, c, s, label) in enumerate(
                    zip(
                        table["position"].to_pylist(),
                        table["cache_id"].to_pylist(),
                        table["sample_id"].to_pylist(),
                        table["label"].to_pylist(),
                        strict=True,
                    )
                ):
                    rows.append(
                        {
                            "epoch": epoch,
                            "rank": rank,
                            "step": step + i // block,
                            "position": p,
                            "cache_id": c,
                            "sample_id": s,
                            "label": label,
                        }
                    )
                step += table.num_rows // block
    client.close()
    return rows


@pytest.mark.parametrize(
    ("world", "block", "resume", "switch"),
    [(1, 7, 0, 300), (3, 16, 96, 900), (4, 5, 40, 1050), (2, 64, 0, 10_000)],
)
def test_the_manifest_is_what_the_server_streams(
    source: LocalSource,
    server: DatasetFlightServer,
    tmp_path: Path,
    world: int,
    block: int,
    resume: int,
    switch: int,
) -> None:
    first = source.put(source.metadata(), activate=False)
    second = source.put(balanced(source.metadata()), activate=False)
    # A version 1 state (no resumes recorded) still describes a run.
    state = {
        "version": 1, "dataset": DATASET, "seed": SEED, "shuffle": True, "columns": [],
        "epoch_len": EPOCH_LEN, "batch_size": block, "world_size": world, "epoch": 0,
        "position": resume, "steps": 0, "segments": [[0, first], [switch, second]],
    }  # fmt: skip
    run = RunDescription.from_state(state, epochs=[0, 1])
    path = tmp_path / "manifest.parquet"
    rows = write_manifest(source, run, path, columns=["label"])
    expected = served_rows(
        server,
        epochs=[0, 1],
        world=world,
        block=block,
        resume=resume,
        switch=switch,
        populations=(first, second),
    )
    assert rows == len(expected) == run.rows()
    assert pl.read_parquet(path).to_dicts() == expected
    # Through the server (FlightSource), the same manifest.
    remote = tmp_path / "remote.parquet"
    write_manifest(FlightSource(server.location), run, remote, columns=["label"])
    assert pl.read_parquet(remote).to_dicts() == expected


def test_the_report_through_a_server_equals_the_offline_one(
    source: LocalSource, server: DatasetFlightServer
) -> None:
    population = source.put(balanced(source.metadata()), activate=False)
    remote = FlightSource(server.location)
    run = RunDescription.new(
        remote,
        DATASET,
        seed=SEED,
        batch_size=50,
        world_size=2,
        epoch_len=4000,
        population=population,
    )
    offline = mixture_report(source, run, "label")
    served = mixture_report(remote, run, "label")
    assert served.fingerprint == offline.fingerprint
    assert served.groups.equals(offline.groups)


def test_the_cli_audits_through_a_server(
    source: LocalSource,
    server: DatasetFlightServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    population = source.put(balanced(source.metadata()), activate=True)
    args = [
        "audit",
        "--server",
        server.location,
        "--dataset",
        DATASET,
        "--seed",
        str(SEED),
        "--batch-size",
        "40",
        "--world-size",
        "2",
        "--epoch-len",
        "8000",
        "--group",
        "label",
        "--report",
        str(tmp_path / "r.json"),
        "--max-sigma",
        "5",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["populations"] == [population]
    assert report["draws"] == 8000
    assert f"fingerprint: {report['fingerprint']}" in out
