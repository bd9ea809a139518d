"""The mistakes a PyTorch user makes with a loader get an error or a warning
that says what to do, not a silent empty epoch or a bootstrapping traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dataset_rt as drt
from dataset_rt.loader import LocalSource
from dataset_rt.torch import DatasetLoader

from .conftest import DATASET, RECORDS, SEED, only_label

ROOT = Path(__file__).resolve().parents[2]


def loader(source: LocalSource, **options: object) -> DatasetLoader:
    options.setdefault("batch_size", 10)
    options.setdefault("seed", SEED)
    return DatasetLoader(source, DATASET, **options)  # type: ignore[arg-type]


def test_iterating_a_finished_epoch_again_says_to_call_set_epoch(source: LocalSource) -> None:
    run = loader(source)
    assert sum(1 for _ in run) == RECORDS // 10
    with pytest.raises(drt.InvalidArgumentError, match=r"Call loader\.set_epoch\(1\)"):
        next(iter(run))
    run.set_epoch(0)  # the same epoch: nothing more of it, and no error
    assert list(run) == []
    run.set_epoch(1)
    assert sum(1 for _ in run) == RECORDS // 10


def test_a_resumed_finished_epoch_is_not_an_error(source: LocalSource) -> None:
    """The resume loop calls set_epoch(e) for the saved epoch, done or not."""
    first = loader(source)
    assert sum(1 for _ in first) == RECORDS // 10
    resumed = loader(source)
    resumed.load_state_dict(first.state_dict())
    resumed.set_epoch(0)
    assert list(resumed) == []


def test_a_batch_larger_than_a_ranks_share_is_refused(source: LocalSource) -> None:
    with pytest.raises(drt.InvalidArgumentError, match="gives every rank 0 batches") as caught:
        loader(source, batch_size=300, rank=0, world_size=2)
    assert "lower batch_size to at most 250" in str(caught.value)
    short = loader(source, epoch_len=100).state_dict()  # a run of 100-position epochs
    wide = loader(source, batch_size=100, rank=0, world_size=2)
    with pytest.raises(drt.InvalidArgumentError, match="an epoch of 100 positions"):
        wide.load_state_dict(short)  # resumed at 2 x 100 per step: nothing to read


def test_a_state_that_replaces_the_loaders_seed_says_so(source: LocalSource) -> None:
    saved = loader(source).state_dict()
    other = loader(source, seed=SEED + 1)
    with pytest.warns(UserWarning, match=rf"seed {SEED + 1} -> {SEED}"):
        other.load_state_dict(saved)
    assert other.state_dict()["seed"] == SEED
    same = loader(source)
    same.load_state_dict(saved)  # the same settings: no warning (warnings are errors here)


def test_a_state_that_replaces_the_loaders_population_says_so_naming_both(
    source: LocalSource,
) -> None:
    """A loader built with ``population=`` one id that loads a state of another
    (of the same dataset) reads the state's, as a resumed run must, and is told
    so as it is of a seed or epoch length the state replaces."""
    saved = loader(source).state_dict()
    (_, started), *_ = saved["segments"]
    other = source.put(only_label(source.metadata(), 1), activate=False)
    assert other != started
    built = loader(source, population=other)
    with pytest.warns(UserWarning, match=rf"population '{other}' -> '{started}'"):
        built.load_state_dict(saved)
    assert built.state_dict()["segments"] == saved["segments"]
    # The state's own population, or none named (the active one): no warning.
    loader(source, population=started).load_state_dict(saved)
    loader(source).load_state_dict(saved)


def _worker_pid(sample: dict[str, object]) -> dict[str, object]:
    return {"pid": os.getpid(), "position": sample["position"]}


def test_workers_persist_across_epochs_and_read_the_same_batches(source: LocalSource) -> None:
    """Workers are started once (PyTorch's persistent_workers), not at every
    epoch, and read what workers started afresh read."""
    kept = loader(source, num_workers=2, transform=_worker_pid)
    fresh = loader(source, num_workers=2, transform=_worker_pid, persistent_workers=False)
    pids: list[set[int]] = []
    for epoch in range(3):
        kept.set_epoch(epoch)
        fresh.set_epoch(epoch)
        ours = list(kept)
        assert [b["position"].tolist() for b in ours] == [b["position"].tolist() for b in fresh]
        pids.append({int(p) for b in ours for p in b["pid"]})
    assert len(pids[0]) == 2
    assert pids[0] == pids[1] == pids[2], "the same two workers read every epoch"


def run_script(tmp_path: Path, cache: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from dataset_rt.loader import LocalSource
            from dataset_rt.torch import DatasetLoader

            source = LocalSource([{str(cache)!r}], {str(tmp_path / "state")!r}, name="toy")
            """
        )
        + textwrap.dedent(body)
    )
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_a_script_without_the_main_guard_is_told_the_fix(tmp_path: Path, cache: Path) -> None:
    done = run_script(
        tmp_path,
        cache,
        """
        loader = DatasetLoader(source, "toy", batch_size=10, seed=1, num_workers=1)
        print("batches", sum(1 for _ in loader))
        """,
    )
    assert done.returncode != 0
    assert 'put it under `if __name__ == "__main__":`' in done.stderr, done.stderr[-3000:]
    assert "bootstrapping" in done.stderr  # the trainer's own error points at it too


def test_log_input_every_prints_without_logging_configured(tmp_path: Path, cache: Path) -> None:
    done = run_script(
        tmp_path,
        cache,
        """
        loader = DatasetLoader(source, "toy", batch_size=10, seed=1, log_input_every=25)
        print("batches", sum(1 for _ in loader))
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"batches {RECORDS // 10}"
    assert done.stderr.count("rank 0 input: ") == (RECORDS // 10) // 25, done.stderr
