"""What a training loader knows, without torch: its state, its plan, its sources.

A loader reads one rank's share of an epoch in batches of ``batch_size``
consecutive positions (the partition rule with ``block = batch_size``, see
docs/sampling.md and docs/training.md). Because every rank takes blocks ``r, r +
w, r + 2w, ...``, after every rank has taken ``m`` batches the consumed positions
are exactly ``[start, start + m * w * batch_size)``: the whole progress of a run
is one number, `RunState.position`, which resumes at any world size and any
worker count.

`RunState` is the core's run-state type (``native/src/run``): it validates a
saved state, records the population segments and every resume of the run,
computes each rank's and worker's tickets and says what the run consumed. This
module holds only what Python must: the sources and the re-cutting of a stream
into batches.

Sources say where streams come from: `LocalSource` (caches opened in this
process, populations in a state directory, the engine the Flight server runs)
and ``flight_client.FlightSource`` (a server or its replicas). A source is
picklable; DataLoader workers get a copy and open their own connection.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import polars as pl
import pyarrow as pa

from dataset_rt._native import STATE_VERSION, RunOptions, RunSpan, RunState
from dataset_rt.dataset import batch_reader
from dataset_rt.errors import InvalidArgumentError
from dataset_rt.lazy import hand_over
from dataset_rt.runtime import DatasetRuntime
from dataset_rt.service import DatasetService, StreamRequest

__all__ = [
    "STATE_VERSION",
    "LocalSource",
    "RunOptions",
    "RunSpan",
    "RunState",
    "Segment",
    "StreamSource",
    "blocks",
]


class Segment(NamedTuple):
    """From absolute stream position ``start`` on, draws use ``population``."""

    start: int
    population: str


class StreamSource(Protocol):
    """Where a loader's streams come from (picklable: workers get a copy)."""

    def resolve(self, request: StreamRequest) -> StreamRequest:
        """Check a run's request (dataset, columns, ...) and pin its population
        and epoch length (the active ones where it names none)."""
        ...

    def open(
        self, request: StreamRequest, *, batch_rows: int | None = None
    ) -> Iterator[pa.RecordBatch]:
        """The record batches of one rank's partition (a ticket with a rank);
        ``batch_rows`` asks for batches of that many rows where the source
        chooses (a server batches as it is configured to)."""
        ...

    def population(self, dataset: str, population: str) -> pl.DataFrame:
        """A stored population of ``dataset`` (for the audit's expected shares)."""
        ...

    def claim_run(
        self, dataset: str, run: str, *, after: int, epoch: int, position: int, fresh: bool = False
    ) -> int:
        """The generation a resume of training run ``run`` gets: it loaded the
        state of generation ``after`` at ``(epoch, position)``; ``fresh`` always
        gets a new one (docs/training.md, "Fencing")."""
        ...

    def check_run(self, dataset: str, run: str, generation: int) -> None:
        """``FencedError`` when a newer generation of training run ``run`` exists."""
        ...


def blocks(batches: Iterator[pa.RecordBatch], size: int) -> Iterator[pa.Table]:
    """Re-cut a stream's record batches into tables of exactly ``size`` rows,
    without copying (a block that spans batches is a table of several chunks;
    a partition holds whole blocks, so only a broken stream leaves a rest)."""
    pending: list[pa.RecordBatch] = []
    held = 0
    for batch in batches:
        while batch.num_rows:
            take = min(size - held, batch.num_rows)
            pending.append(batch.slice(0, take))
            held += take
            batch = batch.slice(take)
            if held == size:
                yield pa.Table.from_batches(pending)
                pending, held = [], 0
    if held:
        raise InvalidArgumentError(
            f"a partition ended {held} rows into a block of {size}; partitions hold whole blocks"
        )


class LocalSource:
    """Streams read in this process (and in each DataLoader worker) by the engine
    the Flight server runs: caches opened from ``caches``, populations kept in
    ``state_dir`` (content-addressed, shared by every process that opens it).

    ``put`` stores a reweighted population (a Polars DataFrame or any Arrow
    table) and answers its id, as a server's ``do_put`` does. With
    ``create=False`` (the audit) the population store must exist, with an
    active population: nothing is created, a missing one is `NotFoundError`.
    ``show_progress`` draws a progress bar on stderr, on a terminal only, while the
    rows file of a population stored by a build from before rows files is built
    once (`dataset_rt.progress`'s rule).
    """

    def __init__(
        self,
        caches: Sequence[str | Path],
        state_dir: str | Path,
        *,
        name: str = "dataset",
        num_threads: int = 2,
        validate_cache: bool = False,
        create: bool = True,
        show_progress: bool = True,
    ) -> None:
        if isinstance(caches, (str, Path)):
            caches = [caches]
        self.caches = [str(Path(p)) for p in caches]
        self.state_dir = str(Path(state_dir))
        self.name = name
        self.num_threads = num_threads
        self.validate_cache = validate_cache
        self.create = create
        self.show_progress = show_progress
        self._opened: tuple[int, DatasetService] | None = None
        _ = self.service  # open now, so that a bad path fails here, not in a worker

    @property
    def service(self) -> DatasetService:
        """This process's engine (a forked or spawned worker opens its own)."""
        if self._opened is None or self._opened[0] != os.getpid():
            runtime = DatasetRuntime(num_workers=self.num_threads)
            service = DatasetService(
                runtime.native,
                self.name,
                self.caches,
                self.state_dir,
                validate_cache=self.validate_cache,
                create=self.create,
                show_progress=self.show_progress,
            )
            self._opened = (os.getpid(), service)
        return self._opened[1]

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_opened"} | {"_opened": None}

    #: Seconds between a loader's checks that its run was not resumed elsewhere
    #: (each reads one small file: every batch).
    fence_interval = 0.0

    def put(self, table: Any, *, activate: bool = True) -> str:
        """Validate and store a population (a table, a Polars LazyFrame or a
        Parquet path, as `CachedDataset.update_metadata` takes); returns its id."""
        population, _ = hand_over(table, lambda arrow: self.service.put(arrow, activate))
        return population

    def metadata(self, population: str | None = None) -> pl.DataFrame:
        """A stored population (the active one by default) as a Polars DataFrame."""
        return pl.DataFrame(self.service.metadata(population))

    def resolve(self, request: StreamRequest) -> StreamRequest:
        self._check_name(request.dataset)
        self.service.schema(request)
        return self.service.pin(request)

    def open(
        self, request: StreamRequest, *, batch_rows: int | None = None
    ) -> Iterator[pa.RecordBatch]:
        self._check_name(request.dataset)
        size = batch_rows or min(request.block, 65_536)
        return iter(batch_reader(self.service.stream(request, batch_size=size)))

    def population(self, dataset: str, population: str) -> pl.DataFrame:
        self._check_name(dataset)
        return self.metadata(population)

    def claim_run(
        self, dataset: str, run: str, *, after: int, epoch: int, position: int, fresh: bool = False
    ) -> int:
        self._check_name(dataset)
        return self.service.claim_run(run, after=after, epoch=epoch, position=position, fresh=fresh)

    def check_run(self, dataset: str, run: str, generation: int) -> None:
        self._check_name(dataset)
        self.service.check_run(run, generation)

    def _check_name(self, dataset: str) -> None:
        if dataset != self.name:
            raise InvalidArgumentError(
                f"this LocalSource serves the dataset {self.name!r}, not {dataset!r}"
            )
