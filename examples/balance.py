"""Class balancing with Polars weights: every class drawn equally often.

A cache of 1,000 records in three imbalanced classes is written once (a second
run reuses it without running the source again). Its metadata is read as a
Polars DataFrame; the training split is kept and every row is weighted by the
inverse of its class's frequency, so each class has the same total weight. The
table goes back with ``update_metadata`` (validated in Rust, all or nothing) and
one weighted epoch of 3,000 draws is counted by class.

    uv run python examples/balance.py

It writes ``./.data/caches/shapes_v1`` (``--base-dir`` to change it). On every
run (the draws are a function of the seed) it prints:

    cache: .data/caches/shapes_v1
    train rows per class: [560, 180, 160]
    weight per class: [1.0, 1.0, 1.0]
    drawn per class in 3000 samples: [987, 994, 1019]
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import polars as pl

import dataset_rt as drt

CLASSES = 3


class Shapes:
    """1,000 records of 16 bytes: 630 of class 0, 200 of class 1, 170 of class 2;
    every tenth record is in the validation split."""

    name = "shapes_v1"  # the cache directory name, part of the cache's identity

    def __len__(self) -> int:
        return 1000

    def __iter__(self) -> Iterator[drt.CacheInput]:
        for index in range(1000):
            label = 0 if index % 100 < 63 else 1 if index % 100 < 83 else 2
            yield drt.CacheInput(
                data=index.to_bytes(4, "little") * 4,  # stands for an encoded image
                metadata={"label": label, "split": "val" if index % 10 == 0 else "train"},
            )


def per_class(table: pl.DataFrame, value: pl.Expr) -> list[float]:
    """``value`` aggregated per label, in label order."""
    column = value.meta.output_name()
    return table.group_by("label").agg(value).sort("label").get_column(column).to_list()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-dir", type=Path, default=Path(".data") / "caches")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    runtime = drt.DatasetRuntime(num_workers=2)
    result = runtime.from_cache_sources(
        Shapes(), args.base_dir, reader_config=drt.ReaderConfig(seed=args.seed)
    )
    if isinstance(result, drt.CacheSourcesDatasetError):
        raise SystemExit(f"cannot open the cache: {result.message}")
    dataset = result.dataset

    table = dataset.get_metadata()  # cache_id, sample_id, label, split, weight
    train = table.filter(pl.col("split") == "train")
    balanced = train.with_columns((1.0 / pl.len().over("label")).alias("weight"))
    dataset.update_metadata(balanced)  # refused whole if a row or a weight is wrong
    dataset.set_epoch_len(3000)

    drawn = pl.concat(
        pl.DataFrame(batch.select(["label"])) for batch in dataset.iter_batches(columns=["label"])
    )
    print(f"cache: {dataset.cache_paths[0]}")
    print("train rows per class:", per_class(balanced, pl.len().alias("rows")))
    weights = per_class(balanced, pl.col("weight").sum())
    print("weight per class:", [round(w, 9) for w in weights])
    print(f"drawn per class in {len(dataset)} samples:", per_class(drawn, pl.len().alias("n")))


if __name__ == "__main__":
    main()
