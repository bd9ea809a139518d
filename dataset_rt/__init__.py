"""DatasetRT: immutable dataset caches, validated populations, deterministic epoch streams.

Write expensive preprocessing once into immutable caches, edit the active
population as a Polars table, and read reproducible weighted epoch streams, all
driven by a Rust engine. Code written for dataset-rt 0.4.8 runs unchanged: every
name it exported is here (and in `dataset_rt.api`); see docs/migrating.md.
"""

from dataset_rt.config import (
    DEFAULT_SHARD_COMPRESSION,
    DEFAULT_WRITER_CONFIG,
    DEFAULT_WRITER_PROFILER_CONFIG,
    CompressionAlgo,
    ReaderConfig,
    ShardCompression,
    ShuffleMode,
    WriterConfig,
    WriterProfilerConfig,
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
from dataset_rt.partition import Partition
from dataset_rt.records import (
    AbsentManifestTarget,
    BytesLike,
    CachedSample,
    CacheInput,
    CacheSource,
    CacheWriteError,
    CacheWriteResult,
    CacheWriteSuccess,
    Err,
    ManifestUpdateEntry,
    ManifestUpdateError,
    ManifestUpdateReport,
    Metadata,
    MetadataValue,
    Ok,
    Result,
    SizedTorchIterableDataset,
)
from dataset_rt.runtime import DatasetRuntime

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_SHARD_COMPRESSION",
    "DEFAULT_WRITER_CONFIG",
    "DEFAULT_WRITER_PROFILER_CONFIG",
    "AbsentManifestTarget",
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
    "Err",
    "FencedError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidPopulationError",
    "ManifestUpdateEntry",
    "ManifestUpdateError",
    "ManifestUpdateReport",
    "Metadata",
    "MetadataValue",
    "NotFoundError",
    "Ok",
    "Partition",
    "ReaderConfig",
    "Result",
    "SchemaMismatchError",
    "ShardCompression",
    "ShuffleMode",
    "SizedTorchIterableDataset",
    "SourceError",
    "StorageFullError",
    "StoreUnavailableError",
    "WriterConfig",
    "WriterProfilerConfig",
]
