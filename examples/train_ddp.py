"""Data-parallel training on the demo dataset, with a loader that checkpoints.

Start a server (``uv run python -m flight_server``), then train with two ranks:

    uv run torchrun --standalone --nproc-per-node 2 examples/train_ddp.py

Every ``--checkpoint-every`` steps rank 0 saves the model, the optimizer and the
loader's state in one file. Run the same command again (with any number of
ranks and ``--workers``) and training resumes where the checkpoint was taken,
without repeating or losing a sample. ``--crash-after N`` ends every rank
abruptly after N steps (to try it); ``--balance-at N`` reweights the classes to
equal shares at step N, mid-epoch, on every rank at once. See docs/training.md.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import polars as pl
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from flight_client import DatasetClient
from flight_client.torch import FlightLoader

PIXELS = 64  # the first bytes of each 1 KiB demo record are its features


def to_example(sample: dict[str, Any]) -> dict[str, torch.Tensor]:
    """One sample in a DataLoader worker: bytes to a feature tensor."""
    pixels = torch.frombuffer(bytearray(sample["payload"][:PIXELS]), dtype=torch.uint8)
    return {"x": pixels.float() / 255.0, "y": torch.tensor(sample["label"])}


def balanced(table: pl.DataFrame) -> pl.DataFrame:
    """Every class gets the same total weight."""
    return table.with_columns((1.0 / pl.len().over("label")).alias("weight"))


def save(path: Path, **parts: Any) -> None:
    """Write the checkpoint whole or not at all (a crash never leaves half of one)."""
    partial = path.with_suffix(".partial")
    torch.save(parts, partial)
    os.replace(partial, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--location", default="grpc://127.0.0.1:8815", help="the server")
    parser.add_argument("--dataset", default="demo")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    parser.add_argument("--checkpoint", type=Path, default=Path("train_ddp.pt"))
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps")
    parser.add_argument("--crash-after", type=int, help="end abruptly after this many steps")
    parser.add_argument("--balance-at", type=int, help="reweight the classes at this step")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR/PORT
    rank = dist.get_rank()
    client = DatasetClient(args.location)
    table = client.get_metadata(args.dataset)  # talk to the server before the loader

    loader = FlightLoader(
        args.location,
        args.dataset,
        batch_size=args.batch_size,
        seed=7,
        columns=["label"],
        num_workers=args.workers,
        transform=to_example,
    )
    torch.manual_seed(0)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(PIXELS, 32), nn.ReLU(), nn.Linear(32, 10))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    step = 0
    if args.checkpoint.exists():
        saved = torch.load(args.checkpoint, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])
        step = saved["step"]
        if rank == 0:
            print(f"resumed at step {step}: epoch {loader.epoch}, position {loader.position}")

    for epoch in range(loader.epoch, args.epochs):
        loader.set_epoch(epoch)  # keeps the position when resuming inside this epoch
        for batch in loader:
            loss = nn.functional.cross_entropy(model(batch["x"]), batch["y"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step == args.balance_at:
                # Rank 0 stores the new population; every rank switches at the
                # same position (agreed through torch.distributed).
                new = (
                    client.update_metadata(args.dataset, balanced(table), activate=False)
                    if rank == 0
                    else None
                )
                chosen = [new]
                dist.broadcast_object_list(chosen, src=0)
                at = loader.switch_population(str(chosen[0]))
                if rank == 0:
                    print(f"balanced classes from position {at}")
            if step % args.checkpoint_every == 0 and rank == 0:
                save(
                    args.checkpoint,
                    model=model.state_dict(),
                    optimizer=optimizer.state_dict(),
                    loader=loader.state_dict(),
                    step=step,
                )
            if step == args.crash_after:
                dist.barrier()  # the checkpoint is on disk before anyone dies
                os._exit(3)
        if rank == 0:
            print(f"epoch {epoch} done at step {step}, loss {loss.item():.3f}")
    client.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
