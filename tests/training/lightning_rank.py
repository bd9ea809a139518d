"""One rank of a Lightning DDP fit, for tests/training/test_lightning.py.

Started once per rank with ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``
(Lightning then takes the processes as created externally, as under torchrun)
and the path of a JSON spec: ``caches``, ``state_dir``, ``dataset``, ``seed``,
``batch_size``, ``workers``, ``world_size``, ``epochs``, ``log`` (one JSON line
per step to ``<log>.rank<r>``: epoch and positions), ``checkpoints`` (a
directory: a checkpoint every ``every`` steps), ``max_steps`` (stop there, as a
crashed fit would) and ``resume`` (a checkpoint to fit from).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

from dataset_rt.integrations.lightning import DatasetDataModule
from dataset_rt.loader import LocalSource


class Logged(pl.LightningModule):  # type: ignore[misc]
    def __init__(self, log: Path) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.log_path = log

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        line = {"epoch": self.current_epoch, "positions": batch["position"].tolist()}
        with self.log_path.open("a") as out:
            out.write(json.dumps(line) + "\n")
        return self.layer(batch["label"].float().unsqueeze(1)).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    source = LocalSource(spec["caches"], spec["state_dir"], name=spec["dataset"])
    data = DatasetDataModule(
        source,
        spec["dataset"],
        batch_size=spec["batch_size"],
        seed=spec["seed"],
        columns=["label"],
        num_workers=spec["workers"],
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=spec["world_size"],
        strategy="ddp",
        max_epochs=spec["epochs"],
        max_steps=spec.get("max_steps", -1),
        callbacks=[
            pl.callbacks.ModelCheckpoint(
                dirpath=spec["checkpoints"],
                every_n_train_steps=spec["every"],
                save_top_k=-1,
                filename="{step}",
            )
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    rank = trainer.global_rank
    model = Logged(Path(f"{spec['log']}.rank{rank}"))
    trainer.fit(model, datamodule=data, ckpt_path=spec.get("resume"))


if __name__ == "__main__":
    main()
