"""Records that cross the public API: inputs, samples and write outcomes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeAlias, runtime_checkable

if TYPE_CHECKING:
    from dataset_rt.dataset import CachedDataset

MetadataValue: TypeAlias = bool | int | float | str
"""A metadata value: stored as Boolean, Int64, Float64 or String."""

Metadata: TypeAlias = Mapping[str, MetadataValue]
BytesLike: TypeAlias = bytes | bytearray | memoryview


class CacheInput(NamedTuple):
    """One record yielded by a `CacheSource`: opaque payload bytes plus metadata.

    Every record of a source has the same metadata keys with the same value types;
    ``int`` values are accepted in a float column, nothing else is converted.
    """

    data: BytesLike
    metadata: Metadata


class CachedSample(NamedTuple):
    """One sample of an epoch stream (or of `CachedDataset.get_item`)."""

    data: bytes
    metadata: dict[str, MetadataValue]
    cache_id: int
    sample_id: int


@runtime_checkable
class CacheSource(Protocol):
    """A named, re-iterable producer of `CacheInput` records.

    ``name`` becomes the cache directory name under the base directory and part of
    the cache's identity.
    """

    name: str

    def __iter__(self) -> Iterator[CacheInput]: ...


class CacheWriteSuccess(NamedTuple):
    """A source whose cache is complete at ``path`` (written now or reused)."""

    source_name: str
    path: Path


class CacheWriteError(NamedTuple):
    """A source that has no usable cache; ``message`` says why and what to do."""

    source_name: str
    message: str


CacheWriteResult: TypeAlias = CacheWriteSuccess | CacheWriteError


class CacheSourcesDatasetSuccess(NamedTuple):
    """At least one cache is usable; ``dataset`` reads all usable ones."""

    dataset: CachedDataset
    results: list[CacheWriteResult]


class CacheSourcesDatasetError(NamedTuple):
    """No dataset was opened; ``results`` holds every source's outcome."""

    results: list[CacheWriteResult]
    message: str


CacheSourcesDatasetResult: TypeAlias = CacheSourcesDatasetSuccess | CacheSourcesDatasetError
