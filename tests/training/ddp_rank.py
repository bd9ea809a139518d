"""One rank of a real data-parallel training run, for tests/training/test_ddp.py.

Started once per rank with the ``torch.distributed`` environment (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and the path of a JSON spec:

- ``face``: ``"flight"`` (``locations``) or ``"local"`` (``caches``, ``state_dir``)
- ``dataset``, ``seed``, ``batch_size``, ``workers``, ``log`` (a path prefix)
- ``checkpoint_at`` / ``checkpoint``: after that many steps rank 0 saves the model
  and the loader state there (``torch.save``), then every rank goes on slowly
  (``linger`` seconds per step) until the test kills it
- ``resume``: a checkpoint to start from
- ``switch_at``: before that step rank 0 puts a population of label 2 only and
  every rank switches to it at the agreed position
- ``step_sleep``: seconds to wait after each step (to let a test act mid-epoch)
- ``save_every``: rank 0 saves the checkpoint (to ``checkpoint``) after every that
  many steps and logs ``{"saved": step}``; a rank whose run was resumed elsewhere
  (``FencedError`` from its loader) logs ``{"fenced": message}`` and exits with 3

Each rank trains a small model under DistributedDataParallel on the ``gloo``
backend (so the ranks step in lockstep, as real training does) and appends one
JSON line per step to ``<log>.rank<r>``: the step (of this process, and of the
run's epoch), the positions and the ids.
Like a real training script, it talks to the data service before it creates
the loader (reading the metadata), and it never sets a start method itself.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import polars as pl
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dataset_rt.errors import FencedError
from dataset_rt.torch import DatasetLoader

FEATURES = 32


def features(batch: dict[str, Any]) -> torch.Tensor:
    rows = [list(p[:FEATURES].ljust(FEATURES, b"\0")) for p in batch["payload"]]
    return torch.tensor(rows, dtype=torch.float32) / 255.0


def save(path: str, model: Any, optimizer: Any, loader: DatasetLoader) -> None:
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "loader": loader.state_dict(),  # FencedError here: nothing is written
    }
    partial = Path(path + ".partial")
    torch.save(state, partial)
    os.replace(partial, path)


def fenced(log: Any, error: FencedError) -> None:
    log.write(json.dumps({"fenced": str(error)}) + "\n")
    log.flush()
    os._exit(3)


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dataset = spec["dataset"]
    if spec["face"] == "flight":
        from flight_client import DatasetClient, FlightSource

        client = DatasetClient(spec["locations"], retries=4, backoff=0.05)
        table = client.get_metadata(dataset)  # the service is used before the loader

        def put(frame: pl.DataFrame) -> str:
            return client.update_metadata(dataset, frame, activate=False)

        source: Any = FlightSource(spec["locations"], retries=4, backoff=0.05)
    else:
        from dataset_rt.loader import LocalSource

        source = LocalSource(spec["caches"], spec["state_dir"], name=dataset)
        table = source.metadata()

        def put(frame: pl.DataFrame) -> str:
            return str(source.put(frame, activate=False))

    loader = DatasetLoader(
        source,
        dataset,
        batch_size=spec["batch_size"],
        seed=spec["seed"],
        columns=["label"],
        num_workers=spec["workers"],
    )
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(FEATURES, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if spec.get("resume"):
        saved = torch.load(spec["resume"], weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])

    with Path(f"{spec['log']}.rank{rank}").open("a") as log:
        batches = iter(loader)
        step = 0
        while True:
            if spec.get("switch_at") == step:
                chosen = [put(table.filter(pl.col("label") == 2)) if rank == 0 else None]
                dist.broadcast_object_list(chosen, src=0)
                at = loader.switch_population(str(chosen[0]))
                log.write(json.dumps({"switch": at, "population": chosen[0]}) + "\n")
            try:
                batch = next(batches)
            except StopIteration:
                break
            except FencedError as error:
                fenced(log, error)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(features(batch)), batch["label"])
            loss.backward()
            optimizer.step()
            record = {
                "step": step,
                # The run's own count of this epoch's batches (a resumed run goes on).
                "epoch_step": loader.run_state.steps - 1,
                "positions": batch["position"].tolist(),
                "ids": list(
                    zip(batch["cache_id"].tolist(), batch["sample_id"].tolist(), strict=True)
                ),
                "labels": batch["label"].tolist(),
            }
            log.write(json.dumps(record) + "\n")
            log.flush()
            step += 1
            if spec.get("save_every") and step % spec["save_every"] == 0 and rank == 0:
                try:
                    save(spec["checkpoint"], model, optimizer, loader)
                except FencedError as error:
                    fenced(log, error)
                log.write(json.dumps({"saved": step}) + "\n")
                log.flush()
            if spec.get("checkpoint_at") == step:
                if rank == 0:
                    save(spec["checkpoint"], model, optimizer, loader)
                dist.barrier()
                spec["step_sleep"] = spec.get("linger", 1.0)
            time.sleep(spec.get("step_sleep", 0.0))
        log.write(json.dumps({"done": True, "state": loader.state_dict()}) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
