"""PyTorch adapter: a training loader with exact checkpoint and resume (a
``CachedDataset`` as an ``IterableDataset`` is in `dataset_rt.integrations.torch`).

`DatasetLoader` reads one rank's partition of an epoch as batches of
``batch_size`` samples (the partition rule with ``block = batch_size``), through
a ``torch.utils.data.DataLoader``. Rank ``r``'s ``q``-th batch is block
``r + q * world_size``; the DataLoader asks its workers for batches round-robin,
so worker ``k`` reads the rank's batches ``q = k, k + n, ...`` (the lane
``k * world_size + r`` of ``n * world_size``). What a rank receives, and in which
order, does not depend on the worker count, and after every rank took ``m``
batches the consumed positions are a prefix of the epoch.
``state_dict()`` is that prefix (and the population segments); it resumes at any
world size and any worker count. See docs/training.md.

Workers are started with the ``forkserver`` method (``spawn`` where that is
missing), never ``fork``: a process that has used a gRPC client (any training
script that talked to a Flight server first) cannot fork safely.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import select
import shutil
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

try:
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info
except ImportError as error:  # pragma: no cover - exercised when torch is absent
    raise ImportError(
        "dataset_rt.torch needs PyTorch; install it with `pip install torch` "
        "(or the project's `torch` dependency group)"
    ) from error

import numpy as np
import pyarrow as pa

from dataset_rt.config import ShuffleMode
from dataset_rt.errors import InternalError, InvalidArgumentError
from dataset_rt.loader import RunState, Segment, StreamSource, blocks
from dataset_rt.service import StreamRequest
from dataset_rt.signals import InputStats, show_input_logs
from dataset_rt.signals import log as input_log

#: A worker's batch for the loader: (first position, reader id, reader's stream
#: restarts so far, its failovers since its last batch in words, batch); the
#: reader id is the worker's id, -1 in-process.
Tagged = tuple[int, int, int, list[str], Any]

#: Why a worker started while a worker process was importing the training script.
MAIN_GUARD = (
    "DataLoader workers were started while a worker process was importing the training "
    "script: the script trains when it is imported. The loader's workers are started with "
    "'forkserver' (or 'spawn'), which import the script again in every worker, so the "
    "training code must run only in the main process: put it under "
    '`if __name__ == "__main__":` (or in a function called from there)'
)


class DatasetLoader:
    """Batches of one rank's share of each epoch, with exact checkpoint and resume.

    ``source`` is a `dataset_rt.loader.LocalSource` (in-process) or a
    ``flight_client.FlightSource`` (a server). ``rank`` and ``world_size``
    default to ``torch.distributed``'s when it is initialised (else 0 and 1).
    The population and epoch length default to the dataset's active ones when
    the loader is created; they are then fixed in the loader's state.

    A batch is, by default, a dict: ``payload`` (list of bytes), ``position``,
    ``cache_id``, ``sample_id`` (uint64 tensors: cache ids use all 64 bits) and
    each requested column (a tensor for numbers and booleans, else a list). With ``transform``, each
    sample (a dict of the same keys holding one value) is transformed in the
    worker and the results are collated by ``collate_fn`` (default:
    ``torch.utils.data.default_collate``); ``collate_fn`` alone receives the list
    of sample dicts. With workers, both must be picklable (module-level).
    Workers are kept across epochs and population switches unless
    ``persistent_workers=False``.
    """

    def __init__(
        self,
        source: StreamSource,
        dataset: str,
        *,
        batch_size: int,
        seed: int,
        epoch: int = 0,
        epoch_len: int | None = None,
        population: str | None = None,
        columns: tuple[str, ...] | list[str] = (),
        shuffle: ShuffleMode = True,
        rank: int | None = None,
        world_size: int | None = None,
        num_workers: int = 0,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        prefetch_factor: int | None = None,
        pin_memory: bool = False,
        multiprocessing_context: str | None = None,
        log_input_every: int | None = None,
        persistent_workers: bool = True,
    ) -> None:
        for name, value, low in (
            ("batch_size", batch_size, 1),
            ("num_workers", num_workers, 0),
            ("epoch", epoch, 0),
            ("seed", seed, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidArgumentError(f"{name!r} must be an integer >= {low}, got {value!r}")
        if multiprocessing_context == "fork":
            raise InvalidArgumentError(
                "multiprocessing_context='fork' is refused: a forked worker of a process that "
                "used gRPC (a Flight client) hangs; use 'forkserver' or 'spawn' (the default)"
            )
        self.source = source
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.transform = transform
        self.collate_fn = collate_fn
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.persistent_workers = bool(persistent_workers)
        #: With persistent workers: the DataLoader kept across epochs and switches,
        #: and the file its workers read each iteration's plan from.
        self._kept: tuple[DataLoader[Any], Path] | None = None
        self.multiprocessing_context = multiprocessing_context or _default_start_method()
        distributed = dist.is_available() and dist.is_initialized()
        self.world_size = world_size or (dist.get_world_size() if distributed else 1)
        self.rank = rank if rank is not None else (dist.get_rank() if distributed else 0)
        if not 0 <= self.rank < self.world_size:
            raise InvalidArgumentError(
                f"'rank' must be in [0, world_size={self.world_size}), got {self.rank}"
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
        self.log_input_every = log_input_every
        if log_input_every:
            show_input_logs()
        self.input = InputStats(self.rank)
        #: When the trainer last asked whether the run was resumed elsewhere.
        self._fence_checked = -float("inf")
        #: The current epoch was read to its end and `set_epoch` was not called since.
        self._epoch_done = False
        pinned = source.resolve(
            StreamRequest(
                dataset=dataset,
                seed=seed,
                epoch=epoch,
                epoch_len=epoch_len,
                population=population,
                columns=list(columns),
                shuffle=shuffle,
            )
        )
        if pinned.population is None or pinned.epoch_len is None:
            raise InternalError(f"the source did not pin the request: {pinned!r}")
        self._state = RunState(
            dataset=dataset,
            seed=seed,
            shuffle=shuffle,
            columns=list(columns),
            epoch_len=pinned.epoch_len,
            population=pinned.population,
            batch_size=batch_size,
            world_size=self.world_size,
            workers=num_workers,
            epoch=epoch,
        )
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
        columns, shuffle and population segments become the state's.
        """
        loaded = RunState.from_dict(state)
        if loaded.dataset != self._state.dataset:
            raise InvalidArgumentError(
                f"the state is of dataset {loaded.dataset!r}; this loader reads "
                f"{self._state.dataset!r}"
            )
        generation = self._claim(loaded)
        loaded.resume(self.world_size, self.batch_size, self.num_workers, generation)
        replaced = [
            f"{key} {getattr(self._state, key)!r} -> {getattr(loaded, key)!r}"
            for key in ("seed", "shuffle", "columns", "epoch_len")
            if getattr(loaded, key) != getattr(self._state, key)
        ]
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

    def _claim(self, loaded: RunState) -> int:
        """This resume's generation of the run. With ``torch.distributed``, rank
        0 claims a new one and tells the others (every rank calls
        ``load_state_dict``, as with any collective); without it each loader
        claims from the checkpoint it loaded, and every loader of one
        checkpoint gets the same generation."""

        def claim(fresh: bool) -> int:
            return self.source.claim_run(
                loaded.dataset,
                loaded.run,
                after=loaded.generation,
                epoch=loaded.epoch,
                position=loaded.position,
                fresh=fresh,
            )

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            chosen = torch.zeros(1, dtype=torch.int64)
            if dist.get_rank() == 0:
                chosen[0] = claim(fresh=True)
            dist.broadcast(chosen, src=0)
            return int(chosen.item())
        return claim(fresh=False)

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
        the furthest position any rank has consumed, agreed through
        ``torch.distributed`` when it is initialised (then every rank must call
        this, as with any collective). ``at`` names it explicitly (a controller's
        choice): it must not be behind this rank and must lie on this run's batch
        grid. Positions before it keep their population; a state saved later
        records the switch.
        """
        # A malformed, unknown or unusable population fails here, on every rank
        # alike, not later in a DataLoader worker.
        if not isinstance(population, str):
            raise InvalidArgumentError(
                f"a population id is 32 lowercase hex digits (as do_put answers), "
                f"got {population!r}"
            )
        self.source.resolve(self._state.command(population))
        consumed = self._state.epoch_start + self._state.position
        if at is None:
            at = consumed
            if dist.is_available() and dist.is_initialized():
                furthest = torch.tensor([consumed], dtype=torch.int64)
                dist.all_reduce(furthest, op=dist.ReduceOp.MAX)
                at = int(furthest.item())
        if isinstance(at, bool) or not isinstance(at, int) or at < consumed:
            raise InvalidArgumentError(
                f"'at' must be an absolute position >= {consumed} (what this rank has "
                f"consumed), got {at!r}"
            )
        self._state.switch(at, population)
        return at

    # -- iteration -----------------------------------------------------------------

    def stateful_dataset(self) -> RankReader:
        """The rest of the current epoch as an ``IterableDataset`` of batches, for
        torchdata's ``StatefulDataLoader(dataset, batch_size=None, num_workers=n)``.

        Its checkpoints restore with the same ``n``, as StatefulDataLoader's
        always do; the loader's own ``state_dict`` resumes at any world size and
        worker count. Workers need a start method other than ``fork`` here too
        (``multiprocessing_context="forkserver"``).
        """
        return self._reader(tagged=False)

    def stateful_loader(self, state: Mapping[str, Any] | None = None, **options: Any) -> Any:
        """torchdata's ``StatefulDataLoader`` over `stateful_dataset`, with this
        loader's worker count and start method unless ``options`` say otherwise,
        restored from ``state`` (a StatefulDataLoader checkpoint) if given.

        torchdata resumes a checkpoint only with the worker count that took it
        (a bare ``AssertionError`` otherwise); here that is refused up front,
        saying so. The loader's own `state_dict` resumes at any worker count.
        """
        try:
            from torchdata.stateful_dataloader import (  # type: ignore[import-untyped]
                StatefulDataLoader,
            )
        except ImportError as error:
            raise ImportError(
                "stateful_loader needs torchdata (`pip install torchdata`)"
            ) from error
        options.setdefault("num_workers", self.num_workers)
        if options["num_workers"]:
            context = _worker_context(self.multiprocessing_context)
            options.setdefault("multiprocessing_context", context)
        if state is not None:
            snapshot = state.get("_snapshot") if isinstance(state, Mapping) else None
            main = snapshot.get("_main_snapshot") if isinstance(snapshot, Mapping) else None
            saved = main.get("_num_workers") if isinstance(main, Mapping) else None
            if saved is not None and saved != options["num_workers"]:
                raise InvalidArgumentError(
                    f"this StatefulDataLoader checkpoint was taken with num_workers={saved} "
                    f"and torchdata resumes it only with the same count, not "
                    f"{options['num_workers']}; resume with num_workers={saved}, or checkpoint "
                    f"with the loader's own state_dict(), which resumes at any worker count"
                )
        loader = StatefulDataLoader(self.stateful_dataset(), batch_size=None, **options)
        if state is not None:
            loader.load_state_dict(state)
        return loader

    def __len__(self) -> int:
        """Batches this rank still takes in the current epoch."""
        return self._state.batches_left()

    def __iter__(self) -> Iterator[Any]:
        """The rest of the current epoch for this rank; the state moves with
        every batch taken. When the epoch is done, ``position`` is the epoch
        length (the tail the partition rule drops is dropped).

        Iterating again after the epoch ended, without `set_epoch`, is an error
        that says so (it would read nothing), as is a worker started while the
        training script is being imported by a worker process."""
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
            batches = self._data_loader()
            for first_position, batch in self._watched(batches):
                self._check_fence()
                self._state.advance(first_position)
                yield self._ready(batch)
                if self._state.segments != plan:
                    # A switch was recorded: stop these workers (their prefetched
                    # batches may be past it) and read on with the new segments.
                    break
            else:
                self._state.finish_epoch()
                self._epoch_done = True
                return
            del batches

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
            except RuntimeError as error:
                if "exited unexpectedly" not in str(error):
                    raise
                raise InternalError(
                    f"{error}: see the worker's error above. If it says a new process was "
                    f"started before bootstrapping finished, the training script needs "
                    f'`if __name__ == "__main__":` (forkserver and spawn workers import it)'
                ) from error
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

    def _ready(self, batch: Any) -> Any:
        """A default-collated batch arrives as arrays; hand it out as tensors."""
        if self.transform is not None or self.collate_fn is not None:
            return batch
        tensors = _as_tensors(batch)
        if self.pin_memory and torch.cuda.is_available():
            tensors = {k: v.pin_memory() if torch.is_tensor(v) else v for k, v in tensors.items()}
        return tensors

    def _reader(self, *, tagged: bool, plan: Path | None = None) -> RankReader:
        return RankReader(
            self.source,
            self._state.copy(),
            rank=self.rank,
            transform=self.transform,
            collate_fn=self.collate_fn,
            tagged=tagged,
            plan=plan,
        )

    def _data_loader(self) -> Iterator[Tagged]:
        if self.num_workers and getattr(multiprocessing.current_process(), "_inheriting", False):
            # Python's own check would say only "bootstrapping phase".
            raise InvalidArgumentError(MAIN_GUARD)
        if not (self.num_workers and self.persistent_workers):
            return iter(self._new_data_loader(self._reader(tagged=True)))
        if self._kept is None:
            # The workers outlive an iteration: each new one reads its plan (the
            # run's state) from this file, written before the DataLoader
            # tells them to iterate again (PyTorch's `_ResumeIteration`).
            directory = Path(tempfile.mkdtemp(prefix="dataset_rt-plan-"))
            weakref.finalize(self, shutil.rmtree, directory, True)
            plan = directory / "plan.json"
            _write_plan(plan, self._state)
            reader = self._reader(tagged=True, plan=plan)
            self._kept = (self._new_data_loader(reader, persistent=True), plan)
        loader, plan = self._kept
        _write_plan(plan, self._state)
        return iter(loader)

    def _new_data_loader(self, reader: RankReader, *, persistent: bool = False) -> DataLoader[Any]:
        options: dict[str, Any] = {}
        if self.num_workers:
            options["multiprocessing_context"] = _worker_context(self.multiprocessing_context)
            options["worker_init_fn"] = functools.partial(_exit_with, os.getpid())
            if self.prefetch_factor is not None:
                options["prefetch_factor"] = self.prefetch_factor
        loader = DataLoader(
            reader,
            batch_size=None,
            num_workers=self.num_workers,
            collate_fn=_as_is,  # type: ignore[arg-type, unused-ignore]
            pin_memory=self.pin_memory,
            in_order=True,  # the round-robin order the partition rule relies on
            persistent_workers=persistent,
            **options,
        )
        return loader


class RankReader(IterableDataset[Any]):  # type: ignore[misc, unused-ignore]
    """The worker side: one DataLoader worker's partition of each part, cut into
    blocks and collated. Yields ``(first_position, batch)``, or the batch alone
    with ``tagged=False`` (`DatasetLoader.stateful_dataset`).

    It is ``Stateful`` in torchdata's sense: ``state_dict()`` in a worker counts
    the batches that worker yielded, and ``load_state_dict()`` makes the next
    iteration skip them by offset, without reading them.
    """

    def __init__(
        self,
        source: StreamSource,
        state: RunState,
        *,
        rank: int,
        transform: Callable[[dict[str, Any]], Any] | None,
        collate_fn: Callable[[list[Any]], Any] | None,
        tagged: bool = True,
        plan: Path | None = None,
    ) -> None:
        self.tagged = tagged
        self.plan = plan
        self.yielded = 0
        self.skip = 0
        self.source = source
        self.state = state
        self.rank = rank
        self.transform = transform
        self.collate_fn = collate_fn

    def state_dict(self) -> dict[str, int]:
        return {"batches": self.yielded}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        batches = state.get("batches") if isinstance(state, Mapping) else None
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 0:
            raise InvalidArgumentError(
                f"a RankReader state is {{'batches': integer >= 0}}, got {state!r}"
            )
        self.skip = batches

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.plan is not None:  # a persistent worker: this iteration's plan
            self.state = _read_plan(self.plan)
        skip, self.skip = self.skip, 0
        self.yielded = skip  # counted as yielded: a later state_dict includes them
        notes = getattr(self.source, "failover_notes", None)
        told = len(notes(0)) if notes is not None else 0
        size = self.state.batch_size
        for request in self.state.requests(self.rank, worker, workers):
            # Skip whole requests, then whole blocks by offset: nothing skipped is read.
            count = request.samples_per_rank() // size
            if skip >= count:
                skip -= count
                continue
            request = request.resumed(skip * size)
            skip = 0
            for batch in blocks(self.source.open(request), size):
                self.yielded += 1
                collated = self._collate(batch)
                if self.tagged:
                    first = int(batch.column("position")[0].as_py())
                    restarts = int(getattr(self.source, "restarts", 0))
                    new = notes(told) if notes is not None else []
                    told += len(new)
                    yield first, worker if info is not None else -1, restarts, new, collated
                else:
                    yield collated

    def _collate(self, batch: pa.Table) -> Any:
        if self.transform is None and self.collate_fn is None:
            columns = {name: _column(batch.column(name)) for name in batch.schema.names}
            # Tagged batches reach the trainer, which makes the tensors
            # (`_as_tensors`): a NumPy array crosses the worker queue in-band,
            # a tensor through a shared-memory segment per tensor, which is
            # slower for batches this size.
            return columns if self.tagged else _as_tensors(columns)
        samples = batch.to_pylist()
        if self.transform is not None:
            samples = [self.transform(sample) for sample in samples]
        collate = self.collate_fn or torch.utils.data.default_collate
        return collate(samples)


def _write_plan(path: Path, state: RunState) -> None:
    """What persistent workers read next (replaced whole: a reader never sees half)."""
    written = path.with_suffix(".tmp")
    written.write_bytes(state.to_json())
    os.replace(written, path)


def _read_plan(path: Path) -> RunState:
    return RunState.from_json(path.read_bytes())


def _column(array: pa.ChunkedArray) -> Any:
    """A column as users expect it: numbers and booleans as an array (a tensor
    once `_as_tensors` has run), else a list."""
    kind = array.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return array.to_numpy().copy()  # writable, as torch.from_numpy wants
    return array.to_pylist()


def _as_tensors(columns: dict[str, Any]) -> dict[str, Any]:
    return {
        name: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
        for name, value in columns.items()
    }


def _as_is(batch: Tagged) -> Tagged:
    return batch


def _exit_with(trainer: int, worker_id: int) -> None:
    """End this worker when the training process ends, however it ends.

    A forkserver's child is not the trainer's child, so PyTorch's own check (is
    my parent alive?) never fires when the trainer is killed; without this the
    workers, and the forkserver waiting on them, would outlive a crashed run.
    """
    del worker_id
    threading.Thread(target=_wait_for_exit, args=(trainer,), daemon=True).start()


def _wait_for_exit(pid: int) -> None:
    try:
        handle = os.pidfd_open(pid)  # readable once the process has ended (Linux)
    except (AttributeError, OSError):
        while True:
            time.sleep(1.0)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(0)
            except PermissionError:
                continue
    select.select([handle], [], [])
    os._exit(0)


def _default_start_method() -> str:
    methods = multiprocessing.get_all_start_methods()
    return "forkserver" if "forkserver" in methods else "spawn"


def _worker_context(method: str) -> Any:
    """The multiprocessing context of the workers. A forkserver imports this
    module (torch, pyarrow, the engine) before it forks, so starting workers
    takes milliseconds instead of seconds (a loader starts them at every epoch
    and population switch); it loads no gRPC client, so its children are safe."""
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload([__name__])
    return context
