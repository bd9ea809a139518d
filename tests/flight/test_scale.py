"""Issue 20's scale test (``-m slow``, run by CI): a 10^8-row population.

A cache of 10^8 records is written by columnar ingest (record batches, no Python
object per record), served by a real ``python -m flight_server``, reweighted
lazily over Flight (``scan_metadata`` -> a row-local Polars expression ->
``update_metadata``, never collected) and an epoch is read from it. The server's
anonymous memory is sampled from ``/proc/PID/status`` throughout and must stay
under 1 GiB: a population is files the server maps, and every operation streams.
File-backed pages (the mapped caches and populations) are the kernel's to reclaim
and are reported, not bounded.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import dataset_rt as drt
from flight_client import DatasetClient

from .test_server_cli import ServerProcess

RECORDS = 100_000_000
BATCH = 1_000_000
ANON_BOUND_MIB = 1024
#: cache (~64 bytes a small record) + two populations (table + rows file) + scratch
DISK_NEEDED = 40 * 2**30


def status(pid: int) -> dict[str, int]:
    """``VmHWM``, ``RssAnon``, ``RssFile`` of ``pid`` in MiB."""
    text = Path(f"/proc/{pid}/status").read_text()
    return {
        key: int(re.search(rf"^{key}:\s+(\d+) kB", text, re.M).group(1)) // 1024  # type: ignore[union-attr]
        for key in ("VmHWM", "RssAnon", "RssFile")
    }


class PeakAnon:
    """Samples a process's RssAnon every 50 ms in a thread; ``peak`` in MiB."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, status(self.pid)["RssAnon"])
            except (OSError, AttributeError):
                return
            self._stop.wait(0.05)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.peak


def records() -> Iterator[pa.RecordBatch]:
    """10^8 records of 8 bytes (the index) with ``label = index % 1000``, batch by batch."""
    for start in range(0, RECORDS, BATCH):
        index = np.arange(start, start + BATCH, dtype=np.int64)
        payload = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(8), BATCH, [None, pa.py_buffer(index.tobytes())]
        ).cast(pa.binary())
        yield pa.record_batch({"data": payload, "label": index % 1000})


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_hundred_million_row_population_is_served_in_flat_memory(tmp_path: Path) -> None:
    if shutil.disk_usage(tmp_path).free < DISK_NEEDED:
        pytest.skip(f"needs {DISK_NEEDED >> 30} GiB of free disk under {tmp_path}")
    schema = pa.schema({"data": pa.binary(), "label": pa.int64()})
    runtime = drt.DatasetRuntime(num_workers=2)
    written = runtime.write_arrow(
        pa.RecordBatchReader.from_batches(schema, records()),
        tmp_path / "caches",
        name="big",
        payload_column="data",
        writer_config=drt.WriterConfig(show_progress=False),
    )
    assert isinstance(written, drt.CacheWriteSuccess), written
    args = ["--dataset", f"big={written.path}", "--state-dir", str(tmp_path / "state")]
    with ServerProcess([*args, "--port", "0", "--log-level", "WARNING"]) as server:
        location = server.location(timeout=600)
        at_start = status(server.pid)
        peak = PeakAnon(server.pid)
        with DatasetClient(location) as client:
            assert client.populations("big")["active"]["rows"] == RECORDS
            reweighted = client.scan_metadata("big").with_columns(
                (1.0 / (1 + pl.col("label") % 10)).alias("weight")
            )
            client.update_metadata("big", reweighted)
            assert client.populations("big")["active"]["rows"] == RECORDS
            after_put = status(server.pid)
            ticket = {"dataset": "big", "seed": 3, "epoch": 1, "epoch_len": 5_000_000}
            reader = flight.connect(location).do_get(flight.Ticket(json.dumps(ticket).encode()))
            rows, labels = 0, np.zeros(10, dtype=np.int64)
            for chunk in reader:
                batch = chunk.data
                rows += batch.num_rows
                ids = batch.column("sample_id").to_numpy()
                np.add.at(labels, ids % 1000 % 10, 1)
                payload = np.frombuffer(
                    batch.column("payload").buffers()[2], dtype=np.int64, count=batch.num_rows
                )
                assert (payload == ids.astype(np.int64)).all()
        anon_peak = peak.stop()
        end = status(server.pid)
    print(
        f"server MiB: start anon {at_start['RssAnon']} file {at_start['RssFile']}; after "
        f"the put anon {after_put['RssAnon']} file {after_put['RssFile']}; at the end anon "
        f"{end['RssAnon']} file {end['RssFile']} VmHWM {end['VmHWM']}; peak anon {anon_peak}"
    )
    assert rows == 5_000_000
    # weight 1 / (1 + label % 10): class k is drawn with probability (1/(1+k)) / H_10
    shares = labels / rows
    expected = np.array([1 / (1 + k) for k in range(10)])
    expected /= expected.sum()
    assert np.abs(shares - expected).max() < 0.002
    assert anon_peak < ANON_BOUND_MIB, f"peak RssAnon {anon_peak} MiB"
