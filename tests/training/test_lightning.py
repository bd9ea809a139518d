"""`DatasetDataModule` under a real Lightning Trainer: epochs through the
Trainer's ``current_epoch``, the loader's state in the Trainer's checkpoints,
and a fit that crashes and resumes from a mid-epoch checkpoint delivering every
position of every epoch exactly once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch

import dataset_rt as drt
from dataset_rt.integrations.lightning import DatasetDataModule
from dataset_rt.loader import LocalSource

from .conftest import DATASET, RECORDS, SEED

BATCH = 10
STEPS_PER_EPOCH = RECORDS // BATCH

pytestmark = [
    # Lightning's advice for small CPU runs (workers, logging intervals, no GPU).
    pytest.mark.filterwarnings("ignore::pytorch_lightning.utilities.warnings.PossibleUserWarning"),
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*GPU available but not used.*"),
    # A resumed fit writes its checkpoints beside the crashed fit's, as users do.
    pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty"),
    # Lightning 2.6 against this PyTorch's pytree (their deprecation, not ours).
    pytest.mark.filterwarnings("ignore:.*isinstance\\(treespec, LeafSpec\\).*:FutureWarning"),
]


class Recorder(pl.LightningModule):  # type: ignore[misc]
    """Records (epoch, positions) of every batch it trains on; stops the fit
    with an error after ``crash_after`` steps (a crashed run)."""

    def __init__(self, crash_after: int | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[tuple[int, list[int]]] = []
        self.crash_after = crash_after

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        if self.crash_after is not None and self.global_step >= self.crash_after:
            raise RuntimeError("crash")
        self.seen.append((self.current_epoch, batch["position"].tolist()))
        x = batch["label"].float().unsqueeze(1)
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(root: Path, *, epochs: int, every: int | None = None) -> Any:
    callbacks = []
    if every is not None:
        callbacks.append(
            pl.callbacks.ModelCheckpoint(
                dirpath=root / "checkpoints",
                every_n_train_steps=every,
                save_top_k=-1,
                filename="{step}",
            )
        )
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=every is not None,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )


def module(source: LocalSource, **options: Any) -> DatasetDataModule:
    options.setdefault("batch_size", BATCH)
    return DatasetDataModule(source, DATASET, seed=SEED, columns=["label"], **options)


def test_each_epoch_is_the_trainers_epoch(source: LocalSource, tmp_path: Path) -> None:
    model = Recorder()
    trainer(tmp_path, epochs=2).fit(model, datamodule=module(source))
    assert len(model.seen) == 2 * STEPS_PER_EPOCH
    for epoch in (0, 1):
        positions = [p for e, batch in model.seen if e == epoch for p in batch]
        # Positions are absolute: epoch e (the loader's set_epoch at the
        # Trainer's epoch) starts at e x the epoch length.
        start = epoch * RECORDS
        assert sorted(positions) == list(range(start, start + STEPS_PER_EPOCH * BATCH))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_crashed_fit_resumes_mid_epoch_exactly_once(
    source: LocalSource, tmp_path: Path, workers: int
) -> None:
    """Crash at step 37 of 2 x 50, resume from the step-30 checkpoint: the
    batches trained before the checkpoint and after the resume are every
    position of both epochs once, in the order of an uninterrupted fit."""
    whole = Recorder()
    trainer(tmp_path / "whole", epochs=2).fit(whole, datamodule=module(source))

    crashed = Recorder(crash_after=37)
    with pytest.raises(RuntimeError, match="crash"):
        trainer(tmp_path / "run", epochs=2, every=15).fit(
            crashed, datamodule=module(source, num_workers=workers)
        )
    checkpoint = tmp_path / "run" / "checkpoints" / "step=30.ckpt"
    assert checkpoint.exists(), sorted((tmp_path / "run" / "checkpoints").iterdir())
    saved = torch.load(checkpoint, weights_only=False)
    assert saved["DatasetDataModule"]["loader"]["position"] == 30 * BATCH

    resumed = Recorder()
    trainer(tmp_path / "run", epochs=2, every=15).fit(
        resumed,
        datamodule=module(source, num_workers=workers),
        ckpt_path=checkpoint,
    )
    delivered = crashed.seen[:30] + resumed.seen
    assert delivered == whole.seen


def test_a_mid_epoch_checkpoint_at_another_batch_size_is_refused(
    source: LocalSource, tmp_path: Path
) -> None:
    crashed = Recorder(crash_after=20)
    with pytest.raises(RuntimeError, match="crash"):
        trainer(tmp_path, epochs=1, every=10).fit(crashed, datamodule=module(source))
    checkpoint = tmp_path / "checkpoints" / "step=10.ckpt"
    with pytest.raises(drt.InvalidArgumentError, match="Resume it with world size 1 and batch"):
        trainer(tmp_path, epochs=1, every=10).fit(
            Recorder(), datamodule=module(source, batch_size=20), ckpt_path=checkpoint
        )


def test_rank_and_epoch_come_from_the_trainer(source: LocalSource) -> None:
    with pytest.raises(drt.InvalidArgumentError, match="'rank' comes from the Trainer"):
        module(source, rank=1)
    with pytest.raises(drt.InvalidArgumentError, match="no loader yet"):
        _ = module(source).loader


RANK_PROGRAM = Path(__file__).with_name("lightning_rank.py")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def fit_ddp(tmp: Path, cache: Path, name: str, world_size: int, **spec: Any) -> None:
    """A Lightning DDP fit of ``world_size`` rank processes (gloo, CPU)."""
    body = {
        "caches": [str(cache)],
        "state_dir": str(tmp / "state"),
        "dataset": DATASET,
        "seed": SEED,
        "batch_size": BATCH,
        "workers": 1,
        "world_size": world_size,
        "epochs": 2,
        "log": str(tmp / name),
        "checkpoints": str(tmp / "checkpoints"),
        "every": 5,
    }
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(body | spec))
    port = free_port()
    processes = [
        subprocess.Popen(
            [sys.executable, str(RANK_PROGRAM), str(path)],
            env=dict(os.environ)
            | {"LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        for rank in range(world_size)
    ]
    try:
        for process in processes:
            assert process.wait(timeout=240) == 0, f"a rank exited with {process.returncode}"
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def steps(tmp: Path, name: str, rank: int) -> list[tuple[int, list[int]]]:
    lines = (tmp / f"{name}.rank{rank}").read_text().splitlines()
    return [(r["epoch"], r["positions"]) for r in map(json.loads, lines)]


def test_a_ddp_fit_resumes_from_a_mid_epoch_checkpoint_exactly_once(
    cache: Path, tmp_path: Path
) -> None:
    """Two ranks under Lightning's DDP strategy stop after 12 steps (a crash),
    and a new fit resumes from the step-10 checkpoint: with the 10 steps before
    it, every position of both epochs once, each rank its own share."""
    fit_ddp(tmp_path, cache, "crashed", 2, max_steps=12)
    checkpoint = tmp_path / "checkpoints" / "step=10.ckpt"
    assert checkpoint.exists(), sorted((tmp_path / "checkpoints").iterdir())
    fit_ddp(tmp_path, cache, "resumed", 2, resume=str(checkpoint))
    per_step = RECORDS // (2 * BATCH)
    for rank in range(2):
        delivered = steps(tmp_path, "crashed", rank)[:10] + steps(tmp_path, "resumed", rank)
        assert len(delivered) == 2 * per_step
        for q, (epoch, positions) in enumerate(delivered):
            # Rank r's q-th batch of an epoch is block r + 2q (the partition rule).
            block = epoch * RECORDS // BATCH + rank + 2 * (q % per_step)
            assert epoch == q // per_step
            assert positions == list(range(block * BATCH, (block + 1) * BATCH))
