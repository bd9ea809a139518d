"""Datasets of many caches, written in parallel by any engine and committed once.

A dataset of many caches has one name and one location (a directory or
``s3://BUCKET/PREFIX``): its descriptor, ``descriptor.json``, lists its caches by id
and location, and every entry point opens it as one dataset
(`DatasetRuntime.open_dataset`, ``python -m flight_server --dataset NAME=LOCATION``).

Writing one takes three steps (docs/distributed.md):

1. the driver begins a write: ``write = DatasetWrite.begin(location)`` (a small,
   picklable value: send it to every task);
2. any number of tasks, anywhere, each write parts from Arrow data:
   ``part = write.write_part("part-00003", batches, payload_column="image",
   runtime=runtime)``, each an ordinary immutable cache named after its part (the
   columnar writer, bounded memory), so a retried task writes the same cache again
   and never a second one;
3. the driver commits the parts the tasks returned: ``write.commit(parts,
   name="train")`` creates the descriptor, create-only: the dataset appears whole
   or not at all, exactly once.

Parts that were never committed (a crashed job) are removed by
``python -m dataset_rt remove-uncommitted LOCATION`` (`remove_uncommitted`).
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dataset_rt import _native
from dataset_rt.config import DEFAULT_WRITER_CONFIG, WriterConfig
from dataset_rt.errors import InvalidArgumentError
from dataset_rt.runtime import DEFAULT_BATCH_SIZE, ArrowData, DatasetRuntime, write_arrow_cache

__all__ = ["Committed", "DatasetWrite", "Part", "Removal", "read_descriptor", "remove_uncommitted"]


@dataclass(frozen=True)
class Part:
    """One part as its task wrote it: what the commit needs, small and picklable."""

    name: str
    cache_id: int
    records: int


@dataclass(frozen=True)
class Committed:
    """A committed dataset: where it is and what it holds."""

    location: str
    name: str
    caches: int
    records: int
    #: False when exactly this dataset was committed before (a retried commit).
    created: bool
    #: The descriptor as written (docs/storage-format.md, "Datasets of many caches").
    descriptor: dict[str, Any]


@dataclass(frozen=True)
class Removal:
    """What `remove_uncommitted` removed (or, in a dry run, would remove)."""

    #: ``parts/<write_id>/<part>`` of each part removed.
    parts: list[str]
    #: Parts left alone because an object of theirs is younger than the age given.
    recent: list[str]
    bytes: int


@dataclass(frozen=True)
class DatasetWrite:
    """One write of a dataset of many parts at ``location``.

    Picklable and small: the driver makes it with `begin` and sends it to every
    task that writes parts; the parts of one write live under
    ``parts/<write_id>/`` until the commit names them.
    """

    location: str
    write_id: str

    @classmethod
    def begin(cls, location: str | os.PathLike[str]) -> DatasetWrite:
        """A new write at ``location`` (refused at once if a dataset is committed there)."""
        # Tasks run in other working directories: a directory is named absolutely.
        location = _native.absolute_location(_location(location))
        if _native.read_descriptor(location) is not None:
            raise InvalidArgumentError(
                f"{location} already holds a committed dataset; a dataset descriptor is "
                "never replaced: write to another location"
            )
        return cls(location, uuid.uuid4().hex)

    def write_part(
        self,
        part: str,
        data: ArrowData,
        *,
        payload_column: str,
        runtime: DatasetRuntime,
        writer_config: WriterConfig = DEFAULT_WRITER_CONFIG,
        batch_size: int = DEFAULT_BATCH_SIZE,
        scratch_dir: str | os.PathLike[str] | None = None,
    ) -> Part:
        """Write ``data`` (what `DatasetRuntime.write_arrow` takes) as the part ``part``.

        The part is a cache named ``part`` (a plain name): its ``cache_id`` depends
        only on the rows and that name, so writing the same part again (a retried
        task) keeps the cache that is there, and other rows under the same part name
        are refused. On object storage the cache is written under ``scratch_dir``
        (the temporary directory by default), uploaded, then removed there.
        Raises `SourceError` for data without rows, and the writer's errors.
        """
        if not isinstance(payload_column, str):
            raise InvalidArgumentError(
                f"payload_column must be a str, got {type(payload_column).__name__}"
            )
        scratch = Path(scratch_dir) if scratch_dir is not None else Path(tempfile.gettempdir())
        target = _native.PartTarget(self.location, self.write_id, str(scratch))
        _native.validate_source_name(part)
        write_arrow_cache(
            runtime.native,
            data,
            Path(target.staging_dir),
            part,
            payload_column,
            writer_config,
            batch_size,
        )
        cache_id, records = target.publish(part)
        return Part(part, cache_id, records)

    def commit(
        self,
        parts: Sequence[Part],
        *,
        name: str,
        input: Mapping[str, Any] | None = None,
    ) -> Committed:
        """Publish the dataset ``name`` over ``parts`` (in part-name order).

        Every part must be complete at the location; the descriptor is created
        only if none is there, so a crash before this call leaves no dataset and
        a retried commit of the same parts is the same commit. ``input`` records
        what the parts were written from (files, a table's snapshot), as JSON.
        """
        rows = [(p.name, p.cache_id, p.records) for p in parts]
        text, created = _native.commit_dataset(
            self.location, name, self.write_id, rows, json.dumps(input)
        )
        descriptor = json.loads(text)
        return Committed(
            location=self.location,
            name=descriptor["name"],
            caches=len(descriptor["caches"]),
            records=sum(c["records"] for c in descriptor["caches"]),
            created=created,
            descriptor=descriptor,
        )


def read_descriptor(location: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The descriptor of the dataset at ``location``, or None when none is committed."""
    text = _native.read_descriptor(_location(location))
    return None if text is None else json.loads(text)


def remove_uncommitted(
    location: str | os.PathLike[str], *, min_age_seconds: float = 3600.0, dry_run: bool = False
) -> Removal:
    """Remove the parts at ``location`` that no committed descriptor names.

    A part with an object younger than ``min_age_seconds`` is left alone (a write
    may still be running); with ``dry_run`` nothing is removed.
    """
    removed, recent, size = _native.remove_uncommitted(
        _location(location), float(min_age_seconds), dry_run
    )
    return Removal(removed, recent, size)


def _location(location: object) -> str:
    if not isinstance(location, (str, os.PathLike)):
        raise InvalidArgumentError(
            f"a location is a directory or s3://BUCKET/PREFIX, got {type(location).__name__}"
        )
    return os.fspath(location)
