"""Issue 23: the Flight server sends large records lent from their mapped shards.

A record of 256 KiB or more goes to gRPC as a buffer over its bytes in the
shard (verified there, no copy), in a batch of its own. What must hold
(`native/src/storage/lend.rs`, docs/architecture.md "Large records over
Flight"):

- every byte a client receives is the record's, exactly;
- a shard cut while its records are out on loan never sends a wrong byte: the
  writer's ``open`` waits on the server's lease until the lent ranges are
  private copies, then the stream either goes on with exact bytes or fails
  with ``INTERNAL`` naming the shard, and the server lives;
- lent ranges leave the server's page tables when gRPC lets go of them, so a
  server that sent a whole cache does not keep it resident.

The server runs as a subprocess (``python -m flight_server``): a crash is seen
as its exit code, and the lease belongs to another process than the writer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.flight as flight
import pytest
from conftest import ListSource, payload, write
from flight.test_server_cli import ServerProcess

import dataset_rt as drt

KIB, MIB = 1 << 10, 1 << 20
WAIT = 60.0  # bounded waits: a lease break takes at most one poll of the server


def server_args(tmp_path: Path, cache: Path) -> list[str]:
    return ["--port", "0", "--state-dir", str(tmp_path / "state"), "--dataset", f"d={cache}"]


def ticket(client: flight.FlightClient, **command: object) -> flight.Ticket:
    body = {"dataset": "d", "seed": 3, "epoch": 0, **command}
    info = client.get_flight_info(flight.FlightDescriptor.for_command(json.dumps(body)))
    [endpoint] = info.endpoints
    return endpoint.ticket


def sizes_of(count: int) -> list[int]:
    """Small and large records mixed: lent and copied ones share a stream."""
    return [300 * KIB if i % 3 else 2 * KIB for i in range(count)]


def test_large_records_arrive_exact_each_in_a_batch_of_its_own(tmp_path: Path) -> None:
    sizes = sizes_of(30)
    records = [drt.CacheInput(payload(i, n), {"label": i}) for i, n in enumerate(sizes)]
    cache = write(tmp_path / "caches", ListSource("mixed", records))
    with ServerProcess(server_args(tmp_path, cache)) as server:
        client = flight.connect(server.location())
        seen = 0
        reader = client.do_get(ticket(client, shuffle=True, epoch_len=200))
        for chunk in reader:
            batch = chunk.data
            ids = batch.column("sample_id").to_pylist()
            blobs = batch.column("payload").to_pylist()
            if any(sizes[i] >= 256 * KIB for i in ids):
                assert len(ids) == 1, f"a large record shares a batch: {ids}"
            for sample_id, blob in zip(ids, blobs, strict=True):
                assert blob == payload(sample_id, sizes[sample_id]), sample_id
            seen += len(ids)
        assert seen == 200
        assert server.process.poll() is None
        client.close()


def test_a_shard_cut_while_records_are_lent_sends_no_wrong_byte(tmp_path: Path) -> None:
    count, size = 48, MIB
    records = [drt.CacheInput(payload(i, size), {"label": i}) for i in range(count)]
    cache = write(tmp_path / "caches", ListSource("lent", records))
    shard = cache / "shard-00000.bin"
    with ServerProcess(server_args(tmp_path, cache)) as server:
        client = flight.connect(server.location())
        options = flight.FlightCallOptions(timeout=WAIT)
        reader = client.do_get(ticket(client, shuffle=True, epoch_len=4000), options)
        exact = 0
        # A few batches in: the server has built (and lent) many more, held
        # by its prefetch and by gRPC's flow control while we do not read.
        for _ in range(4):
            chunk = reader.read_chunk()
            [sample_id] = chunk.data.column("sample_id").to_pylist()
            assert chunk.data.column("payload")[0].as_py() == payload(sample_id, size)
            exact += 1
        # Waits on the server's lease until its loans are private copies.
        with shard.open("r+b") as file:
            file.truncate(4096)
        failure = None
        try:
            for _ in range(4000):
                chunk = reader.read_chunk()
                [sample_id] = chunk.data.column("sample_id").to_pylist()
                blob = chunk.data.column("payload")[0].as_py()
                assert blob == payload(sample_id, size), f"wrong bytes for {sample_id}"
                exact += 1
        except StopIteration:
            pass
        except flight.FlightInternalError as error:
            failure = str(error)
        assert failure is not None, "a stream over the cut shard cannot end cleanly"
        assert "shard-00000.bin" in failure, failure
        assert exact >= 4
        assert server.process.poll() is None, f"the server died; {server.output()}"
        client.close()


def rss_file_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1])
    raise AssertionError("no RssFile line")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_lent_ranges_leave_the_server_resident_set(tmp_path: Path) -> None:
    count, size = 256, MIB
    records = [drt.CacheInput(payload(i % 8, size), {"label": i}) for i in range(count)]
    cache = write(tmp_path / "caches", ListSource("big", records))
    with ServerProcess(server_args(tmp_path, cache)) as server:
        client = flight.connect(server.location())
        for _ in client.do_get(ticket(client, shuffle=False, epoch_len=2)):
            pass  # warm: libraries and the first pages mapped
        before = rss_file_kib(server.pid)
        received = 0
        for chunk in client.do_get(ticket(client, shuffle=False, epoch_len=count)):
            received += chunk.data.num_rows
        assert received == count
        grown_mib = (rss_file_kib(server.pid) - before) / 1024
        # Without giving the pages back this grows by the whole 256 MiB cache.
        assert grown_mib < 64, f"mapped file pages grew by {grown_mib:.0f} MiB"
        client.close()
