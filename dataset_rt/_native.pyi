"""Type stub of the Rust extension ``dataset_rt._native`` (see native/src/python/)."""

from collections.abc import Iterator
from typing import Any, final

from typing_extensions import CapsuleType

from dataset_rt.records import CachedSample

__version__: str
FORMAT_VERSION: int

@final
class Runtime:
    def __init__(self, num_workers: int) -> None: ...
    @property
    def num_workers(self) -> int: ...

@final
class BatchStream:
    """A one-shot Arrow record batch stream (export it with ``__arrow_c_stream__``)."""

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> CapsuleType: ...
    @property
    def schema_names(self) -> list[str]: ...

@final
class SampleIterator:
    def __iter__(self) -> Iterator[CachedSample]: ...
    def __next__(self) -> CachedSample: ...
    def __len__(self) -> int: ...

@final
class ArrowTable:
    """A table held by Rust, exportable once or many times as an Arrow C stream."""

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> CapsuleType: ...
    @property
    def num_rows(self) -> int: ...

@final
class Dataset:
    def __init__(
        self,
        runtime: Runtime,
        paths: list[str],
        *,
        seed: int,
        shuffle: bool,
        prefetch_size: int,
        validate_cache: bool,
    ) -> None: ...
    @property
    def epoch_len(self) -> int: ...
    @property
    def num_rows(self) -> int: ...
    @property
    def position(self) -> int: ...
    @property
    def stored_columns(self) -> list[str]: ...
    @property
    def cache_ids(self) -> list[int]: ...
    def metadata(self) -> ArrowTable: ...
    def update_metadata(self, table: Any) -> None: ...
    def set_epoch_len(self, epoch_len: int) -> None: ...
    def samples(self, rank: int = 0, world_size: int = 1) -> SampleIterator: ...
    def batches(self, columns: list[str] | None, *, batch_size: int = 1024) -> BatchStream: ...
    def stream(
        self,
        start: int,
        count: int,
        stride: int,
        columns: list[str] | None,
        *,
        batch_size: int = 1024,
    ) -> BatchStream: ...
    def draw_rows(self, start: int, count: int, stride: int) -> ArrowTable: ...
    def get_item(self, cache_id: int, sample_id: int) -> CachedSample: ...

@final
class DatasetService:
    def __init__(
        self,
        runtime: Runtime,
        name: str,
        paths: list[str],
        state_dir: str,
        *,
        validate_cache: bool = False,
    ) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def cache_ids(self) -> list[int]: ...
    @property
    def stored_columns(self) -> list[str]: ...
    def active(self) -> dict[str, Any]: ...
    def populations(self) -> list[str]: ...
    def put(self, table: Any, activate: bool) -> tuple[str, int]: ...
    def set_epoch_len(self, epoch_len: int) -> int: ...
    def metadata(self, population: str | None = None) -> ArrowTable: ...
    def stream(
        self,
        *,
        population: str | None,
        seed: int,
        shuffle: bool,
        epoch: int,
        epoch_len: int | None,
        rank: int,
        world_size: int,
        offset: int,
        columns: list[str],
        batch_size: int = 1024,
        prefetch_size: int = 256,
    ) -> BatchStream: ...
    def schema(
        self,
        *,
        population: str | None,
        seed: int,
        shuffle: bool,
        epoch: int,
        epoch_len: int | None,
        rank: int,
        world_size: int,
        offset: int,
        columns: list[str],
    ) -> ArrowTable: ...
    def stats(self) -> dict[str, int]: ...

def validate_source_name(name: str) -> None: ...
def write_cache(
    runtime: Runtime,
    records: Iterator[Any],
    base_dir: str,
    name: str,
    *,
    prefetch_size: int,
    max_shard_bytes: int,
    compression: str,
    compression_level: int,
    show_progress: bool,
    total: int | None = None,
) -> str: ...
def check_cache(path: str, full: bool) -> None: ...
def verify_cache(path: str) -> dict[str, Any]: ...
def inspect_cache(path: str) -> dict[str, Any]: ...
