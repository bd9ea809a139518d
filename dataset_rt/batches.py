"""`BatchLoader`: one rank's share of each epoch in batches, with exact
checkpoint and resume, without PyTorch.

Batches come as NumPy arrays (for JAX and other consumers that are not torch)
or Arrow tables, read in this process by the engine's own threads. It is the
loader `dataset_rt.torch.DatasetLoader` builds on: the same state, the same
resume at any world size, batch size and worker count, the same fencing of a
run resumed elsewhere. That one adds DataLoader workers, tensors and
``torch.distributed``. See docs/training.md.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, Required, TypedDict

import numpy as np
import pyarrow as pa
from typing_extensions import Unpack

from dataset_rt.config import ShuffleMode
from dataset_rt.errors import InvalidArgumentError
from dataset_rt.loader import RunOptions, RunState, Segment, StreamSource, blocks
from dataset_rt.signals import InputStats, show_input_logs
from dataset_rt.signals import log as input_log

__all__ = [
    "BatchFormat",
    "BatchLoader",
    "LoaderOptions",
    "StreamOptions",
    "Tagged",
    "numpy_column",
    "numpy_columns",
    "process_group_share",
    "rank_blocks",
    "tagged",
]

#: How a default batch is handed out: ``"numpy"`` (a dict of NumPy arrays for
#: numbers and booleans, lists for the rest), ``"arrow"`` (a ``pyarrow.Table``),
#: or, from `dataset_rt.torch.DatasetLoader`, ``"torch"`` (tensors).
BatchFormat = Literal["numpy", "arrow", "torch"]


class StreamOptions(TypedDict, total=False):
    """The run-start options every loader takes, as keywords: the stream read
    and this process's share of it. The core's `RunOptions` parses and checks
    them (``native/src/run/options.rs``); docs/training.md describes each.
    ``None`` means the default: the active epoch length and population, rank
    0 of 1 (or ``torch.distributed``'s, where a loader says so)."""

    seed: Required[int]
    epoch: int
    epoch_len: int | None
    population: str | None
    columns: Sequence[str]
    shuffle: ShuffleMode
    rank: int | None
    world_size: int | None


class LoaderOptions(StreamOptions, total=False):
    """`StreamOptions` and the batch size: a batch loader's run-start options."""

    batch_size: Required[int]


def process_group_share(options: StreamOptions) -> None:
    """Fill ``rank`` and ``world_size``, where ``options`` leave them out, with
    ``torch.distributed``'s when it is initialised, else 0 and 1. Torch is not
    imported for this: a process group exists only where it already was."""
    dist = sys.modules.get("torch.distributed")
    rank, world_size = 0, 1
    if dist is not None and dist.is_available() and dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
    if options.get("rank") is None:
        options["rank"] = rank
    if options.get("world_size") is None:
        options["world_size"] = world_size


#: A batch as the loader receives it: (first position, reader id, the reader's
#: stream restarts so far, its failovers since its last batch in words, batch);
#: the reader id is a DataLoader worker's id, -1 in-process.
Tagged = tuple[int, int, int, list[str], Any]


def rank_blocks(
    source: StreamSource,
    state: RunState,
    rank: int,
    worker: int = 0,
    workers: int = 1,
    *,
    skip: int = 0,
) -> Iterator[pa.Table]:
    """Rank ``rank``'s next batches under ``state`` (those of ``worker`` of
    ``workers``), as tables of ``state.batch_size`` rows, the first ``skip``
    batches skipped by offset, without reading them."""
    size = state.batch_size
    for request in state.requests(rank, worker, workers):
        count = request.samples_per_rank() // size
        if skip >= count:
            skip -= count
            continue
        request = request.resumed(skip * size)
        skip = 0
        yield from blocks(source.open(request), size)


def tagged(
    source: StreamSource,
    state: RunState,
    rank: int,
    worker: int = 0,
    workers: int = 1,
    *,
    reader: int = -1,
    skip: int = 0,
) -> Iterator[Tagged]:
    """`rank_blocks`, each with what the loader needs besides the batch: its
    first position, and the reader's restarts and failovers (``source.restarts``
    and ``source.failover_notes``, which a Flight source keeps)."""
    notes: Callable[[int], list[str]] | None = getattr(source, "failover_notes", None)
    told = len(notes(0)) if notes is not None else 0
    for table in rank_blocks(source, state, rank, worker, workers, skip=skip):
        first = int(table.column("position")[0].as_py())
        restarts = int(getattr(source, "restarts", 0))
        new = notes(told) if notes is not None else []
        told += len(new)
        yield first, reader, restarts, new, table


def numpy_columns(table: pa.Table) -> dict[str, Any]:
    """A batch as users of array libraries expect it: numbers and booleans as
    NumPy arrays (writable, as ``torch.from_numpy`` and ``jax.device_put``
    take them without a copy of their own), other columns (the payload) as lists."""
    columns: dict[str, Any] = {}
    for name, array in zip(table.schema.names, table.columns, strict=True):
        if _is_number_or_bool(array.type):
            columns[name] = numpy_column(array)
        else:
            columns[name] = array.to_pylist()
    return columns


def numpy_column(array: pa.Array | pa.ChunkedArray) -> np.ndarray[Any, Any]:
    """An integer, floating-point or boolean column as a new, writable NumPy
    array, equal to pyarrow's ``array.to_numpy(zero_copy_only=False)``: an
    integer column with nulls becomes float64 with NaN at the nulls, a
    floating-point one keeps its type with NaN there, a boolean one with nulls
    becomes an object array with None there.

    Without pandas: pyarrow's ``to_numpy`` converts through its pandas code,
    which imports pandas (over a second) for some arrays, in every process that
    makes a batch (a DataLoader worker, at its first batch). Here numbers cross
    through DLPack (``np.from_dlpack``: the values buffer as Arrow holds it,
    its offset applied, copied once into the result), booleans and null masks
    are read from their bits (``np.unpackbits`` from the array's offset). A
    chunk with nulls crosses without its validity bitmap, which DLPack refuses,
    and its nulls are written over afterwards.
    """
    kind = array.type
    if not _is_number_or_bool(kind):
        raise InvalidArgumentError(
            f"numpy_column converts integer, floating-point and boolean columns; got {kind} "
            f"(other columns are handed out as lists: numpy_columns)"
        )
    chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
    if pa.types.is_boolean(kind):
        dtype: np.dtype[Any] = np.dtype(object if array.null_count else np.bool_)
    elif pa.types.is_integer(kind) and array.null_count:
        dtype = np.dtype(np.float64)
    else:
        dtype = np.dtype(kind.to_pandas_dtype())  # a NumPy type: no pandas involved
    out = np.empty(len(array), dtype=dtype)
    start = 0
    for chunk in chunks:
        stop = start + len(chunk)
        if stop > start:
            _fill(out[start:stop], chunk)
        start = stop
    return out


def _is_number_or_bool(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
    )


def _fill(out: np.ndarray[Any, Any], chunk: pa.Array) -> None:
    """Write ``chunk`` (not empty) into ``out``, its nulls as NaN or None."""
    length, offset = len(chunk), chunk.offset
    validity, values = chunk.buffers()[:2]
    if pa.types.is_boolean(chunk.type):
        out[:] = _bits(values, offset, length)
    elif chunk.null_count == 0:
        out[:] = np.from_dlpack(chunk)
    else:
        # The same values without the validity bitmap (zero-copy): DLPack
        # takes only arrays without nulls.
        bare = pa.Array.from_buffers(chunk.type, length, [None, values], 0, offset)
        out[:] = np.from_dlpack(bare)
    if chunk.null_count:
        out[~_bits(validity, offset, length)] = None if out.dtype == object else np.nan


def _bits(buffer: pa.Buffer, offset: int, length: int) -> np.ndarray[Any, Any]:
    """Bits ``offset .. offset + length`` of an Arrow bitmap (least significant
    bit first) as booleans."""
    skip = offset % 8
    data = np.frombuffer(buffer, dtype=np.uint8, count=(skip + length + 7) // 8, offset=offset // 8)
    return np.unpackbits(data, count=skip + length, bitorder="little")[skip:].view(np.bool_)


class BatchLoader:
    """Batches of one rank's share of each epoch, with exact checkpoint and resume.

    ``source`` is a `dataset_rt.loader.LocalSource` (in-process) or a
    ``flight_client.FlightSource`` (a server). The run-start keywords are
    `LoaderOptions`: ``seed`` and ``batch_size``, and optionally ``epoch``,
    ``epoch_len``, ``population``, ``columns``, ``shuffle``, ``rank`` and
    ``world_size``; the core checks them (`RunOptions`). ``rank`` and ``world_size`` say
    which share this process reads (``jax.process_index()`` and
    ``jax.process_count()`` under JAX). The population and epoch length default
    to the dataset's active ones when the loader is created; they are then
    fixed in the loader's state.

    A batch is a dict (``batch_format="numpy"``): ``payload`` (a list of
    bytes), ``position``, ``cache_id``, ``sample_id`` (uint64 arrays: cache ids
    use all 64 bits) and each requested column (an array for numbers and
    booleans, else a list); or, with ``batch_format="arrow"``, a
    ``pyarrow.Table`` of those columns.

    The loop is the usual one: ``set_epoch(e)`` before each epoch, iterate,
    ``state_dict()`` to checkpoint (from one process: every rank's state
    describes the run), ``load_state_dict()`` to resume at any world size or
    batch size.
    """

    #: Reader processes per rank (`dataset_rt.torch.DatasetLoader` has them).
    num_workers = 0
    #: The formats this loader hands batches out in.
    formats: tuple[str, ...] = ("numpy", "arrow")

    def __init__(
        self,
        source: StreamSource,
        dataset: str,
        *,
        batch_format: str = "numpy",
        log_input_every: int | None = None,
        **options: Unpack[LoaderOptions],
    ) -> None:
        if batch_format not in self.formats:
            raise InvalidArgumentError(
                f"'batch_format' must be one of {', '.join(map(repr, self.formats))}, "
                f"got {batch_format!r}"
            )
        if log_input_every is not None and (
            isinstance(log_input_every, bool)
            or not isinstance(log_input_every, int)
            or log_input_every < 1
        ):
            raise InvalidArgumentError(
                f"'log_input_every' must be None or an integer >= 1 (batches), "
                f"got {log_input_every!r}"
            )
        run = RunOptions(dataset=dataset, workers=self.num_workers, **options)
        self.source = source
        self.batch_size = run.batch_size
        self.rank = run.rank
        self.world_size = run.world_size
        self.batch_format = batch_format
        self.log_input_every = log_input_every
        if log_input_every:
            show_input_logs()
        self.input = InputStats(self.rank)
        #: When the trainer last asked whether the run was resumed elsewhere.
        self._fence_checked = -float("inf")
        #: The current epoch was read to its end and `set_epoch` was not called since.
        self._epoch_done = False
        pinned = source.resolve(run.request())
        #: The population this loader was built to read, when it named one (not
        #: the active one by default): a loaded state that reads another says so.
        self._named_population = pinned.population if run.population is not None else None
        self._state = RunState.start(run, pinned)
        self._state.check_share()

    # -- the state -------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._state.epoch

    @property
    def position(self) -> int:
        """Epoch-relative: every position before it has been consumed."""
        return self._state.position

    @property
    def segments(self) -> list[Segment]:
        """The population segments, ascending from position 0."""
        return [Segment(start, population) for start, population in self._state.segments]

    @property
    def run_state(self) -> RunState:
        """A copy of the run's state (`dataset_rt.loader.RunState`)."""
        return self._state.copy()

    def state_dict(self) -> dict[str, Any]:
        """Where the run is, as plain JSON-serialisable data.

        It assumes every rank has taken as many batches as this one (as in
        lockstep data-parallel training), so any one rank's state describes the
        run; save it from rank 0. A loader whose run was resumed elsewhere (a
        newer generation exists) raises `FencedError` instead: its state must
        not replace the newer run's checkpoint.
        """
        state = self._state
        self.source.check_run(state.dataset, state.run, state.generation)
        return state.to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a state (at any world size, worker count or batch size):
        a new generation of the run, recorded in the state with this loader's
        world size, batch size and workers.

        The loader's own dataset must be the state's; its seed, epoch length,
        columns, shuffle and population segments become the state's. A
        ``UserWarning`` names each setting the state replaces (the population
        too, when the loader was built with ``population=`` another one).
        """
        loaded = RunState.from_dict(state)
        if loaded.dataset != self._state.dataset:
            raise InvalidArgumentError(
                f"the state is of dataset {loaded.dataset!r}; this loader reads "
                f"{self._state.dataset!r}"
            )
        generation = self._agree_generation(loaded)
        loaded.resume(self.world_size, self.batch_size, self.num_workers, generation)
        replaced = [
            f"{key} {getattr(self._state, key)!r} -> {getattr(loaded, key)!r}"
            for key in ("seed", "shuffle", "columns", "epoch_len")
            if getattr(loaded, key) != getattr(self._state, key)
        ]
        # The population the resumed run reads next (the state's segments decide).
        reads = loaded.population_at(loaded.epoch_start + loaded.position)
        if self._named_population is not None and reads != self._named_population:
            replaced.append(f"population {self._named_population!r} -> {reads!r}")
        if replaced:
            warnings.warn(
                f"load_state_dict: the state's settings replace this loader's "
                f"({', '.join(replaced)}): a resumed run keeps the ones it started with. "
                f"Build the loader with the state's values to silence this.",
                UserWarning,
                stacklevel=2,
            )
        self._state = loaded
        self._epoch_done = False

    def _claim(self, loaded: RunState, *, fresh: bool) -> int:
        """Claim a generation of ``loaded``'s run after the one it was saved in."""
        return self.source.claim_run(
            loaded.dataset,
            loaded.run,
            after=loaded.generation,
            epoch=loaded.epoch,
            position=loaded.position,
            fresh=fresh,
        )

    def _rewind(self, state: RunState) -> None:
        """Go back to ``state``, one this loader was in (this run, this
        generation): the batches after it are read again. For adapters that hand
        a batch out in pieces and were stopped inside one (`HFIterableDataset`)."""
        self._state = state.copy()
        self._epoch_done = False

    def _agree_generation(self, loaded: RunState) -> int:
        """This resume's generation of the run. Without a process group each
        loader claims from the checkpoint it loaded, and every loader of one
        checkpoint gets the same generation (`DatasetLoader` lets rank 0 claim a
        new one under ``torch.distributed``)."""
        return self._claim(loaded, fresh=False)

    def _check_fence(self) -> None:
        """`FencedError` once the run was resumed elsewhere: asked before a batch
        is handed out, at most every ``source.fence_interval`` seconds (0 for
        a state directory, a file read; 1 for a server, a round trip). The
        streams are fenced too, but batches already received would go on."""
        now = time.monotonic()
        if now - self._fence_checked >= getattr(self.source, "fence_interval", 0.0):
            state = self._state
            self.source.check_run(state.dataset, state.run, state.generation)
            self._fence_checked = now

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next, from its start. Calling it with the epoch the
        state is already in keeps the position, so the usual resume loop
        (``load_state_dict``, then ``set_epoch(e)`` for ``e`` from the saved epoch)
        continues where the run stopped."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise InvalidArgumentError(f"'epoch' must be an integer >= 0, got {epoch!r}")
        self._epoch_done = False
        self._state.set_epoch(epoch)

    # -- reweighting ---------------------------------------------------------------

    def switch_population(self, population: str, *, at: int | None = None) -> int:
        """Draw from ``population`` (an id from ``put``/``do_put``) from a global
        batch boundary on; returns that absolute stream position.

        Without ``at``, the boundary is the next one that no rank has passed:
        the furthest position any rank has consumed (agreed through
        ``torch.distributed`` by `DatasetLoader` when it is initialised; then
        every rank must call this, as with any collective; without a process
        group, what this loader has consumed). ``at`` names it explicitly (a
        controller's choice): it must not be behind this rank and must lie on
        this run's batch grid. Positions before it keep their population; a
        state saved later records the switch.
        """
        # A malformed, unknown or unusable population fails here, on every rank
        # alike, not later in a reader.
        if not isinstance(population, str):
            raise InvalidArgumentError(
                f"a population id is 32 lowercase hex digits (as do_put answers), "
                f"got {population!r}"
            )
        self.source.resolve(self._state.command(population))
        consumed = self._state.epoch_start + self._state.position
        if at is None:
            at = self._furthest(consumed)
        if isinstance(at, bool) or not isinstance(at, int) or at < consumed:
            raise InvalidArgumentError(
                f"'at' must be an absolute position >= {consumed} (what this rank has "
                f"consumed), got {at!r}"
            )
        self._state.switch(at, population)
        return at

    def _furthest(self, consumed: int) -> int:
        """The furthest position any rank has consumed, this one's without a
        process group."""
        return consumed

    # -- iteration -----------------------------------------------------------------

    def __len__(self) -> int:
        """Batches this rank still takes in the current epoch."""
        return self._state.batches_left()

    def __iter__(self) -> Iterator[Any]:
        """The rest of the current epoch for this rank; the state moves with
        every batch taken. When the epoch is done, ``position`` is the epoch
        length (the tail the partition rule drops is dropped).

        Iterating again after the epoch ended, without `set_epoch`, is an error
        that says so (it would read nothing)."""
        if self._epoch_done:
            epoch = self._state.epoch
            raise InvalidArgumentError(
                f"epoch {epoch} of this loader is done: every rank has read its share. "
                f"Call loader.set_epoch({epoch + 1}) before iterating again, as with "
                f"DistributedSampler.set_epoch (set_epoch({epoch}) reads nothing more of "
                f"epoch {epoch})"
            )
        while True:
            if not self._state.parts():
                return
            plan = self._state.segments
            batches = self._batches()
            for first_position, batch in self._watched(batches):
                self._check_fence()
                self._state.advance(first_position)
                yield self._ready(batch)
                if self._state.segments != plan:
                    # A switch was recorded: stop these readers (their prefetched
                    # batches may be past it) and read on with the new segments.
                    break
            else:
                self._state.finish_epoch()
                self._epoch_done = True
                return
            del batches

    def _batches(self) -> Iterator[Tagged]:
        """The rest of the current parts, read in this process."""
        return tagged(self.source, self._state.copy(), self.rank)

    def _ready(self, batch: Any) -> Any:
        """A batch read in-process (an Arrow table) in the loader's format."""
        return batch if self.batch_format == "arrow" else numpy_columns(batch)

    def _watched(self, batches: Iterator[Tagged]) -> Iterator[tuple[int, Any]]:
        """``batches`` as (first position, batch), timing how long each took to
        arrive (the trainer's wait, not its compute: the time is taken while the
        trainer is inside ``next()``) and noting each reader's restarts."""
        self.input.new_readers()
        while True:
            asked = time.perf_counter()
            try:
                first_position, reader, restarts, notes, batch = next(batches)
            except StopIteration:
                return
            self.input.waited(time.perf_counter() - asked)
            self.input.reader_restarts(reader, restarts)
            for note in notes:
                input_log.warning("rank %d, reader %d: %s", self.rank, reader, note)
            if self.log_input_every and self.input.batches % self.log_input_every == 0:
                self.input.log()
            yield first_position, batch

    def input_stats(self) -> dict[str, Any]:
        """How long this rank waited for its batches (p50/p99 over the last 10,000,
        in ms, and the total) and how many times its streams restarted on another
        replica (see `dataset_rt.signals`)."""
        return self.input.snapshot()
