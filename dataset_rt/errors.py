"""The exceptions DatasetRT raises.

Rust owns every rule; this module only names the outcomes. The native extension
raises these classes (see ``native/src/python/errors.rs``), so one ``except``
clause catches the same failure from the library, the CLI and the Flight server.
"""

from __future__ import annotations


class DatasetRTError(Exception):
    """Base class of every error raised by DatasetRT."""


class CorruptCacheError(DatasetRTError, OSError):
    """A cache directory is incomplete, malformed, of an unknown format version, or
    fails a checksum. The message names the file and the problem."""


class CacheIOError(DatasetRTError, OSError):
    """The operating system refused a read or write (permissions, disk full, ...)."""


class SchemaMismatchError(DatasetRTError, ValueError):
    """Records or caches disagree about the metadata schema."""


class InvalidPopulationError(DatasetRTError, ValueError):
    """A metadata table was rejected; the active population is unchanged.

    ``column``, ``row`` (first offending row) and ``count`` (how many rows fail)
    are set when the failure is about rows of a column.
    """

    column: str | None = None
    row: int | None = None
    count: int | None = None


class InvalidArgumentError(DatasetRTError, ValueError):
    """An argument is out of range or of the wrong kind."""


class NotFoundError(DatasetRTError, LookupError):
    """A named dataset, population or cache does not exist."""


class SourceError(DatasetRTError):
    """A cache source raised while it was being iterated, or yielded a bad record."""


class InternalError(DatasetRTError, RuntimeError):
    """Something broke inside the engine (a worker failed, a lock was poisoned).

    Not caused by the caller's input; over Flight it is INTERNAL, which clients
    retry on another replica.
    """


__all__ = [
    "CacheIOError",
    "CorruptCacheError",
    "DatasetRTError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidPopulationError",
    "NotFoundError",
    "SchemaMismatchError",
    "SourceError",
]
