"""Scale (issue 20, "billion-sample datasets"): ingest, serve, put and read N rows.

Run from the project root::

    uv run python benchmarks/bench_scale.py                  # 10^6 and 10^7 rows (~2 min)
    uv run python benchmarks/bench_scale.py --rows 1e8       # needs ~16 GB of free disk
    uv run python benchmarks/bench_scale.py --rows 1e9 --max-records 1e7  # ~47 GB
    uv run python benchmarks/bench_scale.py --rows 1e6 --json scale.json

For each row count N, in a scratch directory of its own (removed afterwards; a size
whose estimated disk need passes the free space less 5 GB is skipped with a message):

1. ingest: ``write_arrow`` of min(N, ``--max-records``, default 10^8) records of 8
   bytes (the index) with one int64 column ``label`` = index % 1000, fed as a
   RecordBatchReader of batches made with numpy (the client holds one batch); records/s.
2. server: ``python -m flight_server`` over that cache with a fresh ``--state-dir``:
   seconds until it answers ``list_flights``, and its RssAnon/RssFile (/proc/PID/status).
3. put: a population of N rows (``sample_id`` = i % records, so with fewer records
   than rows each record is in it N / records times; ``label`` the stored value,
   ``weight`` = 1 / (1 + label % 10)) by plain ``pyarrow.flight`` ``do_put`` in
   batches of ``--put-batch-rows`` (default 10^6 rows, 32 MB messages;
   ``flight_client`` sends at most 4 MiB, 131,072 rows of this table); rows/s until
   the PutResult is read, the server's peak RssAnon (sampled every 0.1 s) during the
   put, and its RSS after. ``--put-only`` stops here.
4. time to first batch: 200 ``do_get`` of tickets for random epochs of 4096 shuffled
   positions; p50/p99 ms from ``do_get`` to the first batch, the first time and again
   (the same tickets: the pages they read are then resident).
5. draws: one ids-only stream (``"payload": false``) of min(N, 10^7) positions, rows/s,
   the first time and again (the same epoch: the pages it reads are then resident
   if they fit in the page cache).
6. scan: ``DatasetClient.scan_metadata("scale").filter(label == 3).select(pl.len())``
   over Flight, and in-process (``LocalSource`` on the same store, N <= 10^7); seconds.
7. restart, cold: the server stopped, the page cache of every file of the run
   dropped (``posix_fadvise(DONTNEED)``: as after a reboot, or when the population
   is larger than RAM), the server started again; seconds until it answers, its
   first ``do_get`` of a random epoch (ms), an ids-only stream of min(N, 10^7)
   positions on pages met for the first time (rows/s), and its RssFile after.

Then the server's RSS at the end. Memory is in MiB; ``--json PATH`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import _flight_common as common  # the benchmarks directory is not a package
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.flight as flight

import dataset_rt as drt
from dataset_rt import _native
from dataset_rt.lazy import scan_batches, table_batches
from dataset_rt.loader import LocalSource
from flight_client import DatasetClient

DATASET = "scale"
BATCH, MAX_RECORDS = 10**6, 10**8
MAX_DRAWS = MAX_LOCAL_SCAN = 10**7
TTFB_TICKETS, TTFB_EPOCH_LEN = 200, 4096
RESERVE = 5 * 10**9  # free disk left after a size
# Disk bytes per cache record (61 measured: payload, index, metadata; 32 for the first
# population, 12 of scratch while it is written) and per row put (table 16: label and
# weight, the identities being the rows file's keys; rows file 16; scratch 12), with a
# small margin.
DISK_PER_RECORD, DISK_PER_ROW = 109, 46
T = TypeVar("T")
log = common.make_log("bench_scale")


def timeout_for(rows: int) -> float:
    return 600.0 + rows * 1e-5


def bounded(fn: Callable[[], T], timeout: float, what: str) -> T:
    """``fn()`` in a daemon thread, waited for at most ``timeout`` seconds."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as error:  # raised in the caller
            out.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if not out:
        raise common.BenchError(f"{what}: no answer within {timeout:.0f} s")
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]  # type: ignore[no-any-return]


def rss(pid: int) -> dict[str, float]:
    """RssAnon and RssFile of ``pid`` in MiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return {k: int(fields[f"Rss{k.title()}"].split()[0]) / 1024 for k in ("anon", "file")}


def sample_peak(pid: int) -> Callable[[], float]:
    """Sample the RssAnon of ``pid`` every 0.1 s; the answer stops and gives the peak."""
    peak, done = [0.0], threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            peak[0] = max(peak[0], rss(pid)["anon"])

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()

    def stop() -> float:
        done.set()
        thread.join(5.0)
        return max(peak[0], rss(pid)["anon"])

    return stop


def record_batches(records: int) -> pa.RecordBatchReader:
    """The cache's records: payload = the index's 8 bytes, label = index % 1000."""
    schema = pa.schema([("data", pa.large_binary()), ("label", pa.int64())])

    def batches() -> Iterator[pa.RecordBatch]:
        for start in range(0, records, BATCH):
            index = np.arange(start, min(records, start + BATCH), dtype=np.int64)
            offsets = np.arange(0, (len(index) + 1) * 8, 8, dtype=np.int64)
            buffers = [None, pa.py_buffer(offsets), pa.py_buffer(index)]
            payload = pa.Array.from_buffers(pa.large_binary(), len(index), buffers)
            yield pa.record_batch([payload, pa.array(index % 1000)], schema=schema)

    return pa.RecordBatchReader.from_batches(schema, batches())


def population_batches(
    cache_id: int, records: int, rows: int, batch_rows: int
) -> Iterator[pa.RecordBatch]:
    for start in range(0, rows, batch_rows):
        stop = min(rows, start + batch_rows)
        sample = np.arange(start, stop, dtype=np.uint64) % np.uint64(records)
        label = (sample % np.uint64(1000)).astype(np.int64)
        cache_ids = np.full(len(sample), cache_id, dtype=np.uint64)
        columns = [cache_ids, sample, label, 1.0 / (1 + label % 10)]
        yield pa.record_batch(columns, names=["cache_id", "sample_id", "label", "weight"])


def ingest(base: Path, records: int, workers: int) -> tuple[Path, float]:
    """Write the cache with ``write_arrow``; its path and records/s."""
    runtime, config = drt.DatasetRuntime(num_workers=workers), drt.WriterConfig(show_progress=False)
    started = time.perf_counter()
    written = bounded(
        lambda: runtime.write_arrow(
            record_batches(records),
            base,
            name="scale_v1",
            payload_column="data",
            writer_config=config,
        ),
        timeout_for(records),
        "write_arrow",
    )
    if not isinstance(written, drt.CacheWriteSuccess):
        raise common.BenchError(f"write_arrow failed: {written!r}")
    return Path(written.path), records / (time.perf_counter() - started)


def start_server(cache: Path, state: Path, workdir: Path, records: int) -> tuple[Any, float]:
    command = [sys.executable, "-m", "flight_server", "--port", "0", "--log-level", "WARNING"]
    command += ["--dataset", f"{DATASET}={cache}", "--state-dir", str(state)]
    command += ["--data-dir", str(workdir / "server-data")]
    timeout = common.SERVER_START_TIMEOUT + records * 1e-5
    started = time.perf_counter()
    server = common.ServerProcess.start("scale", command, workdir)
    try:
        client = flight.connect(server.wait_location(timeout))
        options = flight.FlightCallOptions(timeout=timeout)
        names = [info.descriptor.path for info in client.list_flights(options=options)]
        client.close()
        if names != [[DATASET.encode()]]:
            raise common.BenchError(f"the server lists {names}")
    except BaseException:
        server.stop()
        raise
    return server, time.perf_counter() - started


def send_population(
    location: str, batches: Iterator[pa.RecordBatch], rows: int
) -> tuple[dict[str, Any], float]:
    """Put (and activate) ``batches`` by plain ``do_put``: the server's answer
    (its row count checked) and the seconds from the first batch to it."""
    client = flight.connect(location)
    options = flight.FlightCallOptions(timeout=timeout_for(rows))
    descriptor = flight.FlightDescriptor.for_command(json.dumps({"dataset": DATASET}))
    first = next(batches)
    started = time.perf_counter()
    try:
        writer, reader = client.do_put(descriptor, first.schema, options=options)
        writer.write_batch(first)
        for batch in batches:
            writer.write_batch(batch)
        writer.done_writing()
        answer = json.loads(reader.read().to_pybytes())
        writer.close()
    finally:
        client.close()
    if answer["rows"] != rows:
        raise common.BenchError(f"the put stored {answer} for {rows} rows")
    return answer, time.perf_counter() - started


def put(
    location: str, pid: int, cache_id: int, records: int, rows: int, batch_rows: int
) -> dict[str, Any]:
    stop_sampling = sample_peak(pid)
    try:
        batches = population_batches(cache_id, records, rows, batch_rows)
        _, seconds = send_population(location, batches, rows)
    finally:
        peak = stop_sampling()
    return {"put_rows_s": rows / seconds, "put_peak_anon": peak} | {
        f"put_after_{k}": v for k, v in rss(pid).items()
    }


def ticket(**keys: Any) -> flight.Ticket:
    return flight.Ticket(json.dumps({"dataset": DATASET, "seed": common.SEED} | keys).encode())


def first_batch_seconds(client: Any, options: Any, epoch: int) -> float:
    """Seconds from ``do_get`` of a random epoch to its first batch (the rest is read)."""
    started = time.perf_counter()
    reader = client.do_get(ticket(epoch=epoch, epoch_len=TTFB_EPOCH_LEN), options)
    reader.read_chunk()
    seconds = time.perf_counter() - started
    reader.read_all()
    return seconds


def ids_only_draws(client: Any, options: Any, rows: int, epoch: int) -> float:
    """Rows/s of an ids-only stream of min(``rows``, 10^7) positions, its count checked."""
    count = min(rows, MAX_DRAWS)
    started = time.perf_counter()
    reader = client.do_get(ticket(epoch=epoch, epoch_len=count, payload=False), options)
    drawn = sum(chunk.data.num_rows for chunk in reader)
    seconds = time.perf_counter() - started
    if drawn != count:
        raise common.BenchError(f"the ids-only stream gave {drawn} rows, expected {count}")
    return count / seconds


def reads(location: str, rows: int) -> dict[str, Any]:
    """Time to first batch of random epochs, the first time (pages of the mapped
    files met for the first time) and again (the same epochs: pages resident),
    and the rate of an ids-only stream, the first time and again."""
    client = flight.connect(location)
    options = flight.FlightCallOptions(timeout=timeout_for(rows))
    try:
        firsts: dict[str, list[float]] = {"cold": [], "warm": []}
        epochs = np.random.default_rng(common.SEED).integers(0, 2**32, TTFB_TICKETS)
        for times in firsts.values():
            times.extend(first_batch_seconds(client, options, int(epoch)) for epoch in epochs)
        out: dict[str, Any] = {
            f"draws_{kind}rows_s": ids_only_draws(client, options, rows, epoch=0)
            for kind in ("", "warm_")
        }
    finally:
        client.close()
    for kind, times in firsts.items():
        p50, p99 = (float(ms) for ms in np.percentile(np.array(times) * 1000, [50, 99]))
        out |= {f"ttfb_{kind}_p50_ms": p50, f"ttfb_{kind}_p99_ms": p99}
    return out


def scans(location: str, cache: Path, state: Path, rows: int) -> dict[str, Any]:
    """Seconds of the label == 3 count over Flight and in-process (checked)."""
    # label = i % 1000 for row i, as records is rows or 10^8
    expect = max(0, (rows + 996) // 1000)

    def timed(what: str, frame: Callable[[], pl.LazyFrame]) -> float:
        def run() -> float:
            started = time.perf_counter()
            count = frame().filter(pl.col("label") == 3).select(pl.len()).collect().item()
            if count != expect:
                raise common.BenchError(f"{what}: {count} rows of label 3, expected {expect}")
            return time.perf_counter() - started

        return bounded(run, timeout_for(rows), what)

    with DatasetClient(location) as client:
        out = {"scan_flight_s": timed("Flight scan", lambda: client.scan_metadata(DATASET))}
    if rows > MAX_LOCAL_SCAN:
        return out
    started = time.perf_counter()
    table = LocalSource([cache], state, name=DATASET, create=False).service.metadata(None)
    out["scan_local_open_s"] = time.perf_counter() - started
    schema = pa.RecordBatchReader.from_stream(table).schema
    batches = table_batches(table)
    out["scan_local_s"] = timed("local scan", lambda: scan_batches(schema, batches, name="scale"))
    return out


def evict(root: Path) -> None:
    """Drop the page cache of every file under ``root`` (no process maps them)."""
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def restart_cold(
    cache: Path, state: Path, workdir: Path, records: int, rows: int
) -> dict[str, Any]:
    """A server started on pages that are not in memory (see the module's step 7)."""
    evict(workdir)
    server, started = start_server(cache, state, workdir, records)
    try:
        client = flight.connect(server.location)
        options = flight.FlightCallOptions(timeout=timeout_for(rows))
        try:
            first = first_batch_seconds(client, options, epoch=7)
            draws = ids_only_draws(client, options, rows, epoch=1)
        finally:
            client.close()
        return {
            "cold_start_s": started,
            "cold_first_ms": first * 1000,
            "cold_draws_rows_s": draws,
            "cold_file": rss(server.proc.pid)["file"],
        }
    finally:
        server.stop()


def run_size(rows: int, data_dir: Path, args: argparse.Namespace) -> dict[str, Any] | None:
    records = min(rows, int(args.max_records))
    need = records * DISK_PER_RECORD + rows * DISK_PER_ROW
    data_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(data_dir).free
    if need > free - RESERVE:
        gb = f"~{need / 1e9:.0f} GB of disk, {free / 1e9:.0f} GB free, keeping 5 GB"
        print(f"skipping {rows:.0e} rows: needs {gb}", flush=True)
        return None
    result: dict[str, Any] = {"rows": rows, "records": records}
    with common.scratch_dir(data_dir, f"scale-{rows}-") as workdir:
        log(f"{rows:.0e} rows: ingest of {records} records")
        cache, result["ingest_records_s"] = ingest(workdir / "caches", records, args.num_workers)
        cache_id, state = int(_native.inspect_cache(str(cache)).cache_id), workdir / "state"
        server = None
        try:
            log(f"{rows:.0e} rows: server")
            server, result["start_s"] = start_server(cache, state, workdir, records)
            pid = server.proc.pid
            result |= {f"start_{k}": v for k, v in rss(pid).items()}
            log(f"{rows:.0e} rows: put")
            result |= put(server.location, pid, cache_id, records, rows, args.put_batch_rows)
            if args.put_only:
                return result
            log(f"{rows:.0e} rows: reads")
            result |= reads(server.location, rows)
            log(f"{rows:.0e} rows: scans")
            result |= scans(server.location, cache, state, rows)
            result |= {f"end_{k}": v for k, v in rss(pid).items()}
            files = [p for p in workdir.rglob("*") if p.is_file()]
            result["disk_gb"] = sum(p.stat().st_size for p in files) / 1e9
        finally:
            if server is not None:
                server.stop()
                errors = server.stderr.read_text(errors="replace").strip()
                if errors:
                    log(f"server stderr ({rows:.0e} rows):\n{errors[-4000:]}")
        log(f"{rows:.0e} rows: restart, cold")
        result |= restart_cold(cache, state, workdir, records, rows)
    return result


FIGURES = [  # (label, keys shown as "a / b", format)
    ("records", ("records",), "{:,}"),
    ("ingest (records/s)", ("ingest_records_s",), "{:,.0f}"),
    ("server start (s)", ("start_s",), "{:.2f}"),
    ("server RssAnon / RssFile at start (MiB)", ("start_anon", "start_file"), "{:.0f}"),
    ("put (rows/s)", ("put_rows_s",), "{:,.0f}"),
    ("server peak RssAnon during put (MiB)", ("put_peak_anon",), "{:.0f}"),
    ("server RssAnon / RssFile after put (MiB)", ("put_after_anon", "put_after_file"), "{:.0f}"),
    ("first batch p50 / p99, first read (ms)", ("ttfb_cold_p50_ms", "ttfb_cold_p99_ms"), "{:.2f}"),
    ("first batch p50 / p99, again (ms)", ("ttfb_warm_p50_ms", "ttfb_warm_p99_ms"), "{:.2f}"),
    ("ids-only draws, first time (rows/s)", ("draws_rows_s",), "{:,.0f}"),
    ("ids-only draws, again (rows/s)", ("draws_warm_rows_s",), "{:,.0f}"),
    ("scan label == 3, Flight (s)", ("scan_flight_s",), "{:.3f}"),
    ("scan label == 3, in-process (s)", ("scan_local_s",), "{:.3f}"),
    ("server RssAnon / RssFile at end (MiB)", ("end_anon", "end_file"), "{:.0f}"),
    ("restart, cold: server start (s)", ("cold_start_s",), "{:.2f}"),
    ("restart, cold: first batch (ms)", ("cold_first_ms",), "{:.1f}"),
    ("restart, cold: ids-only draws (rows/s)", ("cold_draws_rows_s",), "{:,.0f}"),
    ("restart, cold: server RssFile after (MiB)", ("cold_file",), "{:.0f}"),
    ("disk used at the end (GB)", ("disk_gb",), "{:.2f}"),
]


def cell(result: dict[str, Any], keys: tuple[str, ...], fmt: str) -> str:
    values = [result.get(key) for key in keys]
    return "skipped" if None in values else " / ".join(fmt.format(v) for v in values)


def markdown(results: list[dict[str, Any]]) -> str:
    header = ["rows", *(f"{r['rows']:.0e}" for r in results)]
    lines = [[label, *(cell(r, key, fmt) for r in results)] for label, key, fmt in FIGURES]
    return "\n".join(
        "| " + " | ".join(line) + " |" for line in [header, ["---"] * len(header), *lines]
    )


def parse_rows(text: str) -> list[int]:
    rows = [int(float(part)) for part in text.split(",") if part.strip()]
    if not rows or not all(1 <= n <= 4_294_967_295 for n in rows):
        raise argparse.ArgumentTypeError(f"row counts must be in 1..2^32-1, got {text!r}")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=parse_rows, default=[10**6, 10**7], help="e.g. 1e6,1e7")
    parser.add_argument("--num-workers", type=int, default=2, help="write_arrow's workers")
    parser.add_argument(
        "--max-records",
        type=float,
        default=MAX_RECORDS,
        help="records in the cache at most (1e8); rows past it repeat records",
    )
    parser.add_argument(
        "--put-batch-rows",
        type=lambda text: int(float(text)),
        default=BATCH,
        help="rows per do_put message (1e6: 32 MB; flight_client sends 131072: 4 MiB)",
    )
    parser.add_argument("--put-only", action="store_true", help="stop each size after the put")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures here")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=common.BENCH_DIR / ".bench-data",
        help="where each size's files go (default benchmarks/.bench-data, removed afterwards)",
    )
    args = parser.parse_args()
    if args.put_batch_rows < 1:
        parser.error(f"--put-batch-rows must be at least 1, got {args.put_batch_rows}")
    sizes = [run_size(rows, args.data_dir, args) for rows in args.rows]
    results = [result for result in sizes if result is not None]
    if results:
        print(markdown(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
