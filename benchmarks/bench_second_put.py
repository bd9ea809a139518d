"""A second 10^9-row population put while the first is served (issue 20, deliverable 5).

Run from the project root::

    uv run python benchmarks/bench_second_put.py                    # 10^9 rows, ~53 GB of disk
    uv run python benchmarks/bench_second_put.py --rows 1e7 --records 1e6   # a quick check

In a scratch directory (removed afterwards; refused with a message if the disk lacks the
space, keeping 5 GB):

1. a cache of ``--records`` records of 8 bytes with **no stored column** (so that two
   10^9-row populations and a put's scratch fit on this machine's disk: a population
   then costs its 24 bytes a row of identities, weight and sampler with a Float64
   weight, here 20 with a Float32 one), written by ``write_arrow``;
2. ``python -m flight_server`` on it; population A of ``--rows`` rows (``sample_id`` =
   i % records, ``weight`` = 1 + i % 7 as Float32) put by plain ``do_put`` and
   activated; the server's RssAnon sampled every 0.1 s (peak);
3. while two client threads read ids-only epoch streams of the active population
   without pause, population B (``weight`` = 1 + i % 5) is put and activated; the
   server's RssAnon and RssFile sampled throughout (peaks), the readers' rows/s and
   errors counted (an error fails the run);
4. after B is acknowledged, a new stream is checked to draw from B (its first rows
   differ from A's for the same ticket).

Memory is in MiB (``/proc/PID/status``: RssAnon is the process's own, RssFile the
mapped files' pages, the kernel's to reclaim). ``--json PATH`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _flight_common as common  # the benchmarks directory is not a package
import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
from bench_scale import (
    RESERVE,
    bounded,
    parse_rows,
    rss,
    send_population,
    start_server,
    ticket,
    timeout_for,
)

import dataset_rt as drt
from dataset_rt import _native

log = common.make_log("bench_second_put")
BATCH = 1 << 20
READERS = 2
READ_LEN = 1 << 20  # positions per reader stream
# Disk bytes per record (payload, index, metadata, with a margin) and per row of the
# two populations together (rows files 16 + 16, weights 4 + 4) and one put's scratch
# (weights 8, the alias builder's lists 4).
DISK_PER_RECORD, DISK_PER_ROW = 80, 2 * 20 + 12


def cache_batches(records: int) -> pa.RecordBatchReader:
    """Records of 8 bytes (the index), no metadata column."""
    schema = pa.schema([("data", pa.large_binary())])

    def batches() -> Iterator[pa.RecordBatch]:
        for start in range(0, records, BATCH):
            index = np.arange(start, min(records, start + BATCH), dtype=np.int64)
            offsets = np.arange(0, (len(index) + 1) * 8, 8, dtype=np.int64)
            buffers = [None, pa.py_buffer(offsets), pa.py_buffer(index)]
            yield pa.record_batch(
                [pa.Array.from_buffers(pa.large_binary(), len(index), buffers)], schema=schema
            )

    return pa.RecordBatchReader.from_batches(schema, batches())


def population(cache_id: int, records: int, rows: int, modulus: int) -> Iterator[pa.RecordBatch]:
    for start in range(0, rows, BATCH):
        index = np.arange(start, min(rows, start + BATCH), dtype=np.uint64)
        columns = [
            np.full(len(index), cache_id, dtype=np.uint64),
            index % np.uint64(records),
            (1 + index % np.uint64(modulus)).astype(np.float32),
        ]
        yield pa.record_batch(columns, names=["cache_id", "sample_id", "weight"])


class Sampler:
    """RssAnon and RssFile of ``pid`` every 0.1 s, peaks kept, until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, {"anon": 0.0, "file": 0.0}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.done.wait(0.1):
            self.take()

    def take(self) -> None:
        now = rss(self.pid)
        for key in self.peak:
            self.peak[key] = max(self.peak[key], now[key])

    def stop(self) -> dict[str, float]:
        self.done.set()
        self.thread.join(5.0)
        self.take()
        return self.peak


def put(location: str, batches: Iterator[pa.RecordBatch], rows: int) -> tuple[str, float]:
    """Put and activate ``batches``; the population id and rows/s."""
    answer, seconds = send_population(location, batches, rows)
    return str(answer["population"]), rows / seconds


def first_rows(location: str) -> list[int]:
    """The first sample ids of epoch 0's ids-only stream of the active population."""
    client = flight.connect(location)
    try:
        options = flight.FlightCallOptions(timeout=60.0)
        reader = client.do_get(ticket(epoch=0, epoch_len=4096, payload=False), options)
        return [int(v) for v in reader.read_chunk().data.column("sample_id")[:64].to_pylist()]
    finally:
        client.close()


def read_while(location: str, stop: threading.Event, seconds: float) -> dict[str, Any]:
    """Ids-only streams of the active population on ``READERS`` threads until
    ``stop`` (or ``seconds``): rows read and errors."""
    counts, errors = [0] * READERS, []

    def reader(k: int) -> None:
        client = flight.connect(location)
        options = flight.FlightCallOptions(timeout=120.0)
        epoch = 1000 * k
        deadline = time.monotonic() + seconds
        try:
            while not stop.is_set() and time.monotonic() < deadline:
                epoch += 1
                stream = client.do_get(
                    ticket(epoch=epoch, epoch_len=READ_LEN, payload=False), options
                )
                read = sum(chunk.data.num_rows for chunk in stream)
                if read != READ_LEN:
                    errors.append(f"stream of epoch {epoch} gave {read} rows")
                counts[k] += read
        except Exception as error:  # counted, and fails the run
            errors.append(f"{type(error).__name__}: {error}")
        finally:
            client.close()

    threads = [threading.Thread(target=reader, args=(k,), daemon=True) for k in range(READERS)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    return {"threads": threads, "counts": counts, "errors": errors, "started": started}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=parse_rows, default=[10**9], help="rows a population")
    parser.add_argument("--records", type=float, default=1e7, help="records of the cache")
    parser.add_argument(
        "--data-dir", type=Path, default=Path(__file__).parent / ".bench-data" / "second-put"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures here")
    args = parser.parse_args()
    rows, records = args.rows[0], int(args.records)
    need = records * DISK_PER_RECORD + rows * DISK_PER_ROW
    args.data_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(args.data_dir).free
    if need > free - RESERVE:
        raise SystemExit(f"needs ~{need / 1e9:.0f} GB of disk, {free / 1e9:.0f} GB free")
    result: dict[str, Any] = {"rows": rows, "records": records}
    with common.scratch_dir(args.data_dir, "second-put-") as workdir:
        log(f"ingest of {records} records")
        runtime = drt.DatasetRuntime(num_workers=2)
        written = bounded(
            lambda: runtime.write_arrow(
                cache_batches(records),
                workdir / "caches",
                name="second_put",
                payload_column="data",
                writer_config=drt.WriterConfig(show_progress=False),
            ),
            timeout_for(records),
            "write_arrow",
        )
        if not isinstance(written, drt.CacheWriteSuccess):
            raise common.BenchError(f"write_arrow failed: {written!r}")
        cache = Path(written.path)
        cache_id = int(_native.inspect_cache(str(cache)).cache_id)
        server, _ = start_server(cache, workdir / "state", workdir, records)
        try:
            pid = server.proc.pid
            log(f"put A, {rows:.0e} rows")
            sampler = Sampler(pid)
            result["id_a"], result["put_a_rows_s"] = put(
                server.location, population(cache_id, records, rows, 7), rows
            )
            result["put_a_peak"] = sampler.stop()
            result["serving_a"] = rss(pid)
            rows_a = first_rows(server.location)

            log(f"put B, {rows:.0e} rows, while A is read")
            stop = threading.Event()
            readers = read_while(server.location, stop, timeout_for(rows))
            time.sleep(2.0)  # the readers are streaming before the put starts
            sampler = Sampler(pid)
            try:
                result["id_b"], result["put_b_rows_s"] = put(
                    server.location, population(cache_id, records, rows, 5), rows
                )
            finally:
                result["put_b_peak"] = sampler.stop()
                stop.set()
                for thread in readers["threads"]:
                    thread.join(timeout_for(rows))
            seconds = time.perf_counter() - readers["started"]
            result["read_rows_s"] = sum(readers["counts"]) / seconds
            result["read_errors"] = readers["errors"]
            result["serving_b"] = rss(pid)
            rows_b = first_rows(server.location)
            result["draws_from_b"] = rows_b != rows_a
            files = [p for p in workdir.rglob("*") if p.is_file()]
            result["disk_gb"] = sum(p.stat().st_size for p in files) / 1e9
        finally:
            server.stop()
            errors = server.stderr.read_text(errors="replace").strip()
            if errors:
                log(f"server stderr:\n{errors[-4000:]}")
    mib = "{anon:.0f} / {file:.0f}".format
    print(f"| {rows:.0e} rows over {records:,} records | |")
    print("| --- | --- |")
    print(f"| put A + activation (rows/s) | {result['put_a_rows_s']:,.0f} |")
    print(f"| server peak RssAnon / RssFile during put A (MiB) | {mib(**result['put_a_peak'])} |")
    print(f"| server RssAnon / RssFile serving A (MiB) | {mib(**result['serving_a'])} |")
    print(f"| put B + activation while A is read (rows/s) | {result['put_b_rows_s']:,.0f} |")
    print(f"| server peak RssAnon / RssFile during put B (MiB) | {mib(**result['put_b_peak'])} |")
    reads = f"{result['read_rows_s']:,.0f}"
    print(f"| ids-only reads during put B, {READERS} clients (rows/s) | {reads} |")
    print(f"| read errors | {len(result['read_errors'])} |")
    print(f"| server RssAnon / RssFile serving B (MiB) | {mib(**result['serving_b'])} |")
    print(f"| new streams draw from B | {result['draws_from_b']} |")
    print(f"| disk used with both populations (GB) | {result['disk_gb']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if result["read_errors"] or not result["draws_from_b"]:
        print("FAILED:", result["read_errors"][:5])
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
