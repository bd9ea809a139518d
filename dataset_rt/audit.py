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
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dataset_rt.config import ShuffleMode
from dataset_rt.errors import InvalidArgumentError
from dataset_rt.loader import RunOptions, RunSpan, RunState, StreamSource

#: The manifest's own columns; chosen population columns follow.
MANIFEST_COLUMNS = ("epoch", "rank", "step", "position", "cache_id", "sample_id")

#: Rows per stream batch read for a manifest (where the source lets us choose):
#: large enough that the per-batch Python work is noise.
_MANIFEST_BATCH_ROWS = 65_536

#: The most epochs one description covers (a state's epoch comes from a file,
#: and ``seen`` covers every epoch up to it); the core holds the same bound.
MAX_EPOCHS = 1 << 20


@dataclasses.dataclass(frozen=True)
class RunDescription:
    """A loader run: a state of its loader and the spans of the run to cover.

    With ``seen`` the spans are what the run had consumed when it saved the
    state (a checkpoint): every resume of its chain, each cut by its own world
    size and batch size, as recorded in the state. Without it they are what a
    run resumed from the state reads (its epoch from its position, later epochs
    whole), cut by the given world size and batch size (the state's by default).
    """

    state: RunState
    spans: tuple[RunSpan, ...]
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
        """A run from a loader state (``state_dict()``): by default the state's
        epoch from its position at the world size and batch size that saved it;
        ``seen``, what the run had consumed (every epoch up to the state's, as
        each resume of the run read it)."""
        loaded = RunState.from_dict(state)
        chosen = None if epochs is None else list(epochs)
        if chosen is not None and len(chosen) > MAX_EPOCHS:
            raise InvalidArgumentError(
                f"a run covers at most {MAX_EPOCHS} epochs, got {len(chosen)}"
            )

        def out_of_range(e: Any) -> bool:
            if isinstance(e, bool) or not isinstance(e, int) or e < 0:
                return True
            return e > loaded.epoch if seen else e < loaded.epoch

        if chosen is not None and any(out_of_range(e) for e in chosen):
            bound = "<=" if seen else ">="
            raise InvalidArgumentError(
                f"'epochs' must be integers {bound} the state's epoch {loaded.epoch}"
                f"{' (seen: what came before the state)' if seen else ''}, got {chosen!r}"
            )
        if seen:
            if world_size is not None or batch_size is not None:
                raise InvalidArgumentError(
                    "the state records the world size and batch size of every resume of the "
                    "run, so what it consumed needs neither; 'world_size' and 'batch_size' "
                    "describe a run resumed from the state (without seen)"
                )
            spans = loaded.seen(None if chosen is None else sorted(set(chosen)))
            return cls(loaded, tuple(spans), seen)
        world = loaded.world_size if world_size is None else world_size
        size = loaded.batch_size if batch_size is None else batch_size
        for name, value in (("world_size", world), ("batch_size", size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name!r} must be an integer >= 1, got {value!r}")
        epochs_ahead = sorted(set(chosen)) if chosen is not None else [loaded.epoch]
        return cls(loaded, tuple(loaded.ahead(epochs_ahead, world, size)), seen)

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
        run = RunOptions(
            dataset=dataset,
            seed=seed,
            batch_size=batch_size,
            world_size=world_size,
            epoch_len=epoch_len,
            population=population,
            shuffle=shuffle,
        )
        state = RunState.start(run, source.resolve(run.request()))
        return cls.from_state(state.to_dict(), epochs=epochs)

    @property
    def epochs(self) -> list[int]:
        """The epochs the run's spans are in."""
        return sorted({span.epoch for span in self.spans})

    def rows(self) -> int:
        """The manifest's row count (every rank's share of every span)."""
        return sum(span.rows() for span in self.spans)

    def steps(self, epoch: int) -> int:
        """The steps of epoch ``epoch`` the run covers: one past its last
        (every rank takes as many)."""
        return max(
            (s.first_step + s.steps() for s in self.spans if s.epoch == epoch and s.steps()),
            default=0,
        )

    def batches(
        self, source: StreamSource, columns: Sequence[str] = ()
    ) -> Iterator[pa.RecordBatch]:
        """The manifest's record batches in the order the run read them: by
        resume and epoch, then rank and step."""
        for _, grouped in itertools.groupby(self.spans, key=lambda s: (s.span, s.epoch)):
            spans = [span for span in grouped if span.steps()]
            if not spans:
                continue  # no rank takes a batch: none is asked
            for rank in range(spans[0].world_size):
                for span in spans:
                    request = self.state.span_ticket(span, rank, columns=list(columns))
                    taken = 0
                    size = span.batch_size
                    for batch in source.open(request, batch_rows=_MANIFEST_BATCH_ROWS):
                        rows = batch.num_rows
                        # Sample i of the rank's share of this span is in its step i // size.
                        steps = np.arange(taken, taken + rows, dtype=np.uint64) // size
                        taken += rows
                        yield pa.RecordBatch.from_arrays(
                            [
                                pa.repeat(pa.scalar(span.epoch, pa.uint64()), rows),
                                pa.repeat(pa.scalar(rank, pa.uint64()), rows),
                                pa.array(steps + np.uint64(span.first_step)),
                                *batch.columns,
                            ],
                            names=["epoch", "rank", "step", *batch.schema.names],
                        )


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
