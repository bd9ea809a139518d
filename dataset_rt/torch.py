"""PyTorch adapter: a `CachedDataset` as a ``torch.utils.data.IterableDataset``."""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Protocol

try:
    from torch.utils.data import IterableDataset, get_worker_info  # type: ignore[import-not-found, unused-ignore]
except ImportError as error:  # pragma: no cover - exercised when torch is absent
    raise ImportError(
        "to_torch_iterable_dataset() needs PyTorch; install it with "
        "`pip install torch` (or the project's `torch` extra)"
    ) from error

from dataset_rt.records import CachedSample


class EpochSource(Sized, Protocol):
    """What the adapter reads: a `CachedDataset` (kept structural so this module
    does not import the dataset module, which imports this one lazily)."""

    def __iter__(self) -> Iterator[CachedSample]: ...

    def iter_samples(self, *, rank: int = 0, world_size: int = 1) -> Iterator[CachedSample]: ...


class CachedIterableDataset(IterableDataset[CachedSample]):  # type: ignore[misc]
    """Each ``iter()`` takes the dataset's next epoch; DataLoader workers split it.

    Worker ``w`` of ``n`` reads positions ``w, w + n, ...`` of the epoch, so the
    workers together read every position once.
    """

    def __init__(self, dataset: EpochSource) -> None:
        self._dataset = dataset

    def __len__(self) -> int:
        return len(self._dataset)

    def __iter__(self) -> Iterator[CachedSample]:
        info = get_worker_info()
        if info is None:
            return iter(self._dataset)
        return self._dataset.iter_samples(rank=info.id, world_size=info.num_workers)
