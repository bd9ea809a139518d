"""The manifest (`dataset_rt.audit`) equals, row for row, what loaders delivered:
every (epoch, rank, step) and the positions and ids of its batch, for several
world sizes, batch sizes, resume points and a population switch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq
import pytest

import dataset_rt as drt
from dataset_rt.audit import MANIFEST_COLUMNS, RunDescription, write_manifest
from dataset_rt.loader import LocalSource
from dataset_rt.torch import DatasetLoader

from .conftest import DATASET, SEED, only_label


def delivered(loaders: list[DatasetLoader], epochs: list[int]) -> list[dict[str, Any]]:
    rows = []
    for rank, run in enumerate(loaders):
        for epoch in epochs:
            run.set_epoch(epoch)
            for batch in run:
                step = run.run_state.steps - 1  # the run's count: a resumed run goes on
                for p, c, s, label in zip(
                    batch["position"].tolist(),
                    batch["cache_id"].tolist(),
                    batch["sample_id"].tolist(),
                    batch["label"].tolist(),
                    strict=True,
                ):
                    rows.append(
                        {
                            "epoch": epoch,
                            "rank": rank,
                            "step": step,
                            "position": p,
                            "cache_id": c,
                            "sample_id": s,
                            "label": label,
                        }
                    )
    return rows


@pytest.mark.parametrize(
    ("world_size", "batch_size", "resume_at"), [(1, 8, 0), (3, 5, 30), (2, 16, 64)]
)
def test_the_manifest_is_what_the_loaders_delivered(
    source: LocalSource, tmp_path: Path, world_size: int, batch_size: int, resume_at: int
) -> None:
    twos = source.put(only_label(source.metadata(), 2), activate=False)

    def loader(rank: int) -> DatasetLoader:
        return DatasetLoader(
            source,
            DATASET,
            batch_size=batch_size,
            seed=SEED,
            columns=["label"],
            rank=rank,
            world_size=world_size,
        )

    # A checkpoint at ``resume_at`` (rank 0 read that far; in lockstep every rank did).
    first = loader(0)
    for _ in zip(range(resume_at // (world_size * batch_size)), first, strict=False):
        pass
    state = first.state_dict()
    assert state["position"] == resume_at
    loaders = [loader(r) for r in range(world_size)]
    for run in loaders:
        run.load_state_dict(state)
        run.switch_population(twos, at=500 + 2 * world_size * batch_size)
    run = RunDescription.from_state(loaders[0].state_dict(), epochs=[0, 1])
    expected = sorted(
        delivered(loaders, [0, 1]),
        key=lambda r: (r["epoch"], r["rank"], r["step"], r["position"]),
    )
    path = tmp_path / "manifest.parquet"
    rows = write_manifest(source, run, path, columns=["label"])
    table = pl.read_parquet(path)
    assert table.columns == [*MANIFEST_COLUMNS, "label"]
    assert rows == table.height == len(expected)
    assert table.to_dicts() == expected
    assert set(table.filter(pl.col("position") >= 500 + 2 * world_size * batch_size)["label"]) == {
        2
    }


def test_an_empty_run_writes_an_empty_manifest(source: LocalSource, tmp_path: Path) -> None:
    run = DatasetLoader(source, DATASET, batch_size=8, seed=SEED)
    for _ in run:
        pass
    state = run.state_dict()
    assert state["position"] == 500
    path = tmp_path / "empty.parquet"
    assert write_manifest(source, RunDescription.from_state(state), path, columns=["label"]) == 0
    assert pq.read_schema(path).names == [*MANIFEST_COLUMNS, "label"]


def test_bad_run_descriptions_are_refused(source: LocalSource) -> None:
    state = DatasetLoader(source, DATASET, batch_size=8, seed=SEED).state_dict()
    with pytest.raises(drt.InvalidArgumentError, match="world_size"):
        RunDescription.from_state(state, world_size=0)
    with pytest.raises(drt.InvalidArgumentError, match="epochs"):
        RunDescription.from_state(state | {"epoch": 2}, epochs=[1])
    with pytest.raises(drt.InvalidArgumentError, match="version"):
        RunDescription.from_state(state | {"version": 0})


@pytest.mark.parametrize(("world_size", "batch_size"), [(1, 8), (3, 5)])
def test_seen_is_what_a_checkpointed_run_consumed(
    source: LocalSource, tmp_path: Path, world_size: int, batch_size: int
) -> None:
    """A run reads epoch 0 whole and 7 steps of epoch 1, with a switch midway,
    then saves its state: the manifest of what the state has seen is exactly
    what the loaders delivered."""
    twos = source.put(only_label(source.metadata(), 2), activate=False)
    loaders = [
        DatasetLoader(
            source,
            DATASET,
            batch_size=batch_size,
            seed=SEED,
            columns=["label"],
            rank=rank,
            world_size=world_size,
        )
        for rank in range(world_size)
    ]
    for run in loaders:
        run.switch_population(twos, at=200 - 200 % (world_size * batch_size))
    expected = delivered(loaders, [0])
    for rank, run in enumerate(loaders):
        run.set_epoch(1)
        for step, batch in zip(range(7), run, strict=False):
            for p, c, s, label in zip(
                batch["position"].tolist(),
                batch["cache_id"].tolist(),
                batch["sample_id"].tolist(),
                batch["label"].tolist(),
                strict=True,
            ):
                ids = {"position": p, "cache_id": c, "sample_id": s, "label": label}
                expected.append({"epoch": 1, "rank": rank, "step": step} | ids)
    state = loaders[0].state_dict()
    assert (state["epoch"], state["position"]) == (1, 7 * world_size * batch_size)
    run = RunDescription.from_state(state, seen=True)
    assert list(run.epochs) == [0, 1]
    path = tmp_path / "seen.parquet"
    write_manifest(source, run, path, columns=["label"])
    key = ("epoch", "rank", "step", "position")
    assert pl.read_parquet(path).to_dicts() == sorted(expected, key=lambda r: [r[k] for k in key])
    with pytest.raises(drt.InvalidArgumentError, match="<= the state's epoch 1"):
        RunDescription.from_state(state, seen=True, epochs=[2])
