"""PyTorch adapter: a `CachedDataset` as a ``torch.utils.data.IterableDataset``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

try:
    from torch.utils.data import IterableDataset, get_worker_info  # type: ignore[import-not-found, unused-ignore]
except ImportError as error:  # pragma: no cover - exercised when torch is absent
    raise ImportError(
        "to_torch_iterable_dataset() needs PyTorch; install it with "
        "`pip install torch` (or the project's `torch` extra)"
    ) from error

from dataset_rt.records import CachedSample

if TYPE_CHECKING:
    from dataset_rt.dataset import CachedDataset


class CachedIterableDataset(IterableDataset[CachedSample]):  # type: ignore[misc]
    """Each ``iter()`` takes the dataset's next epoch; DataLoader workers split it.

    Worker ``w`` of ``n`` reads positions ``w, w + n, ...`` of the epoch, so the
    workers together read every position once.
    """

    def __init__(self, dataset: CachedDataset) -> None:
        self._dataset = dataset

    def __len__(self) -> int:
        return len(self._dataset)

    def __iter__(self) -> Iterator[CachedSample]:
        info = get_worker_info()
        if info is None:
            return iter(self._dataset)
        engine = self._dataset._engine
        return engine.samples(rank=info.id, world_size=info.num_workers)
