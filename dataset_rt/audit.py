"""What a training run saw, recomputed offline: the manifest.

Every position of a run is a pure function of (population, seed, position), so
the whole schedule of a loader run (which samples each rank took at each step)
can be recomputed without a server and without reading one payload: ids-only
streams of the engine the server runs, over the populations stored in a state
directory. `write_manifest` streams it to Parquet batch by batch, so its memory
does not grow with the number of rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dataset_rt.config import ShuffleMode
from dataset_rt.errors import InternalError, InvalidArgumentError
from dataset_rt.loader import LoaderState, Segment, StreamSource
from dataset_rt.service import StreamRequest

#: The manifest's own columns; chosen population columns follow.
MANIFEST_COLUMNS = ("epoch", "rank", "step", "position", "cache_id", "sample_id")

#: Rows per stream batch read for a manifest (where the source lets us choose):
#: large enough that the per-batch Python work is noise.
_MANIFEST_BATCH_ROWS = 65_536

#: The most epochs one description covers (a state's epoch comes from a file,
#: and ``seen`` covers every epoch up to it).
MAX_EPOCHS = 1 << 20


@dataclasses.dataclass(frozen=True)
class RunDescription:
    """A loader run: a state of its loader, the epochs to cover and the world
    size and batch size to cut them with.

    By default the run is what follows the state (a resume point: its epoch from
    its position, later epochs whole). With ``seen`` it is what came before (a
    checkpoint: earlier epochs whole, the state's epoch up to its position), the
    samples a run had consumed when it saved the state. The positions and samples
    are exact either way; ranks and steps are those of ``world_size`` and
    ``batch_size`` (a run that resumed at another world size cut its earlier
    epochs otherwise).
    """

    state: LoaderState
    epochs: Sequence[int]
    world_size: int
    batch_size: int
    seen: bool = False

    @classmethod
    def from_state(
        cls,
        state: Mapping[str, Any],
        *,
        epochs: Sequence[int] | None = None,
        world_size: int | None = None,
        batch_size: int | None = None,
        seen: bool = False,
    ) -> RunDescription:
        """A run from a loader state (``state_dict()``) at the world size and batch
        size that saved it: by default the state's epoch from its position (or,
        ``seen``, every epoch up to the state's, until its position)."""
        loaded = LoaderState.from_dict(state)
        world = loaded.world_size if world_size is None else world_size
        size = loaded.batch_size if batch_size is None else batch_size
        for name, value in (("world_size", world), ("batch_size", size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name!r} must be an integer >= 1, got {value!r}")
        if epochs is None and seen and loaded.epoch >= MAX_EPOCHS:
            raise InvalidArgumentError(
                f"the state's epoch is {loaded.epoch}: a run covers at most {MAX_EPOCHS} "
                "epochs; choose the epochs to cover ('epochs', --epochs)"
            )
        if epochs is not None:
            chosen = list(epochs)
        else:
            chosen = list(range(loaded.epoch + 1)) if seen else [loaded.epoch]
        if len(chosen) > MAX_EPOCHS:
            raise InvalidArgumentError(
                f"a run covers at most {MAX_EPOCHS} epochs, got {len(chosen)}"
            )

        def out_of_range(e: Any) -> bool:
            if isinstance(e, bool) or not isinstance(e, int) or e < 0:
                return True
            return e > loaded.epoch if seen else e < loaded.epoch

        if any(out_of_range(e) for e in chosen):
            bound = "<=" if seen else ">="
            raise InvalidArgumentError(
                f"'epochs' must be integers {bound} the state's epoch {loaded.epoch}"
                f"{' (seen: what came before the state)' if seen else ''}, got {chosen!r}"
            )
        return cls(loaded, sorted(set(chosen)), world, size, seen)

    @classmethod
    def new(
        cls,
        source: StreamSource,
        dataset: str,
        *,
        seed: int,
        batch_size: int,
        world_size: int = 1,
        epochs: Sequence[int] = (0,),
        epoch_len: int | None = None,
        population: str | None = None,
        shuffle: ShuffleMode = True,
    ) -> RunDescription:
        """A run from its keys, as a loader with these arguments would start it:
        the active population and epoch length of ``source`` unless named.
        (Workers do not matter: they never change what a rank reads.)"""
        pinned = source.resolve(
            StreamRequest(
                dataset=dataset,
                seed=seed,
                epoch=0,
                epoch_len=epoch_len,
                population=population,
                shuffle=shuffle,
            )
        )
        if pinned.population is None or pinned.epoch_len is None:
            raise InternalError(f"the source did not pin the request: {pinned!r}")
        state = LoaderState(
            dataset=dataset,
            seed=seed,
            shuffle=shuffle,
            columns=[],
            epoch_len=pinned.epoch_len,
            batch_size=batch_size,
            world_size=world_size,
            segments=[Segment(0, pinned.population)],
        )
        return cls.from_state(state.to_dict(), epochs=epochs)

    def parts(self, epoch: int) -> list[tuple[int, int, str]]:
        """Epoch ``epoch``'s ranges of the run, one per population segment."""
        parts = self._at(epoch).parts()
        if self.seen and epoch == self.state.epoch:
            end = self.state.position
            return [(a, min(b, end), p) for a, b, p in parts if a < end]
        return parts

    def rows(self) -> int:
        """The manifest's row count (every rank's share of every part)."""
        return sum(
            self._at(epoch)
            .request(part, rank=0, world_size=self.world_size, block=self.batch_size)
            .samples_per_rank()
            * self.world_size
            for epoch in self.epochs
            for part in self.parts(epoch)
        )

    def steps(self, epoch: int) -> int:
        """The batches each rank takes in epoch ``epoch`` of the run (every rank
        takes as many)."""
        return sum(
            self._at(epoch)
            .request(part, rank=0, world_size=self.world_size, block=self.batch_size)
            .samples_per_rank()
            // self.batch_size
            for part in self.parts(epoch)
        )

    def _at(self, epoch: int) -> LoaderState:
        position = self.state.position if epoch == self.state.epoch and not self.seen else 0
        return dataclasses.replace(self.state, epoch=epoch, position=position)

    def batches(
        self, source: StreamSource, columns: Sequence[str] = ()
    ) -> Iterator[pa.RecordBatch]:
        """The manifest's record batches, ordered by epoch, rank and step."""
        size = self.batch_size
        for epoch in self.epochs:
            state = dataclasses.replace(self._at(epoch), columns=list(columns))
            parts = self.parts(epoch)
            # Every rank takes as many samples as rank 0: none, and no rank is asked
            # (a world larger than the epoch's blocks).
            shares = (
                state.request(part, rank=0, world_size=self.world_size, block=size)
                for part in parts
            )
            if not any(share.samples_per_rank() for share in shares):
                continue
            for rank in range(self.world_size):
                step = 0
                for part in parts:
                    request = state.request(
                        part, rank=rank, world_size=self.world_size, block=size, payload=False
                    )
                    taken = 0
                    for batch in source.open(request, batch_rows=_MANIFEST_BATCH_ROWS):
                        rows = batch.num_rows
                        # Sample i of the rank's share of this part is in its step i // size.
                        steps = np.arange(taken, taken + rows, dtype=np.uint64) // size + step
                        taken += rows
                        yield pa.RecordBatch.from_arrays(
                            [
                                pa.repeat(pa.scalar(epoch, pa.uint64()), rows),
                                pa.repeat(pa.scalar(rank, pa.uint64()), rows),
                                pa.array(steps),
                                *batch.columns,
                            ],
                            names=["epoch", "rank", "step", *batch.schema.names],
                        )
                    step += request.samples_per_rank() // size


def write_manifest(
    source: StreamSource,
    run: RunDescription,
    path: str | Path,
    *,
    columns: Sequence[str] = (),
    progress: Callable[[int], None] | None = None,
) -> int:
    """Write the manifest of ``run`` to the Parquet file ``path`` (replaced
    whole: written beside it, then renamed); returns its row count.
    ``progress`` is called with the rows of each batch as it is written."""
    target = Path(path)
    partial = target.with_name(f".{target.name}.partial")
    rows = 0
    writer: pq.ParquetWriter | None = None
    try:
        for batch in run.batches(source, columns):
            if writer is None:
                writer = pq.ParquetWriter(partial, batch.schema)
            writer.write_batch(batch)
            rows += batch.num_rows
            if progress is not None:
                progress(batch.num_rows)
        if writer is None:
            # No row: the manifest's columns, the chosen ones typeless (null).
            fields = [(name, pa.uint64()) for name in MANIFEST_COLUMNS]
            fields += [(name, pa.null()) for name in columns]
            writer = pq.ParquetWriter(partial, pa.schema(fields))
        writer.close()
        writer = None
        partial.replace(target)
    finally:
        if writer is not None:
            writer.close()
        partial.unlink(missing_ok=True)
    return rows
