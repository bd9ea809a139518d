"""Frozen, validated configuration objects.

Validation happens at construction, so a bad value fails where it is written, with
a message that says what would be valid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from dataset_rt import _native
from dataset_rt.errors import InvalidArgumentError

CompressionAlgo: TypeAlias = Literal["none", "lz4", "zstd"]


#: A stream's mode, the ``shuffle`` key: ``True`` (weighted draws with
#: replacement), ``False`` (table order) or ``"permutation"``.
ShuffleMode: TypeAlias = bool | Literal["permutation"]


@dataclass(frozen=True)
class ShardCompression:
    """Per-record compression of payload shards.

    ``algo`` is ``"none"``, ``"lz4"`` or ``"zstd"``; ``level`` applies to zstd
    (1-22, default 3). Each record is compressed on its own, so any record can be
    read without touching its neighbours.
    """

    algo: CompressionAlgo = "none"
    level: int = 3
    # The engine's validated copy (its rules live in Rust), built at construction.
    _options: _native.CompressionOptions = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        options = _native.CompressionOptions(algo=self.algo, level=self.level)
        object.__setattr__(self, "_options", options)

    @property
    def options(self) -> _native.CompressionOptions:
        """The engine's validated copy of this configuration."""
        return self._options


@dataclass(frozen=True)
class WriterConfig:
    """How caches are written.

    ``prefetch_size`` bounds the records pulled from the source ahead of the
    committed ones; ``max_shard_bytes`` is the size at which a payload shard is
    closed and the next one started; ``show_progress`` draws a progress bar when
    stderr is a terminal (silent otherwise); ``validate_cache`` verifies the full
    checksums of an existing cache before ``from_cache_sources`` reuses it.
    """

    prefetch_size: int = 64
    max_shard_bytes: int = 64 * 1024 * 1024
    shard_compression: ShardCompression = field(default_factory=ShardCompression)
    show_progress: bool = True
    validate_cache: bool = False

    # The engine's validated copy (its rules live in Rust), built at construction.
    _options: _native.WriteOptions = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.shard_compression, ShardCompression):
            raise InvalidArgumentError(
                "WriterConfig.shard_compression must be a ShardCompression, got "
                f"{type(self.shard_compression).__name__}"
            )
        options = _native.WriteOptions(
            prefetch_size=self.prefetch_size,
            max_shard_bytes=self.max_shard_bytes,
            compression=self.shard_compression.options,
            show_progress=self.show_progress,
            validate_cache=self.validate_cache,
        )
        object.__setattr__(self, "_options", options)

    @property
    def options(self) -> _native.WriteOptions:
        """The engine's validated copy of this configuration."""
        return self._options


@dataclass(frozen=True)
class ReaderConfig:
    """How a dataset is read.

    ``seed`` fixes the stream (any int that fits in 64 bits, negative values are
    taken modulo 2**64); ``prefetch_size`` is the number of samples decoded ahead
    of the consumer; ``shuffle`` selects weighted sampling with replacement
    (``True``), the active rows in order (``False``) or every row once per cycle
    of ``rows`` positions in a fresh random order (``"permutation"``, weights
    ignored; see docs/sampling.md); ``validate_cache`` verifies
    the full checksum of every cache file when the dataset is opened.
    """

    seed: int
    prefetch_size: int = 64
    shuffle: ShuffleMode = True
    validate_cache: bool = False
    # The engine's validated copy (its rules live in Rust): built at construction,
    # so a bad value fails where it is written.
    _options: _native.ReaderOptions = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        options = _native.ReaderOptions(
            seed=self.seed,
            prefetch_size=self.prefetch_size,
            shuffle=self.shuffle,
            validate_cache=self.validate_cache,
        )
        object.__setattr__(self, "_options", options)

    @property
    def seed_u64(self) -> int:
        """The seed as the unsigned 64-bit value the sampler uses."""
        return self._options.seed

    @property
    def options(self) -> _native.ReaderOptions:
        """The engine's validated copy of this configuration."""
        return self._options


DEFAULT_WRITER_CONFIG = WriterConfig()
