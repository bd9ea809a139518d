"""Parquet files read batch by batch in bounded memory: the one scan behind every
Parquet path the library takes (`DatasetRuntime.write_arrow` and ``python -m
dataset_rt import``, and populations put from a path: `dataset_rt.lazy.streamed`).

The scan runs without pre-buffering: pyarrow's default keeps every column chunk
it read until the file is closed, so reading one large file held the whole file
(apache/arrow#39808); on a local disk, reading as the batches are decoded is
faster too. Batches are decoded on the thread that reads the stream (the engine
reads one batch ahead of its writer on a thread of its own), without read-ahead:
one row group in memory at a time.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads


class ParquetScan:
    """A Parquet file or a directory of Parquet files, read batch by batch.

    Opening reads the files' footers only; `count_rows` answers from them too.
    """

    def __init__(self, path: Path) -> None:
        options = pads.ParquetFragmentScanOptions(pre_buffer=False)
        parquet = pads.ParquetFileFormat(default_fragment_scan_options=options)
        self._dataset = pads.dataset(path, format=parquet)

    @property
    def schema(self) -> pa.Schema:
        return self._dataset.schema

    def count_rows(self) -> int:
        """The rows of every file, from their footers (nothing is decoded)."""
        return int(self._dataset.count_rows())

    def reader(self, batch_size: int) -> pa.RecordBatchReader:
        """A fresh scan of every row, in batches of at most ``batch_size`` rows."""
        scanner = self._dataset.scanner(
            batch_size=batch_size, use_threads=False, batch_readahead=1, fragment_readahead=1
        )
        return scanner.to_reader()
