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
script that talked to a Flight server first) cannot fork safely. A loader with
workers starts the forkserver when it is built (`_start_server`), so that its
imports overlap the trainer's own start, and the trainer reads the first
batches itself until the workers have started (`DatasetLoader._head_start`).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import itertools
import multiprocessing
import multiprocessing.forkserver
import os
import select
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from typing_extensions import Unpack

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

from dataset_rt.batches import (
    BatchLoader,
    LoaderOptions,
    Tagged,
    numpy_columns,
    process_group_share,
    tagged,
)
from dataset_rt.errors import InternalError, InvalidArgumentError
from dataset_rt.loader import RunState, StreamSource

#: Why a worker started while a worker process was importing the training script.
MAIN_GUARD = (
    "DataLoader workers were started while a worker process was importing the training "
    "script: the script trains when it is imported. The loader's workers are started with "
    "'forkserver' (or 'spawn'), which import the script again in every worker, so the "
    "training code must run only in the main process: put it under "
    '`if __name__ == "__main__":` (or in a function called from there)'
)


class DatasetLoader(BatchLoader):
    """Batches of one rank's share of each epoch, with exact checkpoint and resume,
    read by DataLoader workers (`dataset_rt.batches.BatchLoader` with workers,
    tensors and ``torch.distributed``).

    ``source`` is a `dataset_rt.loader.LocalSource` (in-process) or a
    ``flight_client.FlightSource`` (a server). ``rank`` and ``world_size``
    default to ``torch.distributed``'s when it is initialised (else 0 and 1).
    The population and epoch length default to the dataset's active ones when
    the loader is created; they are then fixed in the loader's state.

    A batch is, by default, a dict: ``payload`` (list of bytes), ``position``,
    ``cache_id``, ``sample_id`` (uint64 tensors: cache ids use all 64 bits) and
    each requested column (a tensor for numbers and booleans, else a list);
    ``batch_format="numpy"`` hands the same out as NumPy arrays and
    ``"arrow"`` as a ``pyarrow.Table``. With ``transform``, each
    sample (a dict of the same keys holding one value) is transformed in the
    worker and the results are collated by ``collate_fn`` (default:
    ``torch.utils.data.default_collate``); ``collate_fn`` alone receives the list
    of sample dicts. With workers, both must be picklable (module-level).
    Workers are kept across epochs and population switches unless
    ``persistent_workers=False``.
    """

    formats = ("torch", "numpy", "arrow")

    def __init__(
        self,
        source: StreamSource,
        dataset: str,
        *,
        num_workers: int = 0,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        batch_format: str = "torch",
        prefetch_factor: int | None = None,
        pin_memory: bool = False,
        multiprocessing_context: str | None = None,
        log_input_every: int | None = None,
        persistent_workers: bool = True,
        **options: Unpack[LoaderOptions],
    ) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise InvalidArgumentError(
                f"'num_workers' must be an integer >= 0, got {num_workers!r}"
            )
        if multiprocessing_context == "fork":
            raise InvalidArgumentError(
                "multiprocessing_context='fork' is refused: a forked worker of a process that "
                "used gRPC (a Flight client) hangs; use 'forkserver' or 'spawn' (the default)"
            )
        if batch_format != "torch" and (transform is not None or collate_fn is not None):
            raise InvalidArgumentError(
                f"batch_format={batch_format!r} applies to the default batches; with "
                f"transform or collate_fn a batch is what collate_fn returns"
            )
        self.num_workers = num_workers
        self.transform = transform
        self.collate_fn = collate_fn
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.persistent_workers = bool(persistent_workers)
        #: With persistent workers: the DataLoader kept across epochs and switches,
        #: and the file its workers read each iteration's plan from.
        self._kept: tuple[DataLoader[Any], Path] | None = None
        #: The kept DataLoader's workers while they start (`_WorkersStarting`).
        self._starting: _WorkersStarting | None = None
        self.multiprocessing_context = multiprocessing_context or _default_start_method()
        process_group_share(options)
        super().__init__(
            source,
            dataset,
            batch_format=batch_format,
            log_input_every=log_input_every,
            **options,
        )
        if self.num_workers and not _bootstrapping():
            # The workers' forkserver starts now, while the trainer goes on
            # building its model, instead of at the first `iter()`.
            _start_server(self.multiprocessing_context)

    # -- agreement across ranks -------------------------------------------------------

    def _agree_generation(self, loaded: RunState) -> int:
        """With ``torch.distributed``, rank 0 claims a new generation and tells
        the others (every rank calls ``load_state_dict``, as with any
        collective); without it each loader claims from the checkpoint it
        loaded, and every loader of one checkpoint gets the same generation."""
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            chosen = torch.zeros(1, dtype=torch.int64)
            if dist.get_rank() == 0:
                chosen[0] = self._claim(loaded, fresh=True)
            dist.broadcast(chosen, src=0)
            return int(chosen.item())
        return self._claim(loaded, fresh=False)

    def _furthest(self, consumed: int) -> int:
        if dist.is_available() and dist.is_initialized():
            furthest = torch.tensor([consumed], dtype=torch.int64)
            dist.all_reduce(furthest, op=dist.ReduceOp.MAX)
            return int(furthest.item())
        return consumed

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

    def _ready(self, batch: Any) -> Any:
        """A default batch arrives as arrays (or a table); hand it out in the
        loader's format."""
        if self.transform is not None or self.collate_fn is not None:
            return batch
        if self.batch_format == "arrow":
            return batch
        payload = batch.get("payload")
        if isinstance(payload, Packed):
            batch["payload"] = payload.unpack()
        if self.batch_format == "numpy":
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
            batch_format=self.batch_format,
            tagged=tagged,
            plan=plan,
        )

    def _batches(self) -> Iterator[Tagged]:
        if self.num_workers and _bootstrapping():
            # Python's own check would say only "bootstrapping phase".
            raise InvalidArgumentError(MAIN_GUARD)
        if not (self.num_workers and self.persistent_workers):
            return _explained(iter(self._new_data_loader(self._reader(tagged=True))))
        if self._kept is None:
            # The workers outlive an iteration: each new one reads its plan (the
            # run's state) from this file, written before the DataLoader
            # tells them to iterate again (PyTorch's `_ResumeIteration`).
            directory = Path(tempfile.mkdtemp(prefix="dataset_rt-plan-"))
            weakref.finalize(self, shutil.rmtree, directory, True)
            plan = directory / "plan.json"
            _write_plan(plan, None)
            reader = self._reader(tagged=True, plan=plan)
            self._kept = (self._new_data_loader(reader, persistent=True), plan)
            self._starting = _WorkersStarting(self._kept[0])
            if self.transform is None and self.collate_fn is None:
                return _explained(self._head_start(self._starting))
        return _explained(self._from_workers())

    def _from_workers(self) -> Iterator[Tagged]:
        """The kept DataLoader's batches from the run's state on, once its
        workers have started."""
        assert self._kept is not None
        if self._starting is not None:
            self._starting.wait()
            self._starting = None
            _watch_workers()
        loader, plan = self._kept
        _write_plan(plan, self._state)
        return iter(loader)

    def _head_start(self, starting: _WorkersStarting) -> Iterator[Tagged]:
        """The first iteration's batches: read in this process (as with no
        workers, a few milliseconds each) until the workers have started, then
        from the workers, which go on from the state the trainer has consumed
        to. A new process's workers wait for the forkserver's imports (torch,
        pyarrow, the engine: seconds), then import the training script; the
        first batch does not. A stream is a function of its position, so who
        reads a batch changes nothing in it.

        Only the default batches start this way: a ``transform`` or
        ``collate_fn`` is the workers' job (it may be heavy), so with one the
        first batch waits for them.
        """
        inline = self._reader(tagged=True).__iter__()  # a generator: closed below
        try:
            for batch in inline:
                yield batch
                # Back here, the trainer has consumed ``batch`` (`BatchLoader.__iter__`
                # advanced the state), so the workers start after it.
                if starting.done():
                    break
            else:
                # The parts ended in this process. Their end waits for the workers
                # anyway, so that a worker that cannot start fails this epoch, not
                # a later one.
                starting.wait()
                return
        finally:
            inline.close()
        yield from self._from_workers()

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
        batch_format: str = "torch",
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
        self.batch_format = batch_format
        self.in_worker = False

    def state_dict(self) -> dict[str, int]:
        return {"batches": self.yielded}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        batches = state.get("batches") if isinstance(state, Mapping) else None
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 0:
            raise InvalidArgumentError(
                f"a RankReader state is {{'batches': integer >= 0}}, got {state!r}"
            )
        self.skip = batches

    def __iter__(self) -> Generator[Any, None, None]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.plan is not None:  # a persistent worker: this iteration's plan
            planned = _read_plan(self.plan)
            if planned is None:  # the workers are starting (`_WorkersStarting`)
                return
            self.state = planned
        skip, self.skip = self.skip, 0
        self.yielded = skip  # counted as yielded: a later state_dict includes them
        reader = worker if info is not None else -1
        self.in_worker = info is not None
        for first, _, restarts, notes, table in tagged(
            self.source, self.state, self.rank, worker, workers, reader=reader, skip=skip
        ):
            self.yielded += 1
            collated = self._collate(table)
            yield (first, reader, restarts, notes, collated) if self.tagged else collated

    def _collate(self, batch: pa.Table) -> Any:
        if self.transform is None and self.collate_fn is None:
            if self.batch_format == "arrow":
                return batch
            if self.tagged and self.in_worker and batch["payload"].nbytes >= PACK_BYTES:
                return _packed(batch)
            columns = numpy_columns(batch)
            # Tagged batches reach the trainer, which makes the tensors
            # (`_as_tensors`): a NumPy array crosses the worker queue in-band,
            # a tensor through a shared-memory segment per tensor, which is
            # slower for batches this size.
            if self.tagged or self.batch_format == "numpy":
                return columns
            return _as_tensors(columns)
        samples = batch.to_pylist()
        if self.transform is not None:
            samples = [self.transform(sample) for sample in samples]
        collate = self.collate_fn or torch.utils.data.default_collate
        return collate(samples)


#: A worker sends the payloads of a batch at least this large as one tensor in
#: shared memory (`Packed`) instead of bytes objects through the queue's pipe.
#: Measured with two workers, batches of 256 records: at 64 KiB a record (16 MiB
#: batches) 36-46 -> 56-67 batches/s through the queue; at 1 KiB (256 KiB
#: batches) a shared-memory segment per batch costs more than the pipe.
PACK_BYTES = 4 << 20


class Packed(NamedTuple):
    """A batch's payloads in one shared-memory tensor (``data``), record ``i`` at
    ``data[offsets[i]:offsets[i + 1]]``; the trainer makes them bytes again."""

    data: torch.Tensor
    offsets: np.ndarray

    def unpack(self) -> list[bytes]:
        view = self.data.numpy().data
        bounds = self.offsets.tolist()
        return [bytes(view[start:end]) for start, end in itertools.pairwise(bounds)]


def _packed(batch: pa.Table) -> dict[str, Any]:
    """A worker's batch with its payloads packed (`Packed`), the columns in order."""
    payloads = batch["payload"].combine_chunks()
    large = pa.types.is_large_binary(payloads.type)
    _, offsets_buffer, data_buffer = payloads.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64 if large else np.int32)
    offsets = offsets[payloads.offset : payloads.offset + len(payloads) + 1].astype(np.int64)
    start, end = int(offsets[0]), int(offsets[-1])
    # In shared memory from the start: the queue then passes a handle, not bytes.
    data = torch.empty(end - start, dtype=torch.uint8).share_memory_()  # type: ignore[no-untyped-call]
    if data_buffer is not None and end > start:
        data.numpy()[:] = np.frombuffer(data_buffer, dtype=np.uint8)[start:end]
    columns = numpy_columns(batch.drop_columns(["payload"]))
    packed = Packed(data, offsets - start)
    return {name: packed if name == "payload" else columns[name] for name in batch.schema.names}


def _write_plan(path: Path, state: RunState | None) -> None:
    """What persistent workers read next (replaced whole: a reader never sees
    half); ``None``: nothing (they are starting, `_WorkersStarting`)."""
    written = path.with_suffix(".tmp")
    written.write_bytes(b"" if state is None else state.to_json())
    os.replace(written, path)


def _read_plan(path: Path) -> RunState | None:
    plan = path.read_bytes()
    return RunState.from_json(plan) if plan else None


class _WorkersStarting:
    """A persistent DataLoader's workers, started in a thread.

    ``iter(loader)`` starts the worker processes: with ``forkserver`` it
    returns once the server has forked them, after its imports; a second
    ``iter()`` (PyTorch's ``_ResumeIteration``) returns once every worker has
    answered, after importing the training script. The plan says "nothing"
    meanwhile (`_write_plan`), so the workers read nothing and answer at once.
    Then ``iter()`` from the trainer costs one round trip.
    """

    def __init__(self, loader: DataLoader[Any]) -> None:
        self._loader = loader
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._start, name="dataset_rt-workers-start", daemon=True
        )
        self._thread.start()
        _STARTING.add(self)

    def _start(self) -> None:
        try:
            iter(self._loader)
            iter(self._loader)
        except BaseException as error:  # handed to the trainer by `wait`
            self._error = error

    def done(self) -> bool:
        return not self._thread.is_alive()

    def settle(self, seconds: float) -> None:
        """Wait at most ``seconds`` for the start to end, its error kept."""
        self._thread.join(max(0.0, seconds))

    def wait(self) -> None:
        """Once the workers have started; their start's error, if any."""
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def _as_tensors(columns: dict[str, Any]) -> dict[str, Any]:
    return {
        name: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
        for name, value in columns.items()
    }


def _as_is(batch: Tagged) -> Tagged:
    return batch


def _explained(batches: Iterator[Tagged]) -> Iterator[Tagged]:
    """A DataLoader's batches, a worker that died of the main-guard trap named."""
    try:
        yield from batches
    except RuntimeError as error:
        if "exited unexpectedly" not in str(error):
            raise
        raise InternalError(
            f"{error}: see the worker's error above. If it says a new process was "
            f"started before bootstrapping finished, the training script needs "
            f'`if __name__ == "__main__":` (forkserver and spawn workers import it)'
        ) from error


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


#: Workers starting now (`_WorkersStarting`), which an exit waits for.
_STARTING: weakref.WeakSet[_WorkersStarting] = weakref.WeakSet()

#: How long an exit waits for workers still starting.
EXIT_WAIT_SECONDS = 60.0


@atexit.register
def _let_starts_finish() -> None:
    """At exit, wait (bounded) for workers still starting: a trainer that took
    its first batches and ended while they started would leave the
    forkserver unpickling half-made workers whose semaphores are gone, each
    printing a traceback. Registered after multiprocessing's own exit
    handler, so it runs before it."""
    deadline = time.monotonic() + EXIT_WAIT_SECONDS
    for starting in list(_STARTING):
        starting.settle(deadline - time.monotonic())


def _watch_workers() -> None:
    """PyTorch's SIGCHLD handler, which names a worker killed by a signal at
    once: a DataLoader sets it when its workers start in the main thread only,
    and `_WorkersStarting` starts them in another (without it, a dead worker is
    noticed by the trainer's next 5 s check, as "exited unexpectedly")."""
    if threading.current_thread() is not threading.main_thread():
        return
    from torch.utils.data._utils import signal_handling

    setter = getattr(signal_handling, "_set_SIGCHLD_handler", None)
    if setter is not None:  # private: absent in some release, the 5 s check remains
        setter()


def _default_start_method() -> str:
    methods = multiprocessing.get_all_start_methods()
    return "forkserver" if "forkserver" in methods else "spawn"


def _bootstrapping() -> bool:
    """This process is a worker importing the training script (forkserver and
    spawn workers do): a loader built there must start nothing (`MAIN_GUARD`)."""
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def _start_server(method: str) -> None:
    """With ``forkserver``: set what the server imports before it forks workers
    (`_PRELOAD`) and start it unless it runs, without waiting for it.

    ``ensure_running`` returns once the server process is spawned, so its
    import of torch, pyarrow and the engine (about a second) overlaps whatever
    the trainer does between building a loader and iterating it; a loader
    calls this when it is built. Otherwise the DataLoader would start the
    server at the first ``iter()``, and the first batch would wait for those
    imports. One server serves every loader of the process (it is
    multiprocessing's); if it has died, it is started again.
    """
    if method == "forkserver":
        multiprocessing.get_context(method).set_forkserver_preload(_PRELOAD)
        multiprocessing.forkserver.ensure_running()


def _worker_context(method: str) -> Any:
    """The multiprocessing context of the workers. A forkserver imports this
    module (torch, pyarrow, the engine) before it forks, so starting workers
    takes milliseconds instead of seconds (a loader starts them at every epoch
    and population switch); it loads no gRPC client, so its children are safe.
    Its queues have wide pipes (`_wide_queues`)."""
    _start_server(method)
    base: Any = type(multiprocessing.get_context(method))
    return _wide_queues(base)()


#: What the forkserver imports before it forks workers: this module (torch,
#: pyarrow, the engine). Not pandas: no worker needs it, as columns become
#: NumPy arrays without it (`dataset_rt.batches.numpy_column`).
_PRELOAD = [__name__]

#: The pipe of a worker queue: the kernel's default is 64 KiB, so a batch of a
#: few hundred KiB crossed it in several wake-ups of the worker and the trainer
#: each; 1 MiB is what an unprivileged process may ask for
#: (/proc/sys/fs/pipe-max-size). Measured with two workers and batches of 256
#: records of 1 KiB: 1,564 -> 2,931 batches/s through the queue alone.
QUEUE_PIPE_BYTES = 1 << 20


@functools.cache
def _wide_queues(base: type[Any]) -> type[Any]:
    """``base`` (a multiprocessing context class) whose ``Queue()`` widens its pipe."""

    class WideQueues(base):  # type: ignore[misc]
        def Queue(self, maxsize: int = 0) -> Any:
            queue = super().Queue(maxsize)
            reader = getattr(queue, "_reader", None)  # the stdlib Queue's pipe end
            size_option = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux only
            if reader is not None and size_option is not None:
                # A lower pipe-max-size refuses it: the default pipe still works.
                with contextlib.suppress(OSError):
                    fcntl.fcntl(reader.fileno(), size_option, QUEUE_PIPE_BYTES)
            return queue

    WideQueues.__name__ = f"Wide{base.__name__}"
    return WideQueues
