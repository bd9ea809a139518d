"""What a training loader knows, without torch: its state, its plan, its sources.

A loader reads one rank's share of an epoch in batches of ``batch_size``
consecutive positions (the partition rule with ``block = batch_size``, see
docs/sampling.md and docs/training.md). Because every rank takes blocks ``r, r +
w, r + 2w, ...``, after every rank has taken ``m`` batches the consumed positions
are exactly ``[start, start + m * w * batch_size)``: the whole progress of a run
is one number, `LoaderState.position`, which resumes at any world size and any
worker count.

A population switch in the middle of a run is a *segment*: from an absolute
stream position on, draws use another population. The state keeps every
segment, so a resumed run maps positions to samples as the original did.

Sources say where streams come from: `LocalSource` (caches opened in this
process, populations in a state directory, the engine the Flight server runs)
and ``flight_client.FlightSource`` (a server or its replicas). A source is
picklable; DataLoader workers get a copy and open their own connection.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import polars as pl
import pyarrow as pa

from dataset_rt._native import check_name
from dataset_rt.config import ShuffleMode
from dataset_rt.dataset import batch_reader
from dataset_rt.errors import InvalidArgumentError
from dataset_rt.lazy import hand_over
from dataset_rt.runtime import DatasetRuntime
from dataset_rt.service import DatasetService, StreamRequest

#: The version of the state layout; a state of another version is refused.
STATE_VERSION = 1

_POPULATION_ID = re.compile(r"[0-9a-f]{32}")


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


@dataclass(frozen=True)
class Segment:
    """From absolute stream position ``start`` on, draws use ``population``."""

    start: int
    population: str


@dataclass
class LoaderState:
    """Where a run is: plain data (`to_dict` is JSON-serialisable).

    ``position`` is epoch-relative: every position of epoch ``epoch`` before it
    has been consumed by some rank, none after it. ``steps`` counts the batches
    each rank took in this epoch (for logs; resuming needs only ``position``).
    ``world_size`` and ``batch_size`` are those of the run that saved the state;
    a resumed run may use others.
    """

    dataset: str
    seed: int
    shuffle: ShuffleMode
    columns: list[str]
    epoch_len: int
    batch_size: int
    world_size: int
    epoch: int = 0
    position: int = 0
    steps: int = 0
    segments: list[Segment] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "dataset": self.dataset,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "columns": list(self.columns),
            "epoch_len": self.epoch_len,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "epoch": self.epoch,
            "position": self.position,
            "steps": self.steps,
            "segments": [[s.start, s.population] for s in self.segments],
        }

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> LoaderState:
        """Validate a saved state; a bad one raises `InvalidArgumentError`
        naming the key and what would be valid."""
        if not isinstance(state, Mapping):
            raise InvalidArgumentError(
                f"a loader state is a dict (from state_dict()), got {type(state).__name__}"
            )
        if state.get("version") != STATE_VERSION:
            raise InvalidArgumentError(
                f"loader state 'version' must be {STATE_VERSION}, got {state.get('version')!r}"
            )
        expected = set(cls(**_EXAMPLE).to_dict())
        unknown = sorted(set(state) - expected)
        missing = sorted(expected - set(state))
        if unknown or missing:
            raise InvalidArgumentError(
                f"loader state keys: missing {missing}, unknown {unknown}; "
                f"a state has exactly {sorted(expected)}"
            )

        def integer(key: str, low: int = 0) -> int:
            value = state[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidArgumentError(
                    f"loader state {key!r} must be an integer >= {low}, got {value!r}"
                )
            return value

        if not isinstance(state["dataset"], str) or not state["dataset"]:
            raise InvalidArgumentError(
                f"loader state 'dataset' must be a dataset name, got {state['dataset']!r}"
            )
        check_name("dataset", state["dataset"])  # the core's rule for path parts
        if not (isinstance(state["shuffle"], bool) or state["shuffle"] == "permutation"):
            raise InvalidArgumentError(
                "loader state 'shuffle' must be true, false or \"permutation\", "
                f"got {state['shuffle']!r}"
            )
        columns = state["columns"]
        if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
            raise InvalidArgumentError(
                f"loader state 'columns' must be a list of column names, got {columns!r}"
            )
        segments = _segments(state["segments"])
        loaded = cls(
            dataset=state["dataset"],
            seed=integer("seed"),
            shuffle=state["shuffle"],
            columns=list(columns),
            epoch_len=integer("epoch_len", 1),
            batch_size=integer("batch_size", 1),
            world_size=integer("world_size", 1),
            epoch=integer("epoch"),
            position=integer("position"),
            steps=integer("steps"),
            segments=segments,
        )
        if loaded.position > loaded.epoch_len:
            raise InvalidArgumentError(
                f"loader state 'position' must be <= 'epoch_len' ({loaded.epoch_len}), "
                f"got {loaded.position}"
            )
        return loaded

    # -- positions -----------------------------------------------------------------

    @property
    def epoch_start(self) -> int:
        """The absolute position of this epoch's first sample."""
        return self.epoch * self.epoch_len

    def population_at(self, position: int) -> str:
        """The population drawing the absolute ``position``."""
        found = self.segments[0].population
        for segment in self.segments:
            if segment.start > position:
                break
            found = segment.population
        return found

    def parts(self) -> list[tuple[int, int, str]]:
        """The rest of the epoch as ``(start, stop, population)`` ranges
        (epoch-relative), one per population segment."""
        begin, end = self.epoch_start + self.position, self.epoch_start + self.epoch_len
        cuts = [begin] + [s.start for s in self.segments if begin < s.start < end] + [end]
        return [
            (a - self.epoch_start, b - self.epoch_start, self.population_at(a))
            for a, b in itertools.pairwise(cuts)
            if a < b
        ]

    def request(
        self,
        part: tuple[int, int, str],
        *,
        rank: int,
        world_size: int,
        block: int,
        offset: int = 0,
        payload: bool = True,
    ) -> StreamRequest:
        """The ticket of one rank's share of one part."""
        start, stop, population = part
        return StreamRequest(
            **self._keys(population),
            start=start,
            stop=stop,
            block=block,
            world_size=world_size,
            rank=rank,
            offset=offset,
            payload=payload,
        )

    def command(self, population: str) -> StreamRequest:
        """The run's epoch over ``population`` as a command (no rank): what a
        source checks before the run uses the population."""
        return StreamRequest(**self._keys(population))

    def _keys(self, population: str) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "seed": self.seed,
            "epoch": self.epoch,
            "epoch_len": self.epoch_len,
            "shuffle": self.shuffle,
            "population": population,
            "columns": list(self.columns),
        }

    def switch(self, at: int, population: str) -> None:
        """Draw from ``population`` from absolute position ``at`` on (a later
        pending switch is replaced)."""
        check_population_id(population)
        kept = [s for s in self.segments if s.start < at]
        self.segments = [*kept, Segment(at, population)]


def check_population_id(population: Any) -> None:
    if not isinstance(population, str) or not _POPULATION_ID.fullmatch(population):
        raise InvalidArgumentError(
            f"a population id is 32 lowercase hex digits (as do_put answers), got {population!r}"
        )


_EXAMPLE: dict[str, Any] = {
    "dataset": "d",
    "seed": 0,
    "shuffle": True,
    "columns": [],
    "epoch_len": 1,
    "batch_size": 1,
    "world_size": 1,
}


def _segments(value: Any) -> list[Segment]:
    valid = "a non-empty list of [from_position, population_id] pairs, ascending from 0"
    if not isinstance(value, list) or not value:
        raise InvalidArgumentError(f"loader state 'segments' must be {valid}, got {value!r}")
    segments: list[Segment] = []
    for item in value:
        ok = (
            isinstance(item, (list, tuple))
            and len(item) == 2
            and isinstance(item[0], int)
            and not isinstance(item[0], bool)
            and item[0] >= 0
            and isinstance(item[1], str)
            and _POPULATION_ID.fullmatch(item[1]) is not None
        )
        if not ok or (segments and item[0] <= segments[-1].start):
            raise InvalidArgumentError(
                f"loader state 'segments' must be {valid}; item {item!r} is not"
            )
        segments.append(Segment(int(item[0]), str(item[1])))
    if segments[0].start != 0:
        raise InvalidArgumentError(
            f"loader state 'segments' must be {valid}; the first starts at {segments[0].start}"
        )
    return segments


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
    ) -> None:
        if isinstance(caches, (str, Path)):
            caches = [caches]
        self.caches = [str(Path(p)) for p in caches]
        self.state_dir = str(Path(state_dir))
        self.name = name
        self.num_threads = num_threads
        self.validate_cache = validate_cache
        self.create = create
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
            )
            self._opened = (os.getpid(), service)
        return self._opened[1]

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_opened"} | {"_opened": None}

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

    def _check_name(self, dataset: str) -> None:
        if dataset != self.name:
            raise InvalidArgumentError(
                f"this LocalSource serves the dataset {self.name!r}, not {dataset!r}"
            )
