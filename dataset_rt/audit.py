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
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dataset_rt.errors import InvalidArgumentError
from dataset_rt.loader import LoaderState, StreamSource

#: The manifest's own columns; chosen population columns follow.
MANIFEST_COLUMNS = ("epoch", "rank", "step", "position", "cache_id", "sample_id")


@dataclasses.dataclass(frozen=True)
class RunDescription:
    """A loader run: its state when it started (or a saved one), the epochs to
    cover and the world size and batch size it ran with."""

    state: LoaderState
    epochs: Sequence[int]
    world_size: int
    batch_size: int

    @classmethod
    def from_state(
        cls,
        state: Mapping[str, Any],
        *,
        epochs: Sequence[int] | None = None,
        world_size: int | None = None,
        batch_size: int | None = None,
    ) -> RunDescription:
        """A run from a loader state (``state_dict()``): by default its own epoch
        from its position, at the world size and batch size that saved it."""
        loaded = LoaderState.from_dict(state)
        world = loaded.world_size if world_size is None else world_size
        size = loaded.batch_size if batch_size is None else batch_size
        for name, value in (("world_size", world), ("batch_size", size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name!r} must be an integer >= 1, got {value!r}")
        chosen = [loaded.epoch] if epochs is None else list(epochs)
        if any(isinstance(e, bool) or not isinstance(e, int) or e < loaded.epoch for e in chosen):
            raise InvalidArgumentError(
                f"'epochs' must be integers >= the state's epoch {loaded.epoch}, got {chosen!r}"
            )
        return cls(loaded, sorted(set(chosen)), world, size)

    def batches(
        self, source: StreamSource, columns: Sequence[str] = ()
    ) -> Iterator[pa.RecordBatch]:
        """The manifest's record batches, ordered by epoch, rank and step."""
        for epoch in self.epochs:
            state = dataclasses.replace(
                self.state,
                epoch=epoch,
                position=self.state.position if epoch == self.state.epoch else 0,
                columns=list(columns),
            )
            parts = state.parts()
            for rank in range(self.world_size):
                step = 0
                for part in parts:
                    request = state.request(
                        part,
                        rank=rank,
                        world_size=self.world_size,
                        block=self.batch_size,
                        payload=False,
                    )
                    taken = 0
                    for batch in source.open(request):
                        rows = batch.num_rows
                        steps = [step + (taken + i) // self.batch_size for i in range(rows)]
                        taken += rows
                        yield pa.RecordBatch.from_arrays(
                            [
                                pa.repeat(pa.scalar(epoch, pa.uint64()), rows),
                                pa.repeat(pa.scalar(rank, pa.uint64()), rows),
                                pa.array(steps, pa.uint64()),
                                *batch.columns,
                            ],
                            names=["epoch", "rank", "step", *batch.schema.names],
                        )
                    step += request.samples_per_rank() // self.batch_size


def write_manifest(
    source: StreamSource,
    run: RunDescription,
    path: str | Path,
    *,
    columns: Sequence[str] = (),
) -> int:
    """Write the manifest of ``run`` to the Parquet file ``path`` (replaced
    whole: written beside it, then renamed); returns its row count."""
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
