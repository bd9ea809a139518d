"""A ``torch.utils.data.IterableDataset`` over a Flight epoch stream.

Importable without torch; constructing the dataset needs torch. Rank and world
size come from ``torch.distributed`` when it is initialised; DataLoader workers
split a rank's partition further by stride.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from flight_client.client import DatasetClient, EpochSample

try:
    import torch.distributed as _dist  # type: ignore[import-not-found, unused-ignore]
    from torch.utils.data import (  # type: ignore[import-not-found, unused-ignore]
        IterableDataset as _Base,
    )
    from torch.utils.data import get_worker_info as _worker_info
except ImportError:  # pragma: no cover - depends on the environment
    _Base = object
    _dist = None
    _worker_info = None


class FlightEpochDataset(_Base):  # type: ignore[misc, valid-type, unused-ignore]
    """Epoch ``epoch`` of ``dataset`` for this process's rank."""

    def __init__(
        self,
        location: str | list[str],
        dataset: str,
        *,
        seed: int,
        epoch: int = 0,
        token: str | None = None,
        columns: tuple[str, ...] = (),
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if _worker_info is None:
            raise ImportError(
                "FlightEpochDataset needs PyTorch; install it with `pip install torch`"
            )
        super().__init__()
        self.location = location
        self.dataset = dataset
        self.seed = seed
        self.epoch = epoch
        self.token = token
        self.columns = columns
        distributed = _dist is not None and _dist.is_available() and _dist.is_initialized()
        self.rank = rank if rank is not None else (_dist.get_rank() if distributed else 0)
        self.world_size = (
            world_size if world_size is not None else (_dist.get_world_size() if distributed else 1)
        )

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[EpochSample]:
        info: Any = _worker_info() if _worker_info is not None else None
        workers = info.num_workers if info is not None else 1
        worker = info.id if info is not None else 0
        client = DatasetClient(self.location, token=self.token)
        # Worker w of n reads rank slots w, w+n, ... of a world of size world_size * n.
        yield from client.epoch(
            self.dataset,
            self.seed,
            self.epoch,
            rank=self.rank * workers + worker,
            world_size=self.world_size * workers,
            columns=self.columns,
        )
