"""DatasetRT: immutable dataset caches, validated populations, deterministic epoch streams.

Write expensive preprocessing once into immutable caches, edit the active
population as a Polars table, and read reproducible weighted epoch streams, all
driven by a Rust engine.
"""

from dataset_rt.config import (
    DEFAULT_WRITER_CONFIG,
    CompressionAlgo,
    ReaderConfig,
    ShardCompression,
    ShuffleMode,
    WriterConfig,
)
from dataset_rt.dataset import (
    CachedDataset,
    CacheSourcesDatasetError,
    CacheSourcesDatasetResult,
    CacheSourcesDatasetSuccess,
)
from dataset_rt.errors import (
    CacheIOError,
    CorruptCacheError,
    DatasetRTError,
    InternalError,
    InvalidArgumentError,
    InvalidPopulationError,
    NotFoundError,
    SchemaMismatchError,
    SourceError,
)
from dataset_rt.records import (
    BytesLike,
    CachedSample,
    CacheInput,
    CacheSource,
    CacheWriteError,
    CacheWriteResult,
    CacheWriteSuccess,
    Metadata,
    MetadataValue,
)
from dataset_rt.runtime import DatasetRuntime

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_WRITER_CONFIG",
    "BytesLike",
    "CacheIOError",
    "CacheInput",
    "CacheSource",
    "CacheSourcesDatasetError",
    "CacheSourcesDatasetResult",
    "CacheSourcesDatasetSuccess",
    "CacheWriteError",
    "CacheWriteResult",
    "CacheWriteSuccess",
    "CachedDataset",
    "CachedSample",
    "CompressionAlgo",
    "CorruptCacheError",
    "DatasetRTError",
    "DatasetRuntime",
    "InternalError",
    "InvalidArgumentError",
    "InvalidPopulationError",
    "Metadata",
    "MetadataValue",
    "NotFoundError",
    "ReaderConfig",
    "SchemaMismatchError",
    "ShardCompression",
    "ShuffleMode",
    "SourceError",
    "WriterConfig",
]
