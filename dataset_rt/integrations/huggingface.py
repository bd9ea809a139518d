"""`HFIterableDataset`: a rank's share of each epoch, one example at a time, in the
manner of a Hugging Face ``datasets.IterableDataset``.

Code written for a streaming ``datasets.IterableDataset`` keeps working:
``for example in ds`` yields dicts, ``with_format("numpy" | "torch" | "arrow")``
changes their containers, ``iter(batch_size=...)`` yields batches,
``set_epoch(e)`` starts epoch ``e`` (as ``transformers.Trainer`` calls it), and
``state_dict()`` / ``load_state_dict()`` resume at the example after the last one
yielded, as Hugging Face's do. What differs is underneath: the stream is the
engine's (weighted draws or a permutation of the active population, each epoch
a different one), every rank's share is disjoint (``rank`` and ``world_size``
default to ``torch.distributed``'s), and a state taken at a block boundary
resumes at any world size (a `dataset_rt.batches.BatchLoader` reads ``block``
examples at a time; see docs/training.md).

Iterating again continues where the last iteration stopped (it does not restart
the epoch, which would deliver examples twice); an epoch read to its end needs
``set_epoch`` first, saying so. Read it in the main process (a DataLoader with
``num_workers=0``): the engine already reads with its own threads, and worker
processes are `dataset_rt.torch.DatasetLoader`'s job.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from dataset_rt.batches import BatchLoader, numpy_columns
from dataset_rt.config import ShuffleMode
from dataset_rt.errors import InvalidArgumentError
from dataset_rt.loader import RunState, StreamSource

try:  # a torch IterableDataset where PyTorch is installed, as Hugging Face's is
    import torch
    from torch.utils.data import IterableDataset as _Base
    from torch.utils.data import get_worker_info
except ImportError:  # pragma: no cover - exercised when torch is absent
    torch = None  # type: ignore[assignment, unused-ignore]
    _Base = object  # type: ignore[assignment, misc, unused-ignore]

    def get_worker_info() -> None:  # type: ignore[misc, unused-ignore]
        return None


#: Format names as Hugging Face spells them, and what they mean here.
FORMATS = {
    None: "python",
    "python": "python",
    "numpy": "numpy",
    "np": "numpy",
    "torch": "torch",
    "pt": "torch",
    "arrow": "arrow",
    "pa": "arrow",
}


class HFIterableDataset(_Base):  # type: ignore[misc, valid-type, type-arg, unused-ignore]
    """Examples of one rank's share of each epoch (see the module's docs).

    ``source`` is a `dataset_rt.loader.LocalSource` or a
    ``flight_client.FlightSource``; ``seed``, ``columns``, ``shuffle``,
    ``population`` and ``epoch_len`` are those of every loader. ``block`` is how
    many examples are read at a time (a checkpoint inside a block resumes at
    the same world size and block only).
    """

    def __init__(
        self,
        source: StreamSource,
        dataset: str,
        *,
        seed: int,
        block: int = 256,
        epoch: int = 0,
        epoch_len: int | None = None,
        population: str | None = None,
        columns: tuple[str, ...] | list[str] = (),
        shuffle: ShuffleMode = True,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if rank is None or world_size is None:
            group = _process_group()
            rank = group[0] if rank is None else rank
            world_size = group[1] if world_size is None else world_size
        self._loader = BatchLoader(
            source,
            dataset,
            batch_size=block,
            seed=seed,
            epoch=epoch,
            epoch_len=epoch_len,
            population=population,
            columns=columns,
            shuffle=shuffle,
            rank=rank,
            world_size=world_size,
            batch_format="arrow",
        )
        self._format = "python"
        #: The block being yielded, as (the state before it, examples yielded from
        #: it); None between blocks. Shared by `with_format` copies (one run).
        self._place: dict[str, tuple[RunState, int] | None] = {"partial": None}

    # -- what Hugging Face's IterableDataset has -------------------------------------

    @property
    def epoch(self) -> int:
        return self._loader.epoch

    @property
    def column_names(self) -> list[str]:
        return ["payload", "position", "cache_id", "sample_id", *self._loader.run_state.columns]

    @property
    def loader(self) -> BatchLoader:
        """The loader underneath (its state, ``switch_population``, ``input_stats``)."""
        return self._loader

    def with_format(self, type: str | None = None) -> HFIterableDataset:
        """The same run (one state, one position) with examples as Python
        objects (``None``), NumPy values, tensors or one-row Arrow tables."""
        if type not in FORMATS:
            raise InvalidArgumentError(
                f"format {type!r} is not one of None, 'python', 'numpy', 'torch', 'arrow' "
                f"(or 'np', 'pt', 'pa')"
            )
        if FORMATS[type] == "torch" and torch is None:
            raise ImportError("with_format('torch') needs PyTorch (`pip install torch`)")
        formatted = copy.copy(self)
        formatted._format = FORMATS[type]
        return formatted

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next; the epoch the state is in keeps its place
        (so ``load_state_dict``, then ``set_epoch`` at the saved epoch, resumes)."""
        if epoch != self._loader.epoch:
            self._place["partial"] = None
        self._loader.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where the run is: after the last example yielded (``FencedError`` if
        the run was resumed elsewhere)."""
        state = self._loader.state_dict()  # asks the fence
        partial = self._place["partial"]
        if partial is None:
            return {"run": state, "examples": 0}
        before, taken = partial
        return {"run": before.to_dict(), "examples": taken}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume after the last example the state's run yielded (a new
        generation of the run, as with every loader)."""
        if not isinstance(state_dict, Mapping) or set(state_dict) != {"run", "examples"}:
            raise InvalidArgumentError(
                f"an HFIterableDataset state is {{'run': <a loader state>, 'examples': "
                f"integer}} (from state_dict()), got {_short(state_dict)}"
            )
        taken = state_dict["examples"]
        block = self._loader.batch_size
        if isinstance(taken, bool) or not isinstance(taken, int) or not 0 <= taken < block:
            raise InvalidArgumentError(
                f"'examples' must be an integer in [0, block={block}), got {taken!r}"
            )
        saved = RunState.from_dict(state_dict["run"])
        here = (self._loader.world_size, self._loader.batch_size)
        if taken and (saved.world_size, saved.batch_size) != here:
            raise InvalidArgumentError(
                f"this state is {taken} examples into a block of {saved.batch_size} read by "
                f"{saved.world_size} ranks; it resumes only with world size "
                f"{saved.world_size} and block {saved.batch_size} (here {here[0]} and "
                f"{here[1]}). A state taken between blocks resumes at any"
            )
        self._loader.load_state_dict(state_dict["run"])
        self._place["partial"] = (self._loader.run_state, taken) if taken else None

    def __iter__(self) -> Iterator[Any]:
        return (self._format_one(row) for row in self._rows())

    def iter(self, batch_size: int, drop_last_batch: bool = False) -> Iterator[Any]:
        """Batches of ``batch_size`` examples (the last one shorter unless
        ``drop_last_batch``), in the dataset's format."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidArgumentError(f"'batch_size' must be an integer >= 1, got {batch_size!r}")
        pending: list[pa.Table] = []
        for row in self._rows():
            pending.append(row)
            if len(pending) == batch_size:
                yield self._format_many(pa.concat_tables(pending))
                pending = []
        if pending and not drop_last_batch:
            yield self._format_many(pa.concat_tables(pending))

    def __repr__(self) -> str:
        return (
            f"HFIterableDataset(dataset={self._loader.run_state.dataset!r}, "
            f"rank={self._loader.rank}/{self._loader.world_size}, epoch={self.epoch}, "
            f"format={self._format!r})"
        )

    # -- underneath ------------------------------------------------------------------

    def _rows(self) -> Iterator[pa.Table]:
        """One-row tables, the place kept after each: a block partly yielded
        when the consumer stopped is read again and its yielded rows skipped."""
        if get_worker_info() is not None:
            raise InvalidArgumentError(
                "HFIterableDataset is read in the main process (DataLoader num_workers=0): "
                "the engine reads with its own threads. For worker processes use "
                "dataset_rt.torch.DatasetLoader(num_workers=n)"
            )
        loader = self._loader
        skip = 0
        partial = self._place["partial"]
        if partial is not None:
            before, skip = partial
            loader._rewind(before)
        blocks = iter(loader)
        while True:
            before = loader.run_state
            try:
                table = next(blocks)
            except StopIteration:
                self._place["partial"] = None
                return
            rows = table.num_rows
            for index in range(skip, rows):
                taken = index + 1
                self._place["partial"] = (before, taken) if taken < rows else None
                yield table.slice(index, 1)
            skip = 0

    def _format_one(self, row: pa.Table) -> Any:
        if self._format == "arrow":
            return row
        if self._format == "python":
            return row.to_pylist()[0]
        return {name: value[0] for name, value in self._columns(row).items()}

    def _format_many(self, rows: pa.Table) -> Any:
        if self._format == "arrow":
            return rows
        if self._format == "python":
            return rows.to_pydict()
        return self._columns(rows)

    def _columns(self, table: pa.Table) -> dict[str, Any]:
        """NumPy arrays (or tensors) for numbers and booleans, else lists
        (payloads are bytes)."""
        columns = numpy_columns(table)
        if self._format != "torch":
            return columns
        return {
            name: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
            for name, value in columns.items()
        }


def _process_group() -> tuple[int, int]:
    """(rank, world size) of ``torch.distributed`` when it is initialised, else (0, 1)."""
    if (
        torch is not None
        and torch.distributed.is_available()
        and torch.distributed.is_initialized()
    ):
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
