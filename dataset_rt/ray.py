"""Ray Data: write a dataset of many caches from any Ray ``Dataset``, one part per task.

::

    import ray
    from dataset_rt.ray import CacheDatasink

    ds = ray.data.read_parquet("s3://raw/images/").map_batches(preprocess)
    committed = write_dataset(ds, "s3://caches/train", name="train", payload_column="pixels")
    committed.location   # serve it: python -m flight_server --dataset train=...

(`write_dataset` is ``ds.write_datasink(CacheDatasink(...))`` that also records the
files Ray read the input from in the descriptor.)

Each write task writes its blocks as one part (`dataset_rt.parts`): an immutable cache
named ``part-<task index>``, written by the columnar writer in bounded memory, so a
task that Ray retries writes the same cache again and never a second one. When every
task has returned, ``on_write_complete`` (on the driver) commits one descriptor over
the parts: the dataset appears whole, or, if the job fails, not at all (its parts are
removed by ``python -m dataset_rt remove-uncommitted``). See docs/distributed.md.

Needs Ray (``uv sync --group ray``); nothing here is imported by ``dataset_rt``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
from ray.data import Datasink
from ray.data.block import BlockAccessor
from ray.data.datasource.datasink import WriteResult

from dataset_rt.config import DEFAULT_WRITER_CONFIG, WriterConfig
from dataset_rt.errors import InvalidArgumentError
from dataset_rt.parts import Committed, DatasetWrite, Part
from dataset_rt.runtime import DatasetRuntime

__all__ = ["CacheDatasink", "part_name", "write_dataset"]

_runtime: DatasetRuntime | None = None


def _worker_runtime() -> DatasetRuntime:
    """One engine runtime per Ray worker process, shared by the tasks it runs."""
    global _runtime
    if _runtime is None:
        _runtime = DatasetRuntime(num_workers=max(1, min(4, os.cpu_count() or 1)))
    return _runtime


def part_name(task_index: int) -> str:
    """The part a write task writes: ``part-00007`` (names sort in task order)."""
    return f"part-{task_index:05d}"


class CacheDatasink(Datasink[Part | None]):
    """A Ray Data datasink that writes a dataset of many caches at ``location``.

    ``location`` is a directory every Ray node sees (a shared volume) or
    ``s3://BUCKET/PREFIX``; ``name`` is the dataset's name; ``payload_column`` the
    binary column each row's payload is in (every other column is stored metadata,
    as for `DatasetRuntime.write_arrow`). ``input`` is recorded in the descriptor as
    what the dataset was written from (for example ``{"files": ds.input_files()}``
    or a table's snapshot id). After ``ds.write_datasink(sink)`` returns,
    ``sink.committed`` says where the dataset is and what it holds.
    """

    def __init__(
        self,
        location: str | os.PathLike[str],
        *,
        name: str,
        payload_column: str,
        input: Mapping[str, Any] | None = None,
        writer_config: WriterConfig = DEFAULT_WRITER_CONFIG,
        scratch_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if not isinstance(payload_column, str):
            raise InvalidArgumentError(
                f"payload_column must be a str, got {type(payload_column).__name__}"
            )
        # The write's id is made here, on the driver, before Ray copies the sink
        # into its tasks: every task and every retry writes parts of one write.
        self._write = DatasetWrite.begin(location)
        self._name = name
        self._payload_column = payload_column
        self._input = dict(input) if input is not None else None
        if not isinstance(writer_config, WriterConfig):
            raise InvalidArgumentError(
                f"writer_config must be a WriterConfig, got {type(writer_config).__name__}"
            )
        # As plain data: Ray's pickler cannot rebuild a pydantic model in a worker.
        self._writer_config = writer_config.model_dump()
        self._scratch_dir = None if scratch_dir is None else os.fspath(scratch_dir)
        self.committed: Committed | None = None

    @property
    def dataset_write(self) -> DatasetWrite:
        """The write this sink runs (its location and write id)."""
        return self._write

    def get_name(self) -> str:
        return "DatasetRTCache"

    def write(self, blocks: Iterable[Any], ctx: Any) -> Part | None:
        """One task: its blocks, as Arrow, written as the part ``part-<task index>``."""
        # Streamed block by block (a task's blocks are never all in memory at
        # once); the first non-empty batch gives the schema.
        batches = (
            batch
            for block in blocks
            for batch in BlockAccessor.for_block(block).to_arrow().to_batches()
            if batch.num_rows
        )
        first = next(batches, None)
        if first is None:
            return None  # a task without rows writes no part
        reader = pa.RecordBatchReader.from_batches(first.schema, itertools.chain([first], batches))
        return self._write.write_part(
            part_name(ctx.task_idx),
            reader,
            payload_column=self._payload_column,
            runtime=_worker_runtime(),
            writer_config=WriterConfig.model_validate(self._writer_config),
            scratch_dir=self._scratch_dir,
        )

    def on_write_complete(self, write_result: WriteResult[Part | None]) -> None:
        """On the driver, once every task returned: commit one descriptor over the parts."""
        parts = [p for p in write_result.write_returns if p is not None]
        self.committed = self._write.commit(parts, name=self._name, input=self._input)


def write_dataset(
    ds: Any,
    location: str | os.PathLike[str],
    *,
    name: str,
    payload_column: str,
    input: Mapping[str, Any] | None = None,
    writer_config: WriterConfig = DEFAULT_WRITER_CONFIG,
    scratch_dir: str | os.PathLike[str] | None = None,
    concurrency: int | None = None,
) -> Committed:
    """Write the Ray ``Dataset`` ``ds`` as the dataset ``name`` at ``location``.

    ``ds.write_datasink(CacheDatasink(...))``, and what Ray knows of where ``ds``
    was read from goes into the descriptor's ``input``: the files
    (``ds.input_files()``, from the plan, without running it), beside whatever
    ``input`` holds (a table's snapshot id, say). Returns the commit.
    """
    recorded = dict(input) if input is not None else {}
    files = ds.input_files()
    if files:  # empty when Ray lists files only as it runs (its datasource V2 readers)
        recorded.setdefault("files", [str(f) for f in files])
    sink = CacheDatasink(
        location,
        name=name,
        payload_column=payload_column,
        input=recorded or None,
        writer_config=writer_config,
        scratch_dir=scratch_dir,
    )
    ds.write_datasink(sink, concurrency=concurrency)
    if sink.committed is None:  # write_datasink returns only after on_write_complete
        raise RuntimeError("Ray finished the write without committing it")
    return sink.committed
