"""Populations as Polars `LazyFrame`s, in and out, batch by batch (both faces).

Two conversions, shared by `CachedDataset` and `flight_client.DatasetClient`:

- `scan_batches`: an Arrow stream (opened afresh for every query, asked for the
  columns the query reads) as a `LazyFrame`, through a Polars IO source that
  yields it batch by batch and applies the query's projection, predicate and
  row limit to each batch, so a scan holds one batch at a time.
- `streamed`: a `LazyFrame` (run by Polars' streaming engine) or a Parquet path
  (a file or a directory, read one row group at a time: `dataset_rt.parquet`)
  as a `StreamedTable`: an Arrow schema known before the first batch and the
  batches, each cast to it.
  Eager tables (a Polars DataFrame, a pyarrow Table) are not converted: they keep
  the path they always had.

Nothing here validates a population: the engine does, on the stream it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import polars as pl
import pyarrow as pa

from dataset_rt.progress import progress_bar

#: Rows per batch when neither Polars nor the caller asks for a size: a population
#: row is tens of bytes, so a batch stays within a few MiB.
BATCH_ROWS = 65_536

BatchOpener = Callable[[], Iterator[pa.RecordBatch]]
#: Opens a stream of the columns named (in the stream's own order), or of every
#: column for None.
ColumnsOpener = Callable[[list[str] | None], Iterator[pa.RecordBatch]]
T = TypeVar("T")


# -- out: an Arrow stream as a LazyFrame --------------------------------------------


def polars_schema(schema: pa.Schema) -> pl.Schema:
    """The Polars schema of a frame read from an Arrow stream of ``schema``."""
    return pl.DataFrame(schema.empty_table()).schema


def read_columns(
    schema: pa.Schema, with_columns: list[str] | None, predicate: pl.Expr | None
) -> list[str] | None:
    """The columns a query reads from a stream of ``schema``, in the stream's
    order: those it projects and those its predicate names (None: all of them)."""
    if with_columns is None:
        return None
    wanted = set(with_columns)
    if predicate is not None:
        wanted.update(predicate.meta.root_names())
    columns = [name for name in schema.names if name in wanted]
    return columns if columns and len(columns) < len(schema.names) else None


def table_batches(table: Any) -> ColumnsOpener:
    """The opener of an engine table (`_native.ArrowTable`): a fresh stream of
    its slices, of the columns named (``table.select``) or of all of them."""

    def open_batches(columns: list[str] | None) -> Iterator[pa.RecordBatch]:
        read = table if columns is None else table.select(columns)
        return iter(pa.RecordBatchReader.from_stream(read))

    return open_batches


def scan_batches(
    schema: pa.Schema,
    open_batches: ColumnsOpener,
    *,
    name: str,
    progress: tuple[str, Callable[[], int | None]] | None = None,
) -> pl.LazyFrame:
    """A `LazyFrame` over the Arrow batches ``open_batches(columns)`` yields (of
    ``schema``, or of its ``columns`` when they are named).

    Every query opens the stream again, asking for the columns it reads (its
    projection and its predicate's; a wide table's other columns are never
    read), and reads it batch by batch: the predicate is applied to each batch,
    then the projection, and the stream is closed as soon as ``n_rows`` rows
    were produced. ``name`` labels the scan in ``LazyFrame.explain()``.
    ``progress`` is the label and the total rows (asked when the bar shows) of
    a progress bar over the rows each query reads, drawn on a terminal only
    (`dataset_rt.progress`); None: none.
    """
    from polars.io.plugins import register_io_source

    def source(
        with_columns: list[str] | None,
        predicate: pl.Expr | None,
        n_rows: int | None,
        batch_size: int | None,
    ) -> Iterator[pl.DataFrame]:
        rows = batch_size or BATCH_ROWS
        left = n_rows
        label, total = progress or ("", lambda: None)
        batches = open_batches(read_columns(schema, with_columns, predicate))
        try:
            with progress_bar(label, total, enabled=progress is not None) as advance:
                for batch in batches:
                    for start in range(0, batch.num_rows, rows):
                        frame = pl.DataFrame(batch.slice(start, rows))
                        if predicate is not None:
                            frame = frame.filter(predicate)
                        if with_columns is not None:
                            frame = frame.select(with_columns)
                        if left is not None:
                            frame = frame.head(left)
                            left -= frame.height
                        yield frame
                        if left is not None and left <= 0:
                            return  # read no further batch
                    advance(batch.num_rows)
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    return register_io_source(
        source, schema=polars_schema(schema), validate_schema=True, explain_name=name
    )


# -- in: a LazyFrame or a Parquet path as an Arrow stream ---------------------------


class StreamedTable:
    """A population produced batch by batch, as an Arrow C stream.

    ``schema`` is known before any batch is produced; every batch is cast to it.
    Iterating `batches` runs the source (once); when the source fails, the
    failure is re-raised as it was and kept in ``error``, so that a consumer that
    met it inside a C stream (where it became an Arrow error) can raise the
    original instead. ``rows`` counts the rows without producing them (a
    progress bar's total), when the source can: None when it cannot.
    """

    def __init__(
        self,
        schema: pa.Schema,
        produce: BatchOpener,
        *,
        nullable: bool = False,
        rows: Callable[[], int] | None = None,
    ) -> None:
        if nullable:
            schema = pa.schema(
                [field.with_nullable(True) for field in schema], metadata=schema.metadata
            )
        self.schema = schema
        self.error: BaseException | None = None
        self._produce = produce
        self._rows = rows

    def rows(self) -> int | None:
        """The rows the source will produce, when it knows without producing
        them (a Parquet path: its footers), else None (a LazyFrame)."""
        return None if self._rows is None else self._rows()

    def batches(self) -> Iterator[pa.RecordBatch]:
        try:
            for batch in self._produce():
                if batch.num_rows:
                    yield batch if batch.schema == self.schema else batch.cast(self.schema)
        except BaseException as error:
            if not isinstance(error, GeneratorExit):
                self.error = error
            raise

    def reader(self) -> pa.RecordBatchReader:
        """The batches as a `pyarrow.RecordBatchReader` (an ``__arrow_c_stream__``)."""
        return pa.RecordBatchReader.from_batches(self.schema, self.batches())

    def raise_source_error(self) -> None:
        """Raise the source's own failure if the stream ended with one."""
        if self.error is not None:
            raise self.error


def streamed(
    table: Any, *, batch_rows: int = BATCH_ROWS, nullable: bool = False
) -> StreamedTable | None:
    """``table`` as a `StreamedTable` when it is a LazyFrame or a Parquet path.

    A ``str`` or `pathlib.Path` names a Parquet file or a directory of Parquet
    files. Anything else (an eager table, any ``__arrow_c_stream__`` object) gives
    None: the caller passes it on as it is. ``nullable`` declares every field of
    the stream nullable (the engine stores populations so anyway).
    """
    if isinstance(table, pl.LazyFrame):
        return _lazy_frame(table, batch_rows, nullable)
    if isinstance(table, (str, Path)):
        return _parquet(Path(table), batch_rows, nullable)
    return None


def hand_over(table: Any, consume: Callable[[Any], T]) -> T:
    """``consume(table)`` for the engine, with a LazyFrame or a Parquet path given
    as an Arrow C stream of its batches (an eager table as it is).

    When the source fails while the engine reads it, the engine's own error
    ("cannot read the Arrow stream") gives way to the source's, and the engine
    has changed nothing: it validates a population only once it has read it all.
    """
    source = streamed(table)
    if source is None:
        return consume(table)
    try:
        return consume(source.reader())
    except Exception:
        source.raise_source_error()
        raise


def _lazy_frame(frame: pl.LazyFrame, batch_rows: int, nullable: bool) -> StreamedTable:
    # The Arrow types of a frame's C stream export, as an eager DataFrame gives them
    # (string_view, dictionaries of categoricals): the engine accepts them alike.
    schema = pa.RecordBatchReader.from_stream(pl.DataFrame(schema=frame.collect_schema())).schema

    def produce() -> Iterator[pa.RecordBatch]:
        for chunk in frame.collect_batches(chunk_size=batch_rows, engine="streaming"):
            yield from pa.RecordBatchReader.from_stream(chunk)

    return StreamedTable(schema, produce, nullable=nullable)


def _parquet(path: Path, batch_rows: int, nullable: bool) -> StreamedTable:
    from dataset_rt.parquet import ParquetScan

    if not path.exists():
        raise FileNotFoundError(f"no Parquet file or directory at {path}")
    scan = ParquetScan(path)

    def produce() -> Iterator[pa.RecordBatch]:
        yield from scan.reader(batch_rows)

    return StreamedTable(scan.schema, produce, nullable=nullable, rows=scan.count_rows)
