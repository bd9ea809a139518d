"""The public names under the module path dataset-rt 0.4.8 gave them.

0.4.8's classes report ``dataset_rt.api`` as their module, so its users' pickles
(and some imports) name ``dataset_rt.api.ReaderConfig`` and the like. The same
classes report it here, and this module re-exports every public name, so those
pickles load and those imports resolve to the very objects ``dataset_rt`` exports.
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

__all__ = [
    "DEFAULT_SHARD_COMPRESSION",
    "DEFAULT_WRITER_CONFIG",
    "DEFAULT_WRITER_PROFILER_CONFIG",
    "AbsentManifestTarget",
    "BytesLike",
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
    "DatasetRuntime",
    "Err",
    "ManifestUpdateEntry",
    "ManifestUpdateError",
    "ManifestUpdateReport",
    "Metadata",
    "MetadataValue",
    "Ok",
    "ReaderConfig",
    "Result",
    "ShardCompression",
    "ShuffleMode",
    "SizedTorchIterableDataset",
    "WriterConfig",
    "WriterProfilerConfig",
]
