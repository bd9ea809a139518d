"""Train on Ray with exact resume: a TorchTrainer whose workers stream their rank's share.

Each Ray Train worker reads its rank's share of every epoch of the dataset that
examples/ray_write.py wrote (in-process: `DatasetLoader` over a `LocalSource`), and
rank 0 checkpoints the model, the optimizer and the loader's state through
``ray.train.report(checkpoint=...)``. ``--kill-at STEP`` makes rank 1 die abruptly
(``os._exit``) once, right after the checkpoint of that step: Ray Train restarts the
workers from its latest checkpoint and the loader resumes exactly there (no sample
twice, none skipped). ``--resume-from`` starts a new run, with any number of
workers, from a checkpoint directory a previous run left.

    uv run python examples/ray_write.py                  # once: datasets/images
    uv run python examples/ray_train.py --kill-at 12     # 2 workers; rank 1 dies at step 12
    uv run python examples/ray_train.py --workers 3 --epochs 3 --resume-from ray_train.ckpt

Every worker appends what each of its steps delivered to ``ray_train.log/`` (the
positions and sample ids), and the run's final loader state goes to
``ray_train.pt``; the audit recomputes what the run saw from it (docs/distributed.md):

    uv run python -m dataset_rt audit ray_train.pt --seen --cache datasets/images \\
        --state-dir datasets/images.state
"""

from __future__ import annotations

import os

# Before Ray is imported: Ray's workers run this interpreter (the environment
# `uv sync --group ray` made). Under `uv run`, Ray would otherwise start them with
# `uv run` in an environment of the project's default groups, which lacks Ray.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

import argparse
import json
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import ray
import ray.train
import torch
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from torch import nn
from torch.nn.parallel import DistributedDataParallel

PIXELS = 64  # examples/ray_write.py writes 64-byte records


def features(payloads: list[bytes]) -> torch.Tensor:
    data = torch.frombuffer(bytearray(b"".join(p[:PIXELS] for p in payloads)), dtype=torch.uint8)
    return data.view(len(payloads), PIXELS).float() / 255.0


def train_loop(config: dict[str, Any]) -> None:
    """One Ray Train worker: its rank's share of each epoch, checkpointed through Ray."""
    import torch.distributed as dist

    from dataset_rt.loader import LocalSource
    from dataset_rt.torch import DatasetLoader

    rank = ray.train.get_context().get_world_rank()
    source = LocalSource(
        [config["location"]], config["state_dir"], name="images", show_progress=False
    )
    loader = DatasetLoader(
        source,
        "images",
        batch_size=config["batch_size"],
        seed=7,
        epoch_len=config["epoch_len"],
        columns=["label"],
    )
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(PIXELS, 16), nn.Linear(16, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None and config["resume_from"]:
        checkpoint = Checkpoint(config["resume_from"])
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            saved = torch.load(Path(directory) / "state.pt", weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])
        step = saved["step"]

    attempt = uuid.uuid4().hex[:8]  # one per worker process: a restart is a new attempt
    log = Path(config["log_dir"]) / f"rank{rank}-{attempt}.jsonl"

    def report(final: bool = False) -> None:
        with tempfile.TemporaryDirectory() as directory:
            saved = None
            if rank == 0:
                state = {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "loader": loader.state_dict(),
                    "step": step,
                }
                torch.save(state, Path(directory) / "state.pt")
                saved = Checkpoint.from_directory(directory)
            metrics = {"step": step, "epoch": loader.epoch, "final": final}
            ray.train.report(metrics, checkpoint=saved)

    for epoch in range(loader.epoch, config["epochs"]):
        loader.set_epoch(epoch)  # keeps the position when resuming inside this epoch
        for batch in loader:
            loss = nn.functional.cross_entropy(model(features(batch["payload"])), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            with log.open("a") as out:
                record = {
                    "step": step,
                    "epoch": epoch,
                    "positions": batch["position"].tolist(),
                    "ids": list(
                        zip(batch["cache_id"].tolist(), batch["sample_id"].tolist(), strict=True)
                    ),
                }
                out.write(json.dumps(record) + "\n")
            if step % config["checkpoint_every"] == 0:
                report()
                killed = Path(config["log_dir"]) / "killed"
                if step == config["kill_at"] and not killed.exists():
                    # Every rank decides before the barrier; after it, rank 0's
                    # checkpoint is persisted and rank 1 dies.
                    dist.barrier()
                    if rank == 1:
                        killed.touch()
                        os._exit(1)
    report(final=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--location", default="datasets/images", help="the dataset")
    parser.add_argument("--workers", type=int, default=2, help="Ray Train workers (ranks)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--epoch-len", type=int, default=2048, help="samples per epoch")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--checkpoint-every", type=int, default=4, help="steps")
    parser.add_argument("--kill-at", type=int, help="rank 1 dies once after this checkpoint")
    parser.add_argument("--resume-from", type=Path, help="a checkpoint directory")
    parser.add_argument("--address", help="a running Ray cluster (default: start a local one)")
    parser.add_argument("--output", type=Path, default=Path("ray_train"), help="path prefix")
    args = parser.parse_args()
    if args.kill_at is not None and args.kill_at % args.checkpoint_every:
        parser.error("--kill-at must be a multiple of --checkpoint-every")

    location = Path(args.location).resolve()
    log_dir = Path(f"{args.output}.log").resolve()
    log_dir.mkdir(exist_ok=True)
    ray.init(address=args.address, log_to_driver=False, include_dashboard=False)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={
            "location": str(location),
            "state_dir": f"{location}.state",
            "epochs": args.epochs,
            "epoch_len": args.epoch_len,
            "batch_size": args.batch_size,
            "checkpoint_every": args.checkpoint_every,
            "kill_at": args.kill_at,
            "log_dir": str(log_dir),
            "resume_from": str(args.resume_from.resolve()) if args.resume_from else None,
        },
        # As many workers as asked for, also on a machine with fewer CPUs.
        scaling_config=ScalingConfig(
            num_workers=args.workers,
            use_gpu=False,
            resources_per_worker={"CPU": min(1.0, ray.cluster_resources()["CPU"] / args.workers)},
        ),
        run_config=RunConfig(
            name=f"ray_train-{uuid.uuid4().hex[:8]}",
            storage_path=str(Path(f"{args.output}.runs").resolve()),
            failure_config=FailureConfig(max_failures=2),
        ),
    )
    result = trainer.fit()
    ray.shutdown()
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as directory:
        final = Path(f"{args.output}.ckpt")
        shutil.rmtree(final, ignore_errors=True)
        shutil.copytree(directory, final)  # --resume-from it
        shutil.copy(final / "state.pt", f"{args.output}.pt")  # for the audit
    metrics = result.metrics
    print(f"done: {args.workers} workers, step {metrics['step']}, epoch {metrics['epoch']}")


if __name__ == "__main__":
    main()
