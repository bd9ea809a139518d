"""`DatasetDataModule`: the training loader as a Lightning ``LightningDataModule``.

The Trainer owns the loop; the data module owns the data's place in it. Its
``state_dict`` is the loader's (the run's state, see docs/training.md), which
the Trainer writes into every checkpoint and gives back on ``fit(ckpt_path=...)``
before the first batch is read, so a resumed fit continues at the next batch
after the checkpoint, each sample exactly once, with the fencing of the run's
older generations. Ranks come from the Trainer (``global_rank``,
``world_size``); every epoch starts with the loader's ``set_epoch`` at the
Trainer's ``current_epoch``.

Lightning counts batches per epoch and stops an epoch at its count, so a
checkpoint taken in the middle of an epoch resumes under Lightning only with
the world size and batch size it was taken with (refused otherwise, saying
so); an end-of-epoch checkpoint resumes at any. The loader itself resumes
anywhere (`dataset_rt.torch.DatasetLoader` in a loop of your own).

Works with ``lightning`` (``lightning.pytorch``) or ``pytorch_lightning``:
whichever the training script imported first, else whichever is installed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from importlib import import_module
from typing import Any

from dataset_rt.errors import InvalidArgumentError
from dataset_rt.loader import RunState, StreamSource
from dataset_rt.torch import DatasetLoader


def _lightning() -> Any:
    """The Lightning package the training script uses."""
    names = ("lightning.pytorch", "pytorch_lightning")
    for name in names:
        if name in sys.modules:
            return sys.modules[name]
    for name in names:
        try:
            return import_module(name)
        except ImportError:
            continue
    raise ImportError(
        "dataset_rt.integrations.lightning needs Lightning: `pip install lightning` "
        "(or pytorch-lightning; the project's `torch` dependency group has it)"
    )


class DatasetDataModule(_lightning().LightningDataModule):  # type: ignore[misc]
    """The training data of a Lightning run: a `DatasetLoader` per rank.

    ``source``, ``dataset``, ``batch_size``, ``seed`` and ``loader_options``
    (``columns``, ``num_workers``, ``shuffle``, ``population``, ``epoch_len``,
    ``transform``, ...) are `DatasetLoader`'s. ``train_dataloader()`` gives the
    Trainer the loader of this rank; `loader` is that loader once the Trainer
    has set the module up (for ``switch_population``, ``input_stats``...).
    """

    def __init__(
        self,
        source: StreamSource,
        dataset: str,
        *,
        batch_size: int,
        seed: int,
        **loader_options: Any,
    ) -> None:
        super().__init__()
        for refused in ("rank", "world_size", "epoch"):
            if refused in loader_options:
                raise InvalidArgumentError(
                    f"{refused!r} comes from the Trainer (global_rank, world_size, "
                    f"current_epoch); do not pass it to DatasetDataModule"
                )
        self.source = source
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.loader_options = loader_options
        self._loader: DatasetLoader | None = None

    @property
    def loader(self) -> DatasetLoader:
        if self._loader is None:
            raise InvalidArgumentError(
                "the DatasetDataModule has no loader yet: the Trainer makes it when it sets "
                "the module up (trainer.fit), or call setup('fit') yourself"
            )
        return self._loader

    def setup(self, stage: str) -> None:
        if stage != "fit" or self._loader is not None:
            return
        trainer = getattr(self, "trainer", None)
        self._loader = DatasetLoader(
            self.source,
            self.dataset,
            batch_size=self.batch_size,
            seed=self.seed,
            rank=trainer.global_rank if trainer is not None else None,
            world_size=trainer.world_size if trainer is not None else None,
            **self.loader_options,
        )

    def train_dataloader(self) -> EpochLoader:
        return EpochLoader(self.loader, self)

    def state_dict(self) -> dict[str, Any]:
        """The loader's state (a `FencedError` if the run was resumed elsewhere:
        a checkpoint of an older generation must not be written)."""
        if self._loader is None:
            return {}
        return {"loader": self._loader.state_dict()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        saved = state_dict.get("loader") if isinstance(state_dict, Mapping) else None
        if saved is None:
            return
        loader = self.loader
        loaded = RunState.from_dict(saved)
        mid_epoch = 0 < loaded.position < loaded.epoch_len
        if mid_epoch and (loaded.world_size, loaded.batch_size) != (
            loader.world_size,
            loader.batch_size,
        ):
            raise InvalidArgumentError(
                f"this checkpoint was taken {loaded.position} positions into epoch "
                f"{loaded.epoch} by {loaded.world_size} ranks of batch size "
                f"{loaded.batch_size}; Lightning counts an epoch's batches and would end "
                f"this one at the wrong count with {loader.world_size} ranks of batch size "
                f"{loader.batch_size}. Resume it with world size {loaded.world_size} and "
                f"batch size {loaded.batch_size}, or from an end-of-epoch checkpoint, or "
                f"with DatasetLoader in a loop of your own (it resumes at any)"
            )
        loader.load_state_dict(saved)


class EpochLoader:
    """What the Trainer iterates: this rank's loader, each iteration at the
    Trainer's current epoch. Its length is a whole epoch's batches for this
    rank, the count Lightning's progress and epoch end go by; a resumed epoch
    yields the batches after the checkpoint, and the Trainer, which restored
    its own count of the batches before it, ends the epoch where it ends."""

    def __init__(self, loader: DatasetLoader, module: DatasetDataModule) -> None:
        self.loader = loader
        self.module = module

    def __len__(self) -> int:
        state = self.loader.run_state
        return state.epoch_len // (state.world_size * state.batch_size)

    def __iter__(self) -> Iterator[Any]:
        # Now, not in a generator: Lightning asks the length right after iter().
        trainer = getattr(self.module, "trainer", None)
        if trainer is not None:
            self.loader.set_epoch(trainer.current_epoch)
        return iter(self.loader)
