"""Records that cross the public API: inputs, samples and write outcomes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple, Protocol, TypeAlias, runtime_checkable

from dataset_rt._native import CachedSample

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


__all__ = [
    "BytesLike",
    "CacheInput",
    "CacheSource",
    "CacheWriteError",
    "CacheWriteResult",
    "CacheWriteSuccess",
    "CachedSample",
    "Metadata",
    "MetadataValue",
]
