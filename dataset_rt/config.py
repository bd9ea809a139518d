"""Frozen, validated configuration models.

The configs are pydantic models, as in dataset-rt 0.4.8: ``ReaderConfig(seed=7)``,
``ReaderConfig.model_validate({...})`` from a YAML/Hydra config, ``model_dump()``,
pickling and ``==`` all work, and assigning a field raises ``ValidationError``
("frozen"). Pydantic checks each field's type (strictly: ``True`` is not an int,
``"7"`` is not an int) and refuses unknown keys; every value rule (ranges, codec
names, ``ratio``) lives in the engine, which each model calls when it is
built, so a bad value fails where it is written with a ``ValidationError`` (a
``ValueError``) whose text is the engine's message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dataset_rt import _native
from dataset_rt.facade import facade_module

CompressionAlgo: TypeAlias = Literal["none", "lz4", "zstd"]


#: A stream's mode, the ``shuffle`` key: ``True`` (weighted draws with
#: replacement), ``False`` (table order) or ``"permutation"``.
ShuffleMode: TypeAlias = bool | Literal["permutation"]

# Strict field types, frozen instances, unknown keys refused.
_FROZEN = ConfigDict(frozen=True, extra="forbid", strict=True)


class ShardCompression(BaseModel):
    """Per-record compression of payload shards.

    ``algo`` is ``"none"``, ``"lz4"`` or ``"zstd"``; ``level`` applies to zstd
    (1-22, default 3). ``ratio`` is 0.4.8's expected compression ratio: advisory
    (finite and > 0), and exactly 1.0 when ``algo`` is ``"none"``. Each record is
    compressed on its own, so any record can be read without touching its
    neighbours.
    """

    model_config = _FROZEN

    algo: CompressionAlgo = "none"
    ratio: float = 1.0
    level: int = 3

    @model_validator(mode="after")
    def _engine_rules(self) -> ShardCompression:
        _ = self.options
        return self

    @property
    def options(self) -> _native.CompressionOptions:
        """The engine's validated copy of this configuration."""
        return _native.CompressionOptions(algo=self.algo, level=self.level, ratio=self.ratio)


DEFAULT_SHARD_COMPRESSION = ShardCompression()


class WriterProfilerConfig(BaseModel):
    """Optional timing profile of cache writes (off by default).

    When ``enabled``, each `DatasetRuntime.write_cache` (or the writing part of
    ``from_cache_sources``) writes a JSON summary to ``path``: per source, the
    calls, bytes and seconds of each writer stage (``python_next``,
    ``python_extract``, ``compression``, ``disk_write``, ``finish_manifest``,
    ``publish``). The summary is also written when a source raises, including
    ``KeyboardInterrupt``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(default=False, strict=True)
    path: Path = Path("dataset_rt_profile.json")


DEFAULT_WRITER_PROFILER_CONFIG = WriterProfilerConfig()


class WriterConfig(BaseModel):
    """How caches are written.

    ``prefetch_size`` bounds the records pulled from the source ahead of the
    committed ones; ``max_shard_bytes`` is the size at which a payload shard is
    closed and the next one started; ``show_progress`` draws a progress bar when
    stderr is a terminal (silent otherwise); ``validate_cache`` verifies the full
    checksums of an existing cache before ``from_cache_sources`` reuses it;
    ``profiler`` writes a per-stage timing summary (`WriterProfilerConfig`).

    ``num_processes`` (>= 0) and ``process_timeout_seconds`` (finite, > 0) are
    0.4.8's settings for writing sources in spawned processes. They are
    validated and kept, but every source is written by the calling process:
    encoding, compression and checksums already run on the runtime's worker
    threads (docs/migrating.md).
    """

    model_config = _FROZEN

    num_processes: int = 0
    process_timeout_seconds: float = 3600.0
    prefetch_size: int = 64
    max_shard_bytes: int = 64 * 1024 * 1024
    shard_compression: ShardCompression = DEFAULT_SHARD_COMPRESSION
    show_progress: bool = True
    validate_cache: bool = False
    profiler: WriterProfilerConfig = DEFAULT_WRITER_PROFILER_CONFIG

    @model_validator(mode="after")
    def _engine_rules(self) -> WriterConfig:
        _ = self.options
        return self

    @property
    def options(self) -> _native.WriteOptions:
        """The engine's validated copy of this configuration."""
        return _native.WriteOptions(
            prefetch_size=self.prefetch_size,
            max_shard_bytes=self.max_shard_bytes,
            compression=self.shard_compression.options,
            show_progress=self.show_progress,
            validate_cache=self.validate_cache,
            num_processes=self.num_processes,
            process_timeout_seconds=self.process_timeout_seconds,
            profile_path=str(self.profiler.path) if self.profiler.enabled else None,
        )


class ReaderConfig(BaseModel):
    """How a dataset is read.

    ``seed`` fixes the stream (any int that fits in 64 bits, negative values are
    taken modulo 2**64); ``prefetch_size`` is the number of samples decoded ahead
    of the consumer; ``shuffle`` selects weighted sampling with replacement
    (``True``), the active rows in order (``False``) or every row once per cycle
    of ``rows`` positions in a fresh random order (``"permutation"``, weights
    ignored; see docs/sampling.md); ``validate_cache`` verifies
    the full checksum of every cache file when the dataset is opened.
    """

    model_config = _FROZEN

    seed: int
    prefetch_size: int = 64
    shuffle: ShuffleMode = True
    validate_cache: bool = False

    @model_validator(mode="after")
    def _engine_rules(self) -> ReaderConfig:
        _ = self.options
        return self

    @property
    def seed_u64(self) -> int:
        """The seed as the unsigned 64-bit value the sampler uses."""
        return self.options.seed

    @property
    def options(self) -> _native.ReaderOptions:
        """The engine's validated copy of this configuration."""
        return _native.ReaderOptions(
            seed=self.seed,
            prefetch_size=self.prefetch_size,
            shuffle=self.shuffle,
            validate_cache=self.validate_cache,
        )


DEFAULT_WRITER_CONFIG = WriterConfig()

facade_module(ShardCompression, WriterProfilerConfig, WriterConfig, ReaderConfig)
