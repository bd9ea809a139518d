"""Many clients at once, puts during streams, abandoned streams, bounded batches.

Every thread pool is small and every wait has a deadline, so a hang fails the
test instead of stalling the run.
"""

from __future__ import annotations

import gc
import hashlib
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from conftest import ListSource, make_records, payload

import dataset_rt as drt
from flight_client import DatasetClient
from flight_server import Catalog, DatasetFlightServer, DatasetSpec

from .conftest import (
    DATASET,
    act,
    active,
    command,
    ids,
    metadata,
    put,
    reweighted,
    serve,
    stream,
    ticket,
)

WAIT = 60.0  # seconds any one concurrent job may take
SEED = 7


def epoch_ticket(**fields: Any) -> dict[str, Any]:
    return {"dataset": DATASET, "seed": SEED, "epoch": 0} | fields


def fingerprint(table: pa.Table) -> tuple[list[tuple[int, int]], list[int], str]:
    """Identities, positions and a digest of the payloads, in stream order."""
    digest = hashlib.sha256()
    for value in table.column("payload").to_pylist():
        digest.update(len(value).to_bytes(8, "little"))
        digest.update(value)
    return ids(table), table.column("position").to_pylist(), digest.hexdigest()


def test_concurrent_clients_get_what_a_lone_client_gets(
    server: DatasetFlightServer, raw: flight.FlightClient
) -> None:
    jobs = [
        epoch_ticket(epoch=0, epoch_len=1500),
        epoch_ticket(epoch=1, epoch_len=1500),
        epoch_ticket(epoch=2, epoch_len=1500, shuffle=False, columns=["name"]),
        epoch_ticket(epoch=3, epoch_len=1500, world_size=2, rank=1),
        epoch_ticket(seed=99, epoch=0, epoch_len=1500, columns=["label", "score"]),
        epoch_ticket(epoch=1, epoch_len=1500),  # the same as job 1, at the same time
    ]
    alone = [fingerprint(stream(raw, job)) for job in jobs]
    start = threading.Barrier(len(jobs), timeout=WAIT)

    def run(job: dict[str, Any]) -> tuple[list[tuple[int, int]], list[int], str]:
        with flight.connect(server.location) as own:
            start.wait()
            options = flight.FlightCallOptions(timeout=WAIT)
            return fingerprint(own.do_get(ticket(job), options=options).read_all())

    for _ in range(2):
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            futures = [pool.submit(run, job) for job in jobs]
            together = [future.result(timeout=WAIT) for future in futures]
        for index, (got, expected) in enumerate(zip(together, alone, strict=True)):
            assert got == expected, f"job {index} differs when streamed concurrently"
    assert act(raw, "health")["status"] == "ok"


def test_concurrent_friendly_clients_iterate_their_ranks(server: DatasetFlightServer) -> None:
    """DatasetClient ranks streamed in threads together cover the epoch exactly once."""
    world_size, length = 4, 1000

    def rank_positions(rank: int) -> list[int]:
        with DatasetClient(server.location) as own:
            share = drt.Partition(rank=rank, world_size=world_size)
            samples = own.epoch(DATASET, SEED, 5, partition=share, epoch_len=length)
            return [sample.position for sample in samples]

    with ThreadPoolExecutor(max_workers=world_size) as pool:
        futures = [pool.submit(rank_positions, rank) for rank in range(world_size)]
        parts = [future.result(timeout=WAIT) for future in futures]
    assert [len(p) for p in parts] == [length // world_size] * world_size
    assert sorted(p for part in parts for p in part) == list(range(5 * length, 6 * length))


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned-ticket", "active-ticket"])
def test_put_during_a_stream_does_not_change_it(catalog: Catalog, pinned: bool) -> None:
    """A do_put (and set_epoch_len) while a stream is in flight leaves that stream as
    it started; streams opened afterwards see the new population."""
    with serve(catalog, batch_size=64) as small, flight.connect(small.location) as plain:
        act(plain, "set_epoch_len", {"dataset": DATASET, "epoch_len": 4000})
        original = active(plain)["population"]
        if pinned:
            info = plain.get_flight_info(command(epoch_ticket(epoch=2)))
            body: Any = info_ticket(info)
        else:
            body = epoch_ticket(epoch=2)  # no population, no epoch_len: the active ones
        expected = stream(plain, body)
        reader = plain.do_get(ticket(body))
        batches = [reader.read_chunk().data]
        with ThreadPoolExecutor(max_workers=1) as pool:
            table = reweighted(metadata(plain))
            answer = pool.submit(put, plain, table).result(timeout=WAIT)
            pool.submit(act, plain, "set_epoch_len", {"dataset": DATASET, "epoch_len": 10}).result(
                timeout=WAIT
            )
        assert active(plain)["population"] == answer["population"]
        batches += [chunk.data for chunk in reader]
        assert len(batches) > 2, "the stream should span many batches"
        got = pa.Table.from_batches(batches)
        assert fingerprint(got) == fingerprint(expected)
        # Streams opened now see the new population and epoch length.
        after = ids(stream(plain, epoch_ticket(epoch=2)))
        new = epoch_ticket(epoch=2, epoch_len=10, population=answer["population"])
        old = epoch_ticket(epoch=2, epoch_len=10, population=original)
        assert after == ids(stream(plain, new))
        assert after != ids(stream(plain, old))


def test_concurrent_puts_all_land_and_one_is_active(server: DatasetFlightServer) -> None:
    """Racing do_puts of different tables: every one is stored, the active one is one of
    them, and the metadata behind each id is the table that was put."""
    with flight.connect(server.location) as plain:
        base = metadata(plain)
    tables = [base.filter(pl.col("sample_id") % 5 != k) for k in range(5)]

    def put_one(table: pl.DataFrame) -> dict[str, Any]:
        with flight.connect(server.location) as own:
            return put(own, table)

    with ThreadPoolExecutor(max_workers=len(tables)) as pool:
        answers = [f.result(timeout=WAIT) for f in [pool.submit(put_one, t) for t in tables]]
    ids_by_table = [a["population"] for a in answers]
    assert len(set(ids_by_table)) == len(tables)
    with flight.connect(server.location) as plain:
        state = act(plain, "list_populations", {"dataset": DATASET})
        assert set(ids_by_table) <= set(state["populations"])
        winner = ids_by_table.index(state["active"]["population"])
        assert state["active"]["rows"] == tables[winner].height
        assert state["active"]["epoch_len"] == tables[winner].height
        assert metadata(plain).equals(tables[winner])
        for population, table in zip(ids_by_table, tables, strict=True):
            assert metadata(plain, population).equals(table)


def info_ticket(info: flight.FlightInfo) -> bytes:
    return bytes(info.endpoints[0].ticket.ticket)


def rows_sent(plain: flight.FlightClient) -> int:
    return int(act(plain, "stats")[DATASET]["rows_sent"])


LEAVER = """
import os, sys
import pyarrow.flight as flight
client = flight.connect(sys.argv[1])
reader = client.do_get(flight.Ticket(sys.argv[2].encode()))
print(reader.read_chunk().data.num_rows, flush=True)
os._exit(0)  # vanish mid-stream: no cancel, no close
"""


def abandon(location: str, body: dict[str, Any], how: str) -> None:
    """Open a stream, read one batch and go away (cancel, close, or process exit)."""
    if how == "process-exit":
        done = subprocess.run(
            [sys.executable, "-c", LEAVER, location, json.dumps(body)],
            capture_output=True,
            text=True,
            timeout=WAIT,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert int(done.stdout) > 0
        return
    leaver = flight.connect(location)
    reader = leaver.do_get(ticket(body))
    assert reader.read_chunk().data.num_rows > 0
    if how == "cancel":
        reader.cancel()
    leaver.close()
    del reader, leaver
    gc.collect()


@pytest.mark.parametrize("how", ["cancel", "close-client", "process-exit"])
def test_abandoned_stream_frees_the_server(catalog: Catalog, how: str) -> None:
    """A client that reads one batch of a huge epoch and goes away does not hang the
    server: it keeps answering, stops producing, and shuts down promptly."""
    epoch_len = 1_000_000  # ~1.5 GB of payloads: never read to the end
    with serve(catalog, shutdown_timeout=20.0) as server:
        watcher = flight.connect(server.location)
        quick = flight.FlightCallOptions(timeout=10.0)
        try:
            abandon(server.location, epoch_ticket(epoch_len=epoch_len), how)

            # The server keeps answering within seconds.
            health = list(watcher.do_action(flight.Action("health", b""), options=quick))
            assert b'"ok"' in health[0].body.to_pybytes()
            fresh = watcher.do_get(ticket(epoch_ticket(epoch=3, epoch_len=200)), options=quick)
            assert fresh.read_all().num_rows == 200

            # The abandoned stream stops: rows_sent settles well short of the epoch.
            settled = None
            deadline = time.monotonic() + 15.0
            previous = rows_sent(watcher)
            while time.monotonic() < deadline:
                time.sleep(0.5)
                current = rows_sent(watcher)
                if current == previous:
                    settled = current
                    break
                previous = current
            assert settled is not None, "the abandoned stream keeps producing rows"
            assert settled < epoch_len // 2

            # And nothing keeps working in the background (bounded queues, polled cancel).
            cpu = time.process_time()
            time.sleep(1.0)
            busy = time.process_time() - cpu
            assert busy < 0.5, f"the process used {busy:.2f} s of CPU while idle"
            assert rows_sent(watcher) == settled
            assert "streams" in act(watcher, "stats")[DATASET]
        finally:
            watcher.close()


BIG_PAYLOAD = 1 << 20
BIG_RECORDS = 12


def test_batches_stay_within_a_few_mib(tmp_path: Path, runtime: drt.DatasetRuntime) -> None:
    records = [
        drt.CacheInput(data=payload(i, BIG_PAYLOAD, seed=5), metadata=record.metadata)
        for i, record in enumerate(make_records(BIG_RECORDS))
    ]
    config = drt.WriterConfig(show_progress=False)
    (result,) = runtime.write_cache(ListSource("big", records), tmp_path, writer_config=config)
    assert isinstance(result, drt.CacheWriteSuccess), result
    catalog = Catalog([DatasetSpec("big", (result.path,))], tmp_path / "state", runtime)
    with serve(catalog) as server, flight.connect(server.location) as plain:
        body = {"dataset": "big", "seed": 1, "epoch": 0, "epoch_len": 3 * BIG_RECORDS}
        sizes: list[int] = []
        rows = 0
        for shuffle in (False, True):
            reader = plain.do_get(ticket(body | {"shuffle": shuffle}))
            for chunk in reader:
                batch = chunk.data
                sizes.append(batch.nbytes)
                rows += batch.num_rows
                for sample_id, data in zip(
                    batch.column("sample_id").to_pylist(),
                    batch.column("payload").to_pylist(),
                    strict=True,
                ):
                    assert data == payload(sample_id, BIG_PAYLOAD, seed=5)
        assert rows == 2 * 3 * BIG_RECORDS
        assert max(sizes) <= 8 << 20, f"a batch of {max(sizes) / 2**20:.1f} MiB"
