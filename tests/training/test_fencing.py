"""Fencing: every resume of a run is a new generation, and a loader of an older
generation of the same run is told that its run was resumed elsewhere and stops
(it cannot read on, nor save its state over the newer run's checkpoint). Over
Flight through the server (so for all replicas), in-process through the state
directory. See docs/training.md, "Fencing"."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import dataset_rt as drt
from dataset_rt.torch import DatasetLoader

from .conftest import DATASET, SEED
from .test_ddp import RUN_TIMEOUT, Face, face, finish, kill, launch

__all__ = ["face"]  # the fixture, parametrised over both faces

BATCH = 8


def loader(face: Face, **options: Any) -> DatasetLoader:
    return DatasetLoader(face.source, DATASET, batch_size=BATCH, seed=SEED, **options)


def test_a_resume_fences_the_generation_it_resumed(face: Face) -> None:
    first = loader(face)
    batches = iter(first)
    next(batches)
    saved = first.state_dict()
    assert saved["generation"] == 0
    resumed = loader(face)
    resumed.load_state_dict(saved)
    assert resumed.state_dict()["generation"] == 1
    assert resumed.state_dict()["run"] == saved["run"]
    with pytest.raises(drt.FencedError, match="resumed elsewhere") as fenced:
        first.state_dict()
    assert "generation 1" in str(fenced.value)
    assert "generation 0" in str(fenced.value)
    # The old generation stops before its next batch (a server is asked at most
    # once a second).
    time.sleep(getattr(face.source, "fence_interval", 0.0) + 0.1)
    with pytest.raises(drt.FencedError, match="resumed elsewhere"):
        list(zip(range(100), batches, strict=False))
    left = len(resumed)
    assert sum(1 for _ in resumed) == left  # the new generation reads on
    assert resumed.state_dict()["position"] == 500


def test_the_ranks_of_one_checkpoint_share_a_generation_and_a_later_resume_fences_them(
    face: Face,
) -> None:
    first = loader(face, world_size=2, rank=0)
    next(iter(first))
    saved = first.state_dict()
    ranks = [loader(face, world_size=3, rank=r) for r in range(3)]
    for rank in ranks:
        rank.load_state_dict(saved)  # no torch.distributed: each claims from the checkpoint
    assert {r.state_dict()["generation"] for r in ranks} == {1}
    next(iter(ranks[0]))
    later = ranks[0].state_dict()
    again = loader(face)
    again.load_state_dict(later)
    assert again.state_dict()["generation"] == 2
    for rank in ranks:
        with pytest.raises(drt.FencedError):
            rank.state_dict()
    # Resuming the older checkpoint again (a roll-back) is a newer generation still.
    back = loader(face)
    back.load_state_dict(saved)
    assert back.state_dict()["generation"] == 3
    with pytest.raises(drt.FencedError):
        again.state_dict()


def test_an_audit_of_an_older_generation_is_not_fenced(face: Face, tmp_path: Path) -> None:
    from dataset_rt.audit import RunDescription, write_manifest

    first = loader(face)
    for _, _batch in zip(range(3), first, strict=False):
        pass
    saved = first.state_dict()
    loader(face).load_state_dict(saved)
    run = RunDescription.from_state(saved, seen=True)
    assert write_manifest(face.source, run, tmp_path / "m.parquet") == 3 * BATCH


def test_orphaned_ranks_of_a_resumed_run_are_fenced_and_the_checkpoint_is_intact(
    face: Face, tmp_path: Path
) -> None:
    """The old job's ranks are stopped (SIGSTOP) while a new job resumes from
    their checkpoint and finishes, saving to the same file; let go (SIGCONT),
    the old ranks are fenced (their stream ends, their rank 0's next save is
    refused) and the checkpoint stays the new job's."""
    checkpoint = tmp_path / "shared.pt"
    common: dict[str, Any] = {"checkpoint": str(checkpoint), "save_every": 1}
    # Slow steps: stopped right after a save, the old job is far from its next one.
    old = launch(tmp_path, "old", face, 2, 1, step_sleep=1.0, **common)
    log = tmp_path / "old.rank0"
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while not (log.exists() and '"saved": 2' in log.read_text()):
            assert all(p.poll() is None for p in old), "an old rank died early"
            assert time.monotonic() < deadline, "no checkpoint within the time limit"
            time.sleep(0.02)
        for process in old:
            os.killpg(process.pid, signal.SIGSTOP)
        resumed_from = dict(torch.load(checkpoint, weights_only=True)["loader"])
        finish(launch(tmp_path, "new", face, 2, 1, resume=str(checkpoint), **common))
        new_state = dict(torch.load(checkpoint, weights_only=True)["loader"])
        assert new_state["generation"] > resumed_from["generation"]
        assert new_state["run"] == resumed_from["run"]
        for process in old:
            os.killpg(process.pid, signal.SIGCONT)
        deadline = time.monotonic() + 60
        while '"fenced"' not in log.read_text():
            assert time.monotonic() < deadline, "the old rank 0 was not fenced"
            time.sleep(0.05)
    finally:
        kill(old)
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    fenced = [r for r in records if "fenced" in r]
    assert "resumed elsewhere" in fenced[0]["fenced"]
    after = dict(torch.load(checkpoint, weights_only=True)["loader"])
    assert after == new_state, "an orphaned rank overwrote the resumed run's checkpoint"
