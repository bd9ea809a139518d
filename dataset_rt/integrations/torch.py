"""`to_torch_iterable_dataset`: a `CachedDataset` as a sized PyTorch ``IterableDataset``.

PyTorch is imported when the adapter is made, not when ``dataset_rt`` is: the
package works without it. Each ``iter()`` of the adapter takes the dataset's next
epoch, in the calling process. As in dataset-rt 0.4.8, DataLoader workers are
refused (``RuntimeError``): each worker would read a forked copy of the dataset
whose position never reaches the parent, so without persistent workers every
epoch would repeat the first. For DataLoader workers (and ranks, exact resume and
checkpoints) use `dataset_rt.torch.DatasetLoader` (docs/training.md); the
runtime's ``num_workers`` threads already read and decode in parallel.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sized
from importlib import import_module
from types import ModuleType
from typing import Any, Protocol

from dataset_rt.records import CachedSample, SizedTorchIterableDataset


class EpochSource(Sized, Protocol):
    """What the adapter reads: a `CachedDataset`."""

    def __iter__(self) -> Iterator[CachedSample]: ...


def to_torch_iterable_dataset(dataset: EpochSource) -> SizedTorchIterableDataset:
    """Wrap ``dataset``; raises ImportError (saying PyTorch is needed) without torch."""
    try:
        torch_data = import_module("torch.utils.data")
    except ImportError as error:
        raise ImportError(
            "CachedDataset.to_torch_iterable_dataset requires PyTorch to be installed "
            "(pip install torch, or the project's `torch` dependency group)"
        ) from error
    adapter: SizedTorchIterableDataset = _adapter_class(torch_data)(dataset)
    return adapter


@functools.cache
def _adapter_class(torch_data: ModuleType) -> Any:
    """The adapter class over ``torch_data.IterableDataset`` (one per torch module)."""

    class CachedIterableDataset(torch_data.IterableDataset):  # type: ignore[misc, name-defined]
        """Each ``iter()`` takes the dataset's next epoch (DataLoader workers refused)."""

        def __init__(self, dataset: EpochSource) -> None:
            self._dataset = dataset

        def __len__(self) -> int:
            return len(self._dataset)

        def __iter__(self) -> Iterator[CachedSample]:
            if torch_data.get_worker_info() is not None:
                raise RuntimeError(
                    "Use Dataloader with num workers = 0. Use DatasetRuntime(num_workers=N) "
                    "for parallel cache reads, or dataset_rt.torch.DatasetLoader to read with "
                    "DataLoader workers (each worker a disjoint part of every epoch, with "
                    "exact resume)"
                )
            return iter(self._dataset)

    CachedIterableDataset.__module__ = __name__
    return CachedIterableDataset
