"""Preprocess on Ray, cache once: a dataset of many caches written by Ray Data tasks.

Ray tasks turn 20,000 source rows into records (here a stand-in for decoding and
resizing images: bytes derived from the row), and `CacheDatasink` writes each Ray
write task's records as one part, then commits one dataset over all parts when the
job ends. The dataset is then opened in this process as one dataset, as the Flight
server would serve it (``--dataset images=datasets/images``). A second run finds the
dataset committed and only opens it.

    uv sync --group ray
    uv run python examples/ray_write.py                   # a local Ray of its own
    uv run python examples/ray_write.py --address HOST:PORT   # an existing cluster

It prints:

    20000 records in 4 parts
    label 0: 2000 records, first payload 0000000000000000
    label 9: 2000 records, first payload 0900000000000000
"""

from __future__ import annotations

import os

# Before Ray is imported: Ray's workers run this interpreter (the environment
# `uv sync --group ray` made). Under `uv run`, Ray would otherwise start them with
# `uv run` in an environment of the project's default groups, which lacks Ray.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

import argparse
from typing import Any

import numpy as np
import polars as pl
import ray

import dataset_rt as drt
from dataset_rt.parts import read_descriptor
from dataset_rt.ray import CacheDatasink

LOCATION = "datasets/images"
ROWS = 20_000
PARTS = 4


def preprocess(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """The expensive step the cache keeps: one payload and one label per source row."""
    ids = batch["id"]
    return {
        "image": [int(i).to_bytes(8, "little") * 8 for i in ids],
        "label": ids % 10,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--address", help="a running Ray cluster (default: start a local one)")
    args = parser.parse_args()
    if read_descriptor(LOCATION) is None:
        ray.init(address=args.address, log_to_driver=False, include_dashboard=False)
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.execution_options.preserve_order = True  # the dataset in the source's order
        ds = ray.data.range(ROWS, override_num_blocks=PARTS).map_batches(preprocess)
        sink = CacheDatasink(LOCATION, name="images", payload_column="image")
        ds.write_datasink(sink)
        ray.shutdown()

    runtime = drt.DatasetRuntime(num_workers=2)
    dataset = runtime.open_dataset(LOCATION, reader_config=drt.ReaderConfig(seed=0))
    print(f"{dataset.num_rows} records in {len(dataset.cache_paths)} parts")
    table = dataset.get_metadata()
    for label in (0, 9):
        rows = table.filter(pl.col("label") == label)
        first = rows.row(0, named=True)
        payload = dataset.get_item(first["cache_id"], first["sample_id"]).data
        print(f"label {label}: {rows.height} records, first payload {payload[:8].hex()}")


if __name__ == "__main__":
    main()
