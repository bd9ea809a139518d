"""The native stream a server watches (`BatchStream.progress`, `.cancel`): what the
stream slots read instead of running Python per batch (docs/architecture.md)."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

from dataset_rt import service as engine
from flight_server import Catalog

from .conftest import DATASET


def open_stream(catalog: Catalog, epoch_len: int, **keys: object) -> engine.BatchStream:
    service = catalog.get(DATASET)
    request = service.pin(
        engine.StreamRequest(dataset=DATASET, seed=3, epoch=0, epoch_len=epoch_len, **keys)
    )
    return service.stream(request, batch_size=10)


def test_progress_counts_what_the_reader_received(catalog: Catalog) -> None:
    stream = open_stream(catalog, 35)
    before = stream.progress()
    assert (before.rows, before.bytes, before.first_batch_seconds) == (0, 0, None)
    assert before.idle_seconds is not None  # a client that never reads is idle from the start
    reader = pa.RecordBatchReader.from_stream(stream)
    first = reader.read_next_batch()
    time.sleep(0.05)
    held = stream.progress()
    assert (held.rows, held.bytes) == (first.num_rows, first.nbytes)
    assert held.first_batch_seconds is not None
    assert held.first_batch_seconds >= 0
    assert held.idle_seconds is not None
    assert held.idle_seconds >= 0.05
    rest = reader.read_all()
    done = stream.progress()
    assert done.rows == 35 == first.num_rows + rest.num_rows
    assert done.bytes == first.nbytes + sum(b.nbytes for b in rest.to_batches())


def test_cancel_ends_the_stream_from_another_holder(catalog: Catalog) -> None:
    stream = open_stream(catalog, 1000)
    reader = pa.RecordBatchReader.from_stream(stream)
    reader.read_next_batch()
    stream.cancel()
    with pytest.raises(pa.ArrowException, match="cancelled"):
        reader.read_next_batch()
    stream.raise_failure()  # a cancel is not a failure of the stream
    assert stream.progress().rows == 10


def test_a_stream_is_read_once(catalog: Catalog) -> None:
    stream = open_stream(catalog, 5)
    pa.RecordBatchReader.from_stream(stream).read_all()
    with pytest.raises(Exception, match="already consumed"):
        pa.RecordBatchReader.from_stream(stream)


def test_the_metadata_stream_is_watched_alike(catalog: Catalog) -> None:
    service = catalog.get(DATASET)
    stream = service.metadata_stream()
    table = pa.RecordBatchReader.from_stream(stream).read_all()
    assert table.num_rows == service.active().rows
    assert stream.progress().rows == table.num_rows
