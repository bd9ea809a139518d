"""A chain of real data-parallel runs, each SIGKILLed after its checkpoint and
resumed at another world size, batch size and worker count, over Flight and
in-process: the audit of the last state (``--seen``) equals, row for row, what
the ranks of every run delivered up to each checkpoint, and every position was
consumed once with the uninterrupted run's sample."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from dataset_rt.audit import RunDescription, write_manifest

from .conftest import RECORDS
from .test_ddp import (
    Face,
    Run,
    check_exactly_once,
    covered_end,
    face,
    reference,
    run,
    run_and_kill,
)

__all__ = ["face"]  # the fixture, parametrised over both faces

#: (world_size, workers, batch_size, steps before the kill); the last run finishes.
CHAIN = [(2, 2, 8, 4), (3, 1, 16, 3), (1, 0, 24, 5), (2, 1, 8, None)]

ROW_KEYS = ("epoch", "rank", "step", "position", "cache_id", "sample_id")


def rows(result: Run, before_step: int | None) -> list[tuple[int, ...]]:
    """What the ranks of one run delivered before its checkpoint, as manifest rows."""
    return [
        (position // RECORDS, rank, record["epoch_step"], position, ids[0], ids[1])
        for rank, records in enumerate(result.logs)
        for record in records
        if before_step is None or record["step"] < before_step
        for position, ids in zip(record["positions"], record["ids"], strict=True)
    ]


def final_state(tmp: Path, name: str) -> dict[str, Any]:
    lines = (tmp / f"{name}.rank0").read_text().splitlines()
    done = [json.loads(line) for line in lines if '"done"' in line]
    assert done, "the last run did not finish"
    return dict(done[-1]["state"])


def test_the_audit_of_a_chain_of_killed_runs_is_what_every_run_delivered(
    face: Face, tmp_path: Path
) -> None:
    delivered: list[tuple[int, ...]] = []
    resume: str | None = None
    state: dict[str, Any] = {}
    for i, (world, workers, batch, steps) in enumerate(CHAIN):
        name = f"run{i}"
        spec: dict[str, Any] = {"batch_size": batch}
        if resume is not None:
            spec["resume"] = resume
        if steps is None:
            result = run(tmp_path, name, face, world, workers, **spec)
            state = final_state(tmp_path, name)
        else:
            result, state = run_and_kill(tmp_path, name, face, world, workers, steps, **spec)
            resume = str(tmp_path / f"{name}.pt")
        delivered += rows(result, steps)

    assert [(s["world_size"], s["batch_size"], s["workers"]) for s in state["resumes"]] == [
        (w, b, n) for w, n, b, _ in CHAIN
    ]
    assert [s["generation"] for s in state["resumes"]] == [0, 1, 2, 3]

    audit = RunDescription.from_state(state, seen=True)
    path = tmp_path / "seen.parquet"
    write_manifest(face.source, audit, path)
    manifest = [tuple(r) for r in pl.read_parquet(path).select(ROW_KEYS).iter_rows()]
    missing = sorted(set(delivered) - set(manifest))
    extra = sorted(set(manifest) - set(delivered))
    assert not missing, f"delivered, not in the audit: {missing[:5]}"
    assert not extra, f"in the audit, not delivered: {extra[:5]}"
    assert sorted(manifest) == sorted(delivered)

    consumed = [(r[3], (r[4], r[5])) for r in delivered]
    last_start = state["resumes"][-1]["from"][1]
    check_exactly_once(consumed, covered_end(last_start, CHAIN[-1][0]), reference(face))
    print(
        f"\nchain over {face.name}: {len(consumed)} positions consumed, "
        f"{len(consumed) - len({p for p, _ in consumed})} twice, "
        f"{len(missing) + len(extra)} manifest rows differing from what was delivered"
    )
