"""`HFIterableDataset`: a rank's share of each epoch as a real Hugging Face
``datasets.IterableDataset``.

It *is* a ``datasets.IterableDataset`` (``isinstance`` holds), built on
`DatasetRTExamples`, an examples iterable (datasets' ``_BaseExamplesIterable``)
that reads the engine's stream and keeps the run's state. So the whole
``datasets`` API is Hugging Face's own, not a copy of it: ``take``, ``skip``,
``select_columns``, ``remove_columns``, ``rename_column``, ``map``, ``filter``,
``shuffle(buffer_size=...)``, ``batch``, ``with_format``, ``iter(batch_size=...)``,
``features``, ``n_shards``, ``interleave_datasets``, and ``state_dict()`` /
``load_state_dict()`` through every one of them, as the installed ``datasets``
implements them (tested with 5.2; the ``torch`` dependency group asks for >= 3.0).

What is the engine's: the examples (weighted draws or a permutation of the
active population, epoch ``e`` a different one for every ``set_epoch(e)``), each
rank's disjoint share (``rank`` and ``world_size`` default to
``torch.distributed``'s), the state inside Hugging Face's state dict (the run's
`dataset_rt.loader.RunState` plus the examples taken since it, so a resume is
exact and the audit sees what was read), and the fencing of a run resumed
elsewhere. ``len()`` is the examples this rank reads in an epoch.

One process reads every example of an epoch. Ranks read ``block`` examples at a
time and all take the same number of blocks, so the epoch's last
``epoch_len mod (world_size x block)`` examples go to no rank (the tail rule,
docs/training.md): it exists to keep ranks in step, which one process does not
need, so with ``world_size=1`` each example is a step of its own.

Read it in the main process (a DataLoader with ``num_workers=0``): the engine
already reads with its own threads, and worker processes are
`dataset_rt.torch.DatasetLoader`'s job.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import Any

import pyarrow as pa
from typing_extensions import Unpack

from dataset_rt.batches import BatchLoader, StreamOptions, numpy_column, process_group_share
from dataset_rt.errors import InvalidArgumentError
from dataset_rt.loader import RunState, StreamSource, blocks
from dataset_rt.signals import log as input_log

try:
    import datasets  # type: ignore[import-untyped, import-not-found, unused-ignore]
    from datasets.formatting import (  # type: ignore[import-untyped, import-not-found, unused-ignore]
        NumpyFormatter,
        _register_formatter,
        get_format_type_from_alias,
    )
    from datasets.iterable_dataset import (  # type: ignore[import-untyped, import-not-found, unused-ignore]
        _BaseExamplesIterable,
    )
except ImportError as error:  # pragma: no cover - exercised when datasets is absent
    raise ImportError(
        "dataset_rt.integrations.huggingface needs Hugging Face datasets "
        "(`pip install 'datasets>=3.0'`, or `uv sync --group torch`)"
    ) from error

try:
    import torch
    from torch.utils.data import get_worker_info
except ImportError:  # pragma: no cover - exercised when torch is absent
    torch = None  # type: ignore[assignment, unused-ignore]

    def get_worker_info() -> None:  # type: ignore[misc, unused-ignore]
        return None


__all__ = ["EXACT_FORMATS", "DatasetRTExamples", "ExactNumpyFormatter", "HFIterableDataset"]


# -- formats that keep payloads and ids exact ------------------------------------------


def _exact_columns(table: pa.Table) -> list[str]:
    """The columns Hugging Face's NumPy and torch formatters would change:
    binary ones (made 'S' values, which drop trailing NUL bytes) and uint64
    ones (cast to int64 in batches and tensors, which wraps ids above 2**63)."""
    return [
        field.name
        for field, column in zip(table.schema, table.columns, strict=True)
        if pa.types.is_binary(field.type)
        or pa.types.is_large_binary(field.type)
        or (pa.types.is_uint64(field.type) and column.null_count == 0)
    ]


def _exact_values(column: pa.ChunkedArray, *, tensor: bool) -> Any:
    """A kept column: bytes as bytes, uint64 as a uint64 array or tensor (a new,
    writable array: `numpy_column`, without pyarrow's pandas import)."""
    if not pa.types.is_uint64(column.type):
        return column.to_pylist()
    values = numpy_column(column)
    return torch.from_numpy(values) if tensor else values


def _format_exactly(
    table: pa.Table, formatted: Callable[[pa.Table], Any], *, row: bool, tensor: bool
) -> Any:
    """Hugging Face's format of ``table`` (``formatted``), its kept columns exact."""
    kept = _exact_columns(table)
    if not kept:
        return formatted(table)
    rest = formatted(table.drop_columns(kept)) if len(kept) < table.num_columns else {}
    out = {}
    for name in table.column_names:
        if name in kept:
            values = _exact_values(table.column(name), tensor=tensor)
            out[name] = values[0] if row else values
        else:
            out[name] = rest[name]
    return out


def _column_exactly(table: pa.Table, formatted: Callable[[pa.Table], Any], *, tensor: bool) -> Any:
    if _exact_columns(table):
        return _exact_values(table.column(0), tensor=tensor)
    return formatted(table)


class ExactNumpyFormatter(NumpyFormatter):  # type: ignore[misc, unused-ignore]
    """Hugging Face's NumPy format, binary columns as ``bytes`` and uint64 ones
    as uint64 (Hugging Face's drops a payload's trailing NUL bytes and casts
    uint64 batches to int64)."""

    def format_row(self, pa_table: pa.Table) -> Any:
        return _format_exactly(pa_table, super().format_row, row=True, tensor=False)

    def format_batch(self, pa_table: pa.Table) -> Any:
        return _format_exactly(pa_table, super().format_batch, row=False, tensor=False)

    def format_column(self, pa_table: pa.Table) -> Any:
        return _column_exactly(pa_table, super().format_column, tensor=False)


#: The format names `HFIterableDataset.with_format` uses for Hugging Face's
#: lossy ones; any ``datasets.IterableDataset.with_format`` takes them too.
EXACT_FORMATS = {"numpy": "dataset_rt.numpy"}
_register_formatter(ExactNumpyFormatter, EXACT_FORMATS["numpy"])

if torch is not None:
    from datasets.formatting.torch_formatter import (  # type: ignore[import-untyped, import-not-found, unused-ignore]
        TorchFormatter,
    )

    class ExactTorchFormatter(TorchFormatter):  # type: ignore[misc, unused-ignore]
        """Hugging Face's torch format, binary columns as ``bytes`` and uint64
        ones as uint64 tensors (Hugging Face's drops a payload's trailing NUL
        bytes and reads uint64 as int64)."""

        def format_row(self, pa_table: pa.Table) -> Any:
            return _format_exactly(pa_table, super().format_row, row=True, tensor=True)

        def format_batch(self, pa_table: pa.Table) -> Any:
            return _format_exactly(pa_table, super().format_batch, row=False, tensor=True)

        def format_column(self, pa_table: pa.Table) -> Any:
            return _column_exactly(pa_table, super().format_column, tensor=True)

    EXACT_FORMATS["torch"] = "dataset_rt.torch"
    _register_formatter(ExactTorchFormatter, EXACT_FORMATS["torch"])


class DatasetRTExamples(_BaseExamplesIterable):  # type: ignore[misc, unused-ignore]
    """The examples of one rank's share of an epoch, for ``datasets``.

    Its state (inside Hugging Face's ``state_dict()``) is ``{"run": <the run's
    state at the start of the table being read>, "examples": <examples of that
    table taken>}``; ``"run"`` is None before the first example. It reads
    tables of ``block`` examples: one block of the partition across ranks, or
    with one process ``block`` consecutive examples (the last table of an epoch
    shorter), each example then a step of the run. Hugging Face copies it for
    every iteration and epoch: the copies share ``loader``, whose state is the
    run's latest.
    """

    def __init__(self, loader: BatchLoader, *, block: int, features: Any) -> None:
        super().__init__()
        self.loader = loader
        self.block = block
        self._features = features
        #: The stream's epoch: Hugging Face shifts it by the dataset's epoch.
        self.epoch = 0
        #: False in a DataLoader worker that was given no shard.
        self.has_shard = True
        self._fence_checked = -float("inf")
        # What datasets asks of a leaf iterable: no Python threads of ours to
        # wait for at shutdown (the engine's are native).
        self._sleep_on_threads_shutdown = False

    # -- what datasets asks of an examples iterable -------------------------------

    @property
    def iter_arrow(self) -> Any:
        return self._iter_arrow

    @property
    def is_typed(self) -> bool:
        return True

    @property
    def features(self) -> Any:
        return self._features

    @property
    def num_shards(self) -> int:
        """One: the engine splits the stream into ranks itself (``rank``,
        ``world_size``), and reads it with its own threads."""
        return 1

    def _init_state_dict(self) -> dict[str, Any]:
        self._state_dict: dict[str, Any] = {"run": None, "examples": 0, "type": type(self).__name__}
        return self._state_dict

    def shift_rngs(self, value: int) -> DatasetRTExamples:
        """Hugging Face's hook for "another epoch's randomness": the engine's
        epoch (``set_epoch(e)`` reads epoch ``e`` of the stream)."""
        shifted = copy.copy(self)
        shifted.epoch = self.epoch + value
        return shifted

    def shuffle_data_sources(self, generator: Any) -> DatasetRTExamples:
        # Each epoch of the stream is already its own draw or permutation.
        return copy.copy(self)

    def shard_data_sources(
        self, num_shards: int, index: int, contiguous: bool = True
    ) -> DatasetRTExamples:
        shard = copy.copy(self)
        shard.has_shard = 0 in self.split_shard_indices_by_worker(num_shards, index, contiguous)
        return shard

    def reshard_data_sources(self) -> DatasetRTExamples:
        return copy.copy(self)

    # -- iteration -------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """Examples as Python objects. The run's state moves past a block when
        it is read (as a loader's does) and, with one process, past each
        example before it is yielded; Hugging Face's state says how many of
        the table's examples were yielded."""
        cursor = self._start()
        if cursor is None:
            return
        state, skip = cursor
        place = self._place()
        one_process = state.batch_size == 1
        for table in self._tables(state):
            positions = table.column("position").to_pylist()
            place["run"], place["examples"] = state.to_dict(), skip
            if not one_process:
                state.advance(positions[0])
            plan = state.segments
            last = len(positions) - 1
            for index, example in enumerate(table.slice(skip).to_pylist(), start=skip):
                if one_process:
                    state.advance(positions[index])
                if index == last:
                    place["run"], place["examples"] = state.to_dict(), 0
                else:
                    place["examples"] = index + 1
                yield positions[index], example
                if one_process and state.segments != plan:
                    break  # a switch from the next example on: read on from there
            skip = 0

    def _iter_arrow(self) -> Iterator[tuple[int, pa.Table]]:
        """Tables of examples, the state moved past each before it is yielded
        (Hugging Face re-cuts them and keeps its own place inside one)."""
        cursor = self._start()
        if cursor is None:
            return
        state, skip = cursor
        place = self._place()
        target = self._features.arrow_schema
        for table in self._tables(state):
            positions = table.column("position")
            if state.batch_size == 1:
                for position in positions.to_pylist():
                    state.advance(position)
            else:
                state.advance(positions[0].as_py())
            place["run"], place["examples"] = state.to_dict(), 0
            rows = table.slice(skip)
            skip = 0
            yield positions[0].as_py(), rows if rows.schema == target else rows.cast(target)

    def _place(self) -> dict[str, Any]:
        """This iteration's state, the dict Hugging Face's state dict holds."""
        if self._state_dict is None:  # iterated directly, not through a dataset
            self._init_state_dict()
        return self._state_dict

    def _start(self) -> tuple[RunState, int] | None:
        """Where this iteration starts, as (the run's state, examples of its
        first table to pass over): the state Hugging Face loaded, else the
        start of the epoch. None in a DataLoader worker given no shard."""
        if get_worker_info() is not None:
            raise InvalidArgumentError(
                "HFIterableDataset is read in the main process (DataLoader num_workers=0): "
                "the engine reads with its own threads. For worker processes use "
                "dataset_rt.torch.DatasetLoader(num_workers=n)"
            )
        if not self.has_shard:
            return None
        place = self._place()
        loader = self.loader
        if place["run"] is None:
            state = loader.run_state
            restart(state, self.epoch)
            loader._rewind(state)
            skip = 0
        else:
            run, skip, steps = self.check_saved(place["run"], place["examples"])
            loader.load_state_dict(run)  # a new generation of the run, claimed
            fold(loader._state, steps)
        # The loader's state is the run's latest: `switch_population` and
        # `state_dict` act on the one this iteration moves.
        state = loader._state
        place["run"], place["examples"] = state.to_dict(), skip
        return state, skip

    def check_saved(self, run: Any, examples: Any) -> tuple[dict[str, Any], int, int]:
        """A saved place as (a run state, examples of its next table to pass
        over, examples to take as steps once it is loaded), refused with a
        message when this dataset cannot resume it.

        One process reads consecutive examples, so a one-process place inside
        a table becomes a run state by taking its examples as steps: before it
        is loaded when its run already steps one example at a time (it then
        resumes at any world size and block), after it is loaded (at one
        example a step) into a one-process dataset otherwise. Across ranks, a
        place inside a block resumes at the same world size and block only.
        """
        if isinstance(examples, bool) or not isinstance(examples, int) or examples < 0:
            raise InvalidArgumentError(
                f"an HFIterableDataset state's 'examples' is an integer >= 0, "
                f"got {_short(examples)}"
            )
        if not isinstance(run, Mapping):
            raise InvalidArgumentError(
                f"an HFIterableDataset state's 'run' is a loader state (a dict), got {_short(run)}"
            )
        saved = RunState.from_dict(run)
        if not examples:
            return dict(run), 0, 0
        one_process = self.loader.batch_size == 1 and self.loader.world_size == 1
        if saved.world_size == 1 and (saved.batch_size == 1 or one_process):
            if saved.position + examples > saved.epoch_len:
                raise InvalidArgumentError(
                    f"this state is {examples} examples past position {saved.position} of an "
                    f"epoch of {saved.epoch_len}: it is not one this run saved"
                )
            if saved.batch_size == 1:
                fold(saved, examples)
                return saved.to_dict(), 0, 0
            return dict(run), 0, examples
        if examples >= saved.batch_size:
            raise InvalidArgumentError(
                f"an HFIterableDataset state's 'examples' must be below its block "
                f"({saved.batch_size}), got {examples}"
            )
        here = (self.loader.world_size, self.loader.batch_size)
        if (saved.world_size, saved.batch_size) != here:
            raise InvalidArgumentError(
                f"this state is {examples} examples into a block of {saved.batch_size} read by "
                f"{saved.world_size} ranks; it resumes only with world size {saved.world_size} "
                f"and block {saved.batch_size} (here world size {self.loader.world_size} and "
                f"block {self.block}). A state taken between blocks, or by one process, "
                f"resumes at any"
            )
        return dict(run), examples, 0

    def _tables(self, state: RunState) -> Iterator[pa.Table]:
        """The rank's tables from ``state`` to the end of its epoch. The
        consumer moves ``state`` past a table before it asks for the next; a
        population switch recorded meanwhile is read from where it applies."""
        loader = self.loader
        source = loader.source
        notes = getattr(source, "failover_notes", None)
        told = len(notes(0)) if notes is not None else 0
        loader.input.new_readers()
        while state.parts():
            plan = state.segments
            switched = False
            for request in state.requests(loader.rank):
                tables = self._read(request, state.batch_size)
                try:
                    while not switched:
                        asked = time.perf_counter()
                        table = next(tables, None)
                        if table is None:
                            break
                        loader.input.waited(time.perf_counter() - asked)
                        loader.input.reader_restarts(-1, int(getattr(source, "restarts", 0)))
                        for note in notes(told) if notes is not None else []:
                            told += 1
                            input_log.warning("rank %d, reader -1: %s", loader.rank, note)
                        self._check_fence(state)
                        yield table
                        switched = state.segments != plan
                finally:
                    tables.close()
                if switched:
                    break
            if not switched:
                break
        state.finish_epoch()  # across ranks, the tail no rank takes

    def _read(self, request: Any, grid: int) -> Generator[pa.Table, None, None]:
        """One ticket's tables: its blocks across ranks, or with one process
        ``block`` consecutive examples each (the last one shorter)."""
        stream = self.loader.source.open(request, batch_rows=self.block)
        if grid > 1:
            yield from blocks(stream, grid)
            return
        pending: list[pa.RecordBatch] = []
        held = 0
        for batch in stream:
            while batch.num_rows:
                take = min(self.block - held, batch.num_rows)
                pending.append(batch.slice(0, take))
                held += take
                batch = batch.slice(take)
                if held == self.block:
                    yield pa.Table.from_batches(pending)
                    pending, held = [], 0
        if held:
            yield pa.Table.from_batches(pending)

    def _check_fence(self, state: RunState) -> None:
        """`FencedError` once the run was resumed elsewhere (asked at most every
        ``source.fence_interval`` seconds, as every loader does)."""
        now = time.monotonic()
        source = self.loader.source
        if now - self._fence_checked >= getattr(source, "fence_interval", 0.0):
            source.check_run(state.dataset, state.run, state.generation)
            self._fence_checked = now


class HFIterableDataset(datasets.IterableDataset):  # type: ignore[misc, unused-ignore]
    """Examples of one rank's share of each epoch, as a ``datasets.IterableDataset``
    (see the module's docs).

    ``source`` is a `dataset_rt.loader.LocalSource` or a
    ``flight_client.FlightSource``; the other keywords are every loader's
    `dataset_rt.batches.StreamOptions` (``seed``, ``epoch``, ``epoch_len``,
    ``population``, ``columns``, ``shuffle``, ``rank``, ``world_size``). ``block`` is
    how many examples are read at a time; across ranks it is also the
    partition's block (a state taken inside one resumes at the same world size
    and block only). ``epoch`` is the first epoch read (``set_epoch`` moves it).
    """

    def __init__(
        self,
        source: StreamSource,
        dataset: str,
        *,
        block: int = 256,
        **options: Unpack[StreamOptions],
    ) -> None:
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise InvalidArgumentError(f"'block' must be an integer >= 1, got {block!r}")
        process_group_share(options)
        loader = BatchLoader(
            source,
            dataset,
            # One process takes each example as a step: it drops no tail.
            batch_size=1 if options["world_size"] == 1 else block,
            batch_format="arrow",
            **options,
        )
        features = datasets.Features.from_arrow_schema(_schema(loader))
        examples = DatasetRTExamples(loader, block=block, features=features)
        super().__init__(examples, info=datasets.DatasetInfo(features=features))
        self.set_epoch(loader.epoch)

    # -- what differs from (or adds to) Hugging Face's -----------------------------

    @property
    def loader(self) -> BatchLoader:
        """The loader underneath: its ``run_state`` (the run's latest),
        ``switch_population``, ``input_stats()``. Its ``batch_size`` is the
        run's step: ``block`` across ranks, 1 with one process."""
        loader: BatchLoader = self._ex_iterable.loader
        return loader

    def __len__(self) -> int:
        """Examples this rank reads in the current epoch, from its start: the
        epoch length with one process, whole blocks across ranks."""
        state = self.loader.run_state
        restart(state, self.epoch)
        return state.batches_left() * state.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` of the stream next (as ``transformers.Trainer``
        calls it); a state loaded for that epoch resumes there."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise InvalidArgumentError(f"'epoch' must be an integer >= 0, got {epoch!r}")
        super().set_epoch(epoch)

    def with_format(self, type: str | None = None) -> HFIterableDataset:
        """Hugging Face's ``with_format``, keeping this dataset's epoch, loaded
        state and length (Hugging Face's starts a formatted copy at epoch 0
        and forgets a loaded state). ``"numpy"`` and ``"torch"`` (and their
        aliases) are `EXACT_FORMATS`: payloads stay ``bytes``, uint64 ids stay
        uint64; the format carries over to ``take``, ``map``, ``filter``, ..."""
        name = get_format_type_from_alias(type)
        formatted: HFIterableDataset = super().with_format(EXACT_FORMATS.get(name, type))
        formatted.__class__ = self.__class__  # the same examples underneath
        formatted.set_epoch(self.epoch)
        formatted._starting_state_dict = self._starting_state_dict
        return formatted

    def state_dict(self) -> dict[str, Any]:
        """Hugging Face's state (after the last example yielded), once the fence
        says this run was not resumed elsewhere (``FencedError`` otherwise)."""
        self.loader.state_dict()  # asks the fence
        state: dict[str, Any] = super().state_dict()
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume after the last example the state's run yielded, in the
        state's epoch (a new generation of the run when iteration starts).
        A state this dataset cannot resume is refused here, saying why."""
        if isinstance(state_dict, Mapping) and set(state_dict) == {"run", "examples"}:
            self._ex_iterable.check_saved(state_dict["run"], state_dict["examples"])
            state_dict = self._from_flat(state_dict)
        if (
            not isinstance(state_dict, Mapping)
            or "examples_iterable" not in state_dict
            or isinstance(state_dict.get("epoch"), bool)
            or not isinstance(state_dict.get("epoch"), int)
        ):
            raise InvalidArgumentError(
                f"an HFIterableDataset state is Hugging Face's {{'examples_iterable': ..., "
                f"'epoch': integer}} (from state_dict()), got {_short(state_dict)}"
            )
        places = list(_places(state_dict["examples_iterable"]))
        if not places:
            raise InvalidArgumentError(
                f"this state holds no {DatasetRTExamples.__name__} place: it is not an "
                f"HFIterableDataset's (got {_short(state_dict)})"
            )
        for place in places:
            if place.get("run") is not None:
                self._ex_iterable.check_saved(place["run"], place.get("examples"))
        super().load_state_dict(dict(state_dict))
        self.set_epoch(state_dict["epoch"])

    def _from_flat(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """A state of the HFIterableDataset before it was a ``datasets`` one
        (``{"run", "examples"}``), in today's shape."""
        run = state["run"]
        epoch = RunState.from_dict(run).epoch
        fresh = copy.deepcopy(self._state_dict)
        for place in _places(fresh["examples_iterable"]):
            place["run"], place["examples"] = run, state["examples"]
        return {"examples_iterable": fresh["examples_iterable"], "epoch": epoch}

    def __repr__(self) -> str:
        loader = self.loader
        return (
            f"HFIterableDataset(dataset={loader.run_state.dataset!r}, "
            f"rank={loader.rank}/{loader.world_size}, epoch={self.epoch}, "
            f"features={list(self.features)}, num_shards={self.num_shards})"
        )


def restart(state: RunState, epoch: int) -> None:
    """Move ``state`` to the start of ``epoch``, as a new iteration of a
    ``datasets.IterableDataset`` starts (the run's chain records where the
    last one stopped, so the audit sees an epoch read twice as read twice)."""
    if state.epoch == epoch and state.position == 0:
        return
    if state.epoch == epoch:
        try:  # `set_epoch` keeps the place in the current epoch: leave it first
            state.set_epoch(epoch + 1)
        except InvalidArgumentError:  # the last epoch there is
            state.set_epoch(epoch - 1)
    state.set_epoch(epoch)


def fold(state: RunState, examples: int) -> None:
    """Take ``examples`` more examples of a one-process run as steps (its
    positions are consecutive)."""
    for _ in range(examples):
        state.advance(state.epoch_start + state.position)


def _schema(loader: BatchLoader) -> pa.Schema:
    """The schema of the loader's examples: one example's (read outside the run)."""
    state = loader.run_state
    probe = (
        state.command(state.population_at(state.epoch_start))
        .replace(stop=1, run=None, generation=None)
        .for_rank(0)
    )
    for batch in loader.source.open(probe, batch_rows=1):
        schema: pa.Schema = batch.schema
        return schema
    raise InvalidArgumentError(f"dataset {state.dataset!r} streamed no example")


def _places(value: Any) -> Iterator[dict[str, Any]]:
    """The `DatasetRTExamples` places inside a (nested) Hugging Face state."""
    if isinstance(value, dict):
        if value.get("type") == DatasetRTExamples.__name__:
            yield value
            return
        for item in value.values():
            yield from _places(item)
    elif isinstance(value, list):
        for item in value:
            yield from _places(item)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
