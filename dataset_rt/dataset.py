"""`CachedDataset`: the active population of a set of caches and its epoch streams.

All state that affects which samples are read (population, stream position, epoch
length) lives in Rust; this class adapts it to Python (Polars in, Polars out,
samples and Arrow record batches out).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple, NoReturn, TypeAlias

import polars as pl
import pyarrow as pa

from dataset_rt import _native
from dataset_rt.config import ReaderConfig
from dataset_rt.facade import facade_module
from dataset_rt.integrations.torch import to_torch_iterable_dataset
from dataset_rt.lazy import hand_over, scan_batches, table_batches
from dataset_rt.partition import Partition, as_partition
from dataset_rt.reconstruction import dump_configuration, load_configuration
from dataset_rt.records import (
    AbsentManifestTarget,
    CachedSample,
    CacheWriteResult,
    Err,
    ManifestUpdateEntry,
    ManifestUpdateError,
    ManifestUpdateReport,
    Ok,
    Result,
    SizedTorchIterableDataset,
)


class CachedDataset:
    """A readable view of one or more immutable caches.

    Iterating it (``for sample in dataset``) yields `CachedSample` records: each new
    iterator takes the next ``len(dataset)`` positions of the dataset's
    deterministic stream. Use `DatasetRuntime.cached_dataset` or
    `DatasetRuntime.from_cache_sources` to create one.
    """

    __slots__ = ("_engine", "_num_workers", "cache_paths", "reader_config")

    cache_paths: list[Path]
    reader_config: ReaderConfig
    _engine: _native.Dataset
    _num_workers: int

    def __init__(self) -> None:
        raise TypeError("use DatasetRuntime.cached_dataset() to open a CachedDataset")

    @classmethod
    def _open(
        cls,
        runtime: _native.Runtime,
        paths: Sequence[Path | str],
        config: ReaderConfig,
        mirror_dir: str | None = None,
    ) -> CachedDataset:
        dataset = cls.__new__(cls)
        dataset.reader_config = config
        dataset._num_workers = runtime.num_workers
        dataset._engine = _native.Dataset(
            runtime, [str(p) for p in paths], config.options, mirror_dir
        )
        # The caches themselves: a dataset of many caches stands for its caches.
        dataset.cache_paths = [Path(p) for p in dataset._engine.cache_dirs]
        return dataset

    @property
    def num_workers(self) -> int:
        """The worker threads of the runtime that opened this dataset."""
        return self._num_workers

    # -- export and rebuild ---------------------------------------------------------

    def dump_config(self, path: str | Path) -> Path:
        """Save this dataset's settings and active population into an existing directory.

        Writes ``metadata.arrow`` (the active table: rows, order, duplicates,
        weights, extra columns) and then ``dataset.json`` (cache paths, reader
        config, worker count, epoch length), never overwriting a file, and
        returns the ``dataset.json`` path. Payloads are referenced, not copied;
        the stream position is not saved. See `from_config`.
        """
        return dump_configuration(
            path,
            self.get_metadata().to_arrow(),
            cache_paths=self.cache_paths,
            reader_config=self.reader_config,
            num_workers=self.num_workers,
            epoch_len=len(self),
        )

    @classmethod
    def from_config(cls, path: str | Path) -> CachedDataset:
        """A fresh dataset from a ``dataset.json`` written by `dump_config`.

        Opens the caches on a new runtime of the saved worker count, validates
        the saved population as `update_metadata` does, restores the epoch
        length, and starts at stream position 0.
        """
        configuration, table = load_configuration(path)
        runtime = _native.Runtime(configuration.num_workers)
        dataset = cls._open(runtime, list(configuration.cache_paths), configuration.reader_config)
        dataset.update_metadata(table)
        dataset.set_epoch_len(configuration.epoch_len)
        return dataset

    # -- population -------------------------------------------------------------

    def get_metadata(self) -> pl.DataFrame:
        """The active population as a Polars DataFrame.

        Columns: ``cache_id`` (UInt64), ``sample_id`` (UInt64), the stored metadata
        columns sorted by name (as dataset-rt 0.4.8 listed them), ``weight``
        (Float64), then any extra columns; after an update, the columns and row
        order of the table given (duplicates included).
        """
        return pl.DataFrame(self._engine.metadata())

    def scan_metadata(self, *, show_progress: bool = True) -> pl.LazyFrame:
        """The active population as a Polars LazyFrame, read batch by batch.

        The frame is the population active now (a later update does not change
        it) with `get_metadata`'s columns and types: ``scan_metadata().collect()``
        equals ``get_metadata()``. A query reads the engine's table in batches and
        applies its projection, filter and row limit to each one, so that
        ``dataset.scan_metadata().filter(...).select(...)`` never copies the rows
        it drops (docs/large-datasets.md). While a query reads, a progress bar
        of the rows read is drawn on stderr when it is a terminal
        (``show_progress=False``: never).
        """
        table = self._engine.metadata()
        schema = pa.RecordBatchReader.from_stream(table).schema
        rows = table.num_rows
        return scan_batches(
            schema,
            table_batches(table),
            name="dataset_rt population",
            progress=("scan population", lambda: rows) if show_progress else None,
        )

    def update_metadata(self, table: Any) -> None:
        """Validate ``table`` in Rust and make it the active population.

        ``table`` is any object that exports the Arrow C stream interface (a Polars
        DataFrame, a pyarrow Table or RecordBatchReader), a Polars LazyFrame (run
        by Polars' streaming engine and handed over batch by batch, never
        collected in Python), or the path of a Parquet file or of a directory of
        Parquet files (read batch by batch). On success the stream position
        resets to 0 and the epoch length to the new row count. On failure an
        `InvalidPopulationError` names the column, the first offending row and
        how many rows fail, and nothing changes; a LazyFrame or file that fails
        while it is read raises its own error, and nothing changes either.
        """
        hand_over(table, self._engine.update_metadata)

    def samples_metadata(self) -> pl.DataFrame:
        """Alias of `get_metadata`."""
        return self.get_metadata()

    def set_samples_metadata(self, table: Any) -> None:
        """Alias of `update_metadata`."""
        self.update_metadata(table)

    @property
    def metadata_columns(self) -> list[str]:
        """The names of the metadata columns stored in the caches."""
        return list(self._engine.stored_columns)

    # -- the stream -------------------------------------------------------------

    def set_epoch_len(self, epoch_len: int) -> None:
        """Set how many positions each future iterator takes (existing ones keep theirs)."""
        self._engine.set_epoch_len(epoch_len)

    def __len__(self) -> int:
        """The epoch length: how many samples the next iterator yields."""
        return self._engine.epoch_len

    def __iter__(self) -> Iterator[CachedSample]:
        """Take the next ``len(self)`` positions of the stream, decoded as samples.

        The iterator is a snapshot: later updates do not change what it yields.
        """
        return self._engine.samples()

    def iter_samples(
        self, partition: Partition | None = None, **partition_keys: int | None
    ) -> Iterator[CachedSample]:
        """Take the next epoch like ``iter(self)``, and yield one rank's share,
        ``partition`` (the whole epoch when None).

        The partition rule is a Flight ticket's (docs/sampling.md): the
        epoch-relative range ``[start, stop)`` is cut into blocks of ``block``
        consecutive positions, rank ``r`` of ``world_size`` takes blocks ``r,
        r + world_size, ...`` (every rank the same number; the remainder goes to
        no rank), and ``offset`` skips the rank's first samples. With the
        defaults, rank ``r`` reads positions ``r, r + world_size, ...``.

        The keys as keyword arguments (``rank=``, ``world_size=``, ``start=``,
        ``stop=``, ``block=``, ``offset=``) are deprecated: they still build the
        partition for one release, with a `DeprecationWarning`.
        """
        chosen = as_partition(partition, partition_keys, method="CachedDataset.iter_samples")
        return self._engine.samples(chosen)

    def epoch(
        self,
        epoch: int,
        partition: Partition | None = None,
        *,
        columns: Sequence[str] | None = None,
        batch_size: int = 1024,
        payload: bool = True,
        **partition_keys: int | None,
    ) -> pa.RecordBatchReader:
        """One rank's partition of epoch ``epoch``, ``partition`` (the whole
        epoch when None), as Arrow record batches.

        Epoch ``e`` is positions ``[e * L, (e + 1) * L)`` of the stream for the
        active population and the current epoch length ``L``, partitioned by the
        rule of `iter_samples` (and of a Flight ticket: the same partition gives
        the same samples as a server for the same caches, population and seed).
        With ``payload=False`` the batches have no ``payload`` column and no
        record is read: ids and columns at the speed of the draws. Does not move
        the dataset's own position. The partition's keys as keyword arguments
        are deprecated, as for `iter_samples`.
        """
        native = self._engine.epoch(
            epoch,
            None if columns is None else list(columns),
            partition=as_partition(partition, partition_keys, method="CachedDataset.epoch"),
            batch_size=batch_size,
            payload=payload,
        )
        return batch_reader(native)

    def iter_batches(
        self, columns: Sequence[str] | None = None, *, batch_size: int = 1024
    ) -> pa.RecordBatchReader:
        """Take the next epoch like ``iter(self)`` but as Arrow record batches.

        Each batch has ``position`` (the draw's position in the stream),
        ``cache_id``, ``sample_id``, ``payload`` (large_binary) and the chosen
        metadata columns (all stored columns when ``columns`` is None). Batches
        hold at most ``batch_size`` rows and stay within a few MiB.
        """
        stream = self._engine.batches(
            None if columns is None else list(columns), batch_size=batch_size
        )
        return batch_reader(stream)

    def stream(
        self,
        *,
        start: int = 0,
        count: int | None = None,
        stride: int = 1,
        columns: Sequence[str] | None = None,
        batch_size: int = 1024,
        payload: bool = True,
    ) -> pa.RecordBatchReader:
        """Read positions ``start, start + stride, ...`` (``count`` of them) directly.

        This does not move the dataset's own position; any window of the stream can
        be read without computing the positions before it. ``count`` defaults to
        the epoch length. ``payload=False`` leaves the record bytes out (and unread).
        """
        native = self._engine.stream(
            start,
            self._engine.epoch_len if count is None else count,
            stride,
            None if columns is None else list(columns),
            batch_size=batch_size,
            payload=payload,
        )
        return batch_reader(native)

    def draw_rows(self, *, start: int = 0, count: int | None = None, stride: int = 1) -> pa.Array:
        """The active-table row index (uint32) drawn at each position of a window.

        The same draws the stream makes, without reading payloads: use it to study
        or audit sampling (e.g. how often each row is drawn). Computed in parallel
        on the runtime's workers; does not move the dataset's position.
        """
        table = self._engine.draw_rows(
            start, self._engine.epoch_len if count is None else count, stride
        )
        # Through the C stream, not `pa.table`, which imports pandas to ask
        # whether the engine's table is a DataFrame (seconds, the first time).
        return pa.RecordBatchReader.from_stream(table).read_all().column("row").combine_chunks()

    def get_item(self, cache_id: int, sample_id: int) -> CachedSample:
        """Read one record by identity (stored metadata, not the population's extras).

        Reads nothing else: no iterator or stream position moves, and a record
        removed from the population is still readable. Raises ``TypeError`` when
        an id is not an ``int`` (``bool``, ``str`` and ``float`` are refused) and
        ``IndexError`` ("out of range") when it is negative, does not fit in 64
        bits, or names no cache or record of this dataset.
        """
        return self._engine.get_item(cache_id, sample_id)

    def to_torch_iterable_dataset(self) -> SizedTorchIterableDataset:
        """Wrap this dataset as a sized ``torch.utils.data.IterableDataset``.

        Each ``iter()`` takes the next epoch. Use it with ``num_workers=0``
        (DataLoader workers raise ``RuntimeError``, as in dataset-rt 0.4.8; for
        workers use `dataset_rt.torch.DatasetLoader`). Raises ImportError when
        torch is not installed.
        """
        return to_torch_iterable_dataset(self)

    def to_torch_dataloader(self, **options: object) -> NoReturn:
        """Not provided: dataset-rt 0.4.8's DataLoader factory. Raises NotImplementedError.

        Use `dataset_rt.torch.DatasetLoader` (docs/training.md): every epoch
        partitioned over ranks and DataLoader workers, with exact checkpoint and
        resume; docs/migrating.md maps 0.4.8's options to it.
        """
        raise NotImplementedError(
            "CachedDataset.to_torch_dataloader (dataset-rt 0.4.8) is not provided: use "
            "dataset_rt.torch.DatasetLoader, which partitions every epoch over ranks and "
            "DataLoader workers and resumes exactly (docs/training.md, docs/migrating.md)"
        )

    def update_manifests(self, version: int) -> Result[ManifestUpdateReport, ManifestUpdateError]:
        """dataset-rt 0.4.8's migration of v2 manifests to v3, kept for its callers.

        The caches of this format already carry their persistent ``cache_id``, so
        there is nothing to migrate: ``update_manifests(3)`` returns
        ``Ok(ManifestUpdateReport)`` with one ``"unchanged"`` entry per cache and
        touches no file. Any other ``version`` is refused with
        ``Err(ManifestUpdateError)``.
        """
        if type(version) is not int or version != 3:
            return Err(
                ManifestUpdateError(
                    AbsentManifestTarget("unsupported migration request"),
                    f"unsupported manifest migration target {version!r}; expected integer 3",
                )
            )
        ids = self._engine.cache_ids
        entries = tuple(
            ManifestUpdateEntry(path / "manifest.json", cache_id, "unchanged")
            for path, cache_id in zip(self.cache_paths, ids, strict=True)
        )
        return Ok(ManifestUpdateReport(entries))

    @property
    def num_rows(self) -> int:
        """Rows of the active population."""
        return self._engine.num_rows

    def __repr__(self) -> str:
        return (
            f"CachedDataset(caches={len(self.cache_paths)}, rows={self.num_rows}, "
            f"epoch_len={len(self)}, shuffle={self.reader_config.shuffle})"
        )


def batch_reader(stream: _native.BatchStream) -> pa.RecordBatchReader:
    """A native batch stream as a pyarrow reader that raises the engine's own
    exception (`CorruptCacheError`, `InternalError`, ...) when the stream fails."""
    reader = pa.RecordBatchReader.from_stream(stream)
    return pa.RecordBatchReader.from_batches(reader.schema, _typed_failures(reader, stream))


def _typed_failures(
    reader: pa.RecordBatchReader, stream: _native.BatchStream
) -> Iterator[pa.RecordBatch]:
    try:
        yield from reader
    except pa.ArrowException:
        stream.raise_failure()
        raise


class CacheSourcesDatasetSuccess(NamedTuple):
    """At least one cache is usable; ``dataset`` reads all usable ones."""

    dataset: CachedDataset
    results: list[CacheWriteResult]


class CacheSourcesDatasetError(NamedTuple):
    """No dataset was opened; ``results`` holds every source's outcome."""

    results: list[CacheWriteResult]
    message: str


CacheSourcesDatasetResult: TypeAlias = CacheSourcesDatasetSuccess | CacheSourcesDatasetError

facade_module(CachedDataset, CacheSourcesDatasetSuccess, CacheSourcesDatasetError)
