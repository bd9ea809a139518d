"""The embedded demo dataset: built on first start, reused afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dataset_rt as drt
from dataset_rt import service as engine
from dataset_rt.progress import end_engine_bar_line

DEMO_NAME = "demo"
DEMO_RECORDS = 2000


class DemoSource:
    """2000 records of 1 KiB: ten imbalanced classes of synthetic 'images'."""

    name = "demo_v1"

    def __len__(self) -> int:
        return DEMO_RECORDS

    def __iter__(self) -> Iterator[drt.CacheInput]:
        for index in range(DEMO_RECORDS):
            label = min(index % 16, 9)  # class 9 is seven times more common
            pixel = (index * 37) % 251
            yield drt.CacheInput(
                data=bytes([pixel]) * 1024,
                metadata={"label": label, "split": "train" if index % 10 else "val"},
            )


def ensure_demo_cache(
    runtime: drt.DatasetRuntime, data_dir: Path, *, show_progress: bool = True
) -> Path:
    """The demo cache under ``data_dir/caches``, written if it is missing (with
    the writer's progress bar on a terminal unless ``show_progress`` is False)."""
    base = data_dir / "caches"
    path = base / DemoSource.name
    if path.exists():
        engine.check_cache(str(path), False)  # refuse a damaged cache loudly
        return path
    config = drt.WriterConfig(show_progress=show_progress)
    [result] = runtime.write_cache(DemoSource(), base, writer_config=config)
    if show_progress:
        end_engine_bar_line()
    if isinstance(result, drt.CacheWriteError):
        raise RuntimeError(f"cannot build the demo cache: {result.message}")
    return result.path
