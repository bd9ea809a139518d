"""What the server served, per dataset and population: the ``served`` part of ``stats``.

Counted in ``do_get`` as batches are handed to Flight, so the numbers move while a
stream runs and a cancelled stream counts what it sent. With a grouping column,
every served row is also counted under its value of that column. Memory is
bounded: at most ``max_groups`` values per population (the rest counted under
`OVERFLOW`) and the ``max_populations`` most recently streamed populations per
dataset (older ones are dropped with their counts).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

OVERFLOW = "(other)"
NULL = "(null)"
MAX_POPULATIONS = 64


@dataclass
class Served:
    """The counts of one (dataset, population); mutated only under the lock."""

    streams: int = 0
    rows: int = 0
    bytes: int = 0
    groups: dict[str, int] = field(default_factory=dict)
    overflow: int = 0
    group_column_missing: bool = False


class Telemetry:
    """Thread-safe counts of served streams, rows, bytes and groups (one lock)."""

    def __init__(
        self,
        column: str | None = None,
        max_groups: int = 64,
        max_populations: int = MAX_POPULATIONS,
    ) -> None:
        if max_groups < 1:
            raise ValueError(f"telemetry_max_groups must be >= 1, got {max_groups}")
        if column == "payload":
            raise ValueError("the telemetry column cannot be 'payload'; name a population column")
        self.column = column
        self.max_groups = max_groups
        self.max_populations = max_populations
        self._lock = threading.Lock()
        # dataset -> population -> counts, least recently streamed first.
        self._served: dict[str, OrderedDict[str, Served]] = {}

    def open(
        self, dataset: str, population: str, schema: pa.Schema, *, drop: bool
    ) -> StreamCounter:
        """Count a new stream of ``population`` whose native batches have ``schema``.

        ``drop``: the grouping column was added for counting only and is removed
        from every batch (and from the schema the client sees).
        """
        missing = self.column is not None and not self.groupable(schema)
        with self._lock:
            populations = self._served.setdefault(dataset, OrderedDict())
            served = populations.pop(population, None) or Served()
            populations[population] = served
            served.streams += 1
            served.group_column_missing = missing
            while len(populations) > self.max_populations:
                populations.popitem(last=False)
        column = None if missing else self.column
        return StreamCounter(self, served, schema, column, drop=drop)

    def groupable(self, schema: pa.Schema) -> bool:
        """Whether ``schema`` has the grouping column, of a type that can be grouped
        (not a list or a struct: those count as missing, so serving never fails)."""
        if self.column is None or self.column not in schema.names:
            return False
        try:
            pc.value_counts(pa.array([], schema.field(self.column).type))
        except pa.ArrowNotImplementedError:
            return False
        return True

    def add(
        self, served: Served, rows: int, nbytes: int, groups: Iterable[tuple[str, int]]
    ) -> None:
        with self._lock:
            served.rows += rows
            served.bytes += nbytes
            for key, count in groups:
                # First come, first kept: the first max_groups values seen get a key.
                if key in served.groups or len(served.groups) < self.max_groups:
                    served.groups[key] = served.groups.get(key, 0) + count
                else:
                    served.overflow += count

    def served(self, dataset: str) -> list[dict[str, Any]]:
        """The ``served`` list of ``stats``: most recently streamed population first."""
        with self._lock:
            entries = list(self._served.get(dataset, {}).items())
            return [
                {
                    "population": population,
                    "streams": s.streams,
                    "rows": s.rows,
                    "bytes": s.bytes,
                    "groups": s.groups | ({OVERFLOW: s.overflow} if s.overflow else {}),
                    "group_column_missing": s.group_column_missing,
                }
                for population, s in reversed(entries)
            ]


class StreamCounter:
    """Counts one stream's batches; `count` is called on every batch before it is sent."""

    def __init__(
        self,
        telemetry: Telemetry,
        served: Served,
        schema: pa.Schema,
        column: str | None,
        *,
        drop: bool,
    ) -> None:
        self._telemetry = telemetry
        self._served = served
        self._column = column
        self._drop = drop and column is not None
        self.schema = schema.remove(schema.get_field_index(column)) if self._drop else schema

    def count(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Count ``batch`` and return it as the client receives it."""
        groups = _group_counts(batch.column(self._column)) if self._column is not None else []
        if self._drop:
            batch = batch.drop_columns([self._column])
        # nbytes: the Arrow buffers of the batch as sent (payload, ids, columns),
        # which is the wire size less the IPC framing.
        self._telemetry.add(self._served, batch.num_rows, batch.nbytes, groups)
        return batch


def _group_counts(column: pa.Array) -> list[tuple[str, int]]:
    """``(value as a string, rows)`` per distinct value of ``column``."""
    counts = pc.value_counts(column)
    keys = _string_form(counts.field("values"))
    return [
        (NULL if key is None else key, count)
        for key, count in zip(keys, counts.field("counts").to_pylist(), strict=True)
    ]


def _string_form(values: pa.Array) -> list[str | None]:
    """Arrow's string form ("true", "0.5"), the same in any Arrow client; Python's
    ``str`` for bytes (whose cast would depend on the bytes) and for types Arrow
    cannot cast to a string."""
    binary = (
        pa.types.is_binary(values.type)
        or pa.types.is_large_binary(values.type)
        or pa.types.is_fixed_size_binary(values.type)
        or pa.types.is_binary_view(values.type)
    )
    if not binary:
        try:
            return list(values.cast(pa.string()).to_pylist())
        except pa.ArrowNotImplementedError:
            pass
    return [None if v is None else str(v) for v in values.to_pylist()]
