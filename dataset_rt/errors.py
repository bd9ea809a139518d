"""The exceptions DatasetRT raises.

Rust owns every rule, and the classes too: the native extension creates them
(``native/src/python/errors.rs``) so that raising one never depends on this
package; this module re-exports them. One ``except`` clause catches the same
failure from the library, the CLI and the Flight server.

- `DatasetRTError`: base class of every error raised by DatasetRT.
- `CorruptCacheError` (also `OSError`): a cache is incomplete, malformed or fails a
  checksum; the message names the file and the fix.
- `CacheIOError` (also `OSError`): the operating system refused a read or write.
- `StorageFullError` (a `CacheIOError`): the volume a write needed is full; nothing was
  written. Over Flight it is UNAVAILABLE, which clients retry on another replica.
- `StoreUnavailableError` (a `CacheIOError`): object storage could not be reached or
  refused a request; nothing changed. Over Flight it is UNAVAILABLE.
- `SchemaMismatchError` (also `ValueError`): records or caches disagree about the schema.
- `InvalidPopulationError` (also `ValueError`): a metadata table was rejected;
  ``column``, ``row`` and ``count`` say where.
- `InvalidArgumentError` (also `ValueError`): an argument is out of range or of the wrong kind.
- `NotFoundError` (also `LookupError`): a named dataset, population or cache does not exist.
- `SourceError`: a cache source raised, or yielded a bad record.
- `InternalError` (also `RuntimeError`): something broke inside the engine (a worker
  failed, a lock was poisoned); over Flight it is INTERNAL, which clients retry.
"""

from __future__ import annotations

from dataset_rt._native import (
    CacheIOError,
    CorruptCacheError,
    DatasetRTError,
    FencedError,
    InternalError,
    InvalidArgumentError,
    InvalidPopulationError,
    NotFoundError,
    SchemaMismatchError,
    SourceError,
    StorageFullError,
    StoreUnavailableError,
)

__all__ = [
    "CacheIOError",
    "CorruptCacheError",
    "DatasetRTError",
    "FencedError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidPopulationError",
    "NotFoundError",
    "SchemaMismatchError",
    "SourceError",
    "StorageFullError",
    "StoreUnavailableError",
]
