"""Records that cross the public API: inputs, samples, write outcomes, results.

Every public class names ``dataset_rt.api`` as its module, the facade through
which dataset-rt 0.4.8 pickled and imported them, so existing pickles load.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Literal, NamedTuple, Protocol, TypeAlias, TypeVar, runtime_checkable

from dataset_rt._native import CachedSample
from dataset_rt.facade import facade_module

MetadataValue: TypeAlias = bool | int | float | str
"""A metadata value: stored as Boolean, Int64, Float64 or String."""

Metadata: TypeAlias = Mapping[str, MetadataValue]
BytesLike: TypeAlias = bytes | bytearray | memoryview

T = TypeVar("T")
E = TypeVar("E")


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


class SizedTorchIterableDataset(Protocol):
    """What `CachedDataset.to_torch_iterable_dataset` returns: a sized
    ``torch.utils.data.IterableDataset`` of `CachedSample`."""

    def __iter__(self) -> Iterator[CachedSample]: ...

    def __len__(self) -> int: ...


class CacheWriteSuccess(NamedTuple):
    """A source whose cache is complete at ``path`` (written now or reused)."""

    source_name: str
    path: Path


class CacheWriteError(NamedTuple):
    """A source that has no usable cache; ``message`` says why and what to do."""

    source_name: str
    message: str


CacheWriteResult: TypeAlias = CacheWriteSuccess | CacheWriteError


@dataclass(frozen=True)
class Ok(Generic[T]):
    """A successful outcome (``match result: case Ok(value): ...``)."""

    value: T


@dataclass(frozen=True)
class Err(Generic[E]):
    """An expected failure returned as a value rather than raised."""

    error: E


Result: TypeAlias = Ok[T] | Err[E]


@dataclass(frozen=True)
class ManifestUpdateEntry:
    """One cache's outcome of `CachedDataset.update_manifests`."""

    path: Path
    cache_id: int
    status: Literal["updated", "unchanged", "durability_unknown"]


@dataclass(frozen=True)
class ManifestUpdateReport:
    """Every cache's outcome, in the dataset's cache order."""

    entries: tuple[ManifestUpdateEntry, ...]


@dataclass(frozen=True)
class AbsentManifestTarget:
    """A refused request that names no manifest; ``reason`` says why."""

    reason: str


@dataclass(frozen=True)
class ManifestUpdateError:
    """A refused or failed manifest update, with the entries completed before it."""

    path: Path | AbsentManifestTarget
    message: str
    entries: tuple[ManifestUpdateEntry, ...] = ()


facade_module(
    CacheInput,
    CacheSource,
    SizedTorchIterableDataset,
    CacheWriteSuccess,
    CacheWriteError,
    Ok,
    Err,
    ManifestUpdateEntry,
    ManifestUpdateReport,
    AbsentManifestTarget,
    ManifestUpdateError,
)

__all__ = [
    "AbsentManifestTarget",
    "BytesLike",
    "CacheInput",
    "CacheSource",
    "CacheWriteError",
    "CacheWriteResult",
    "CacheWriteSuccess",
    "CachedSample",
    "Err",
    "ManifestUpdateEntry",
    "ManifestUpdateError",
    "ManifestUpdateReport",
    "Metadata",
    "MetadataValue",
    "Ok",
    "Result",
    "SizedTorchIterableDataset",
]
