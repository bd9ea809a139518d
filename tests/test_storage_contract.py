"""The storage contract, one suite for every backend (issue 46, deliverable 2).

Every test here runs twice: against a state directory, and against a real
S3-compatible store (the session's Ceph radosgw, tests/ceph_s3.py), with
replicas that share nothing but the store (each has its own mirror). The engine
runs one code path for both (`native/src/remote.rs`, `Bucket`); this suite is
what holds it to one contract:

- an update is all or nothing: a refused table adds nothing to the store;
- of concurrent activations each gets its own entry, and exactly one wins each
  round (no acknowledged activation is lost or overwritten);
- the last acknowledged activation is the active one, on every replica;
- published objects are never rewritten;
- a writer killed at any point leaves a store that opens on an acknowledged
  population (or the one in flight), and serves;
- damaged or hostile log entries are skipped, never fatal.

The store is inspected through `Backend`, which reads the directory or the bucket
without the engine (boto3 for the bucket).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from activations import contender_script
from conftest import ListSource, make_records, write

import dataset_rt as drt
from dataset_rt.service import DatasetService, StreamRequest

N = 12
NAME = "contract"
WAIT_SECONDS = 60.0
FRESHNESS = 1.0  # Bucket::freshness on object storage (a directory: 0)


@dataclass
class Backend:
    """One store: where it is, how to open a replica on it, how to read it raw."""

    kind: str
    location: str
    root: Path  # scratch for mirrors and helpers
    s3: Any = None
    bucket: str = ""
    replicas: int = field(default=0)

    def replica(self, runtime: drt.DatasetRuntime, cache: Path) -> DatasetService:
        self.replicas += 1
        mirror = self.root / f"mirror-{self.replicas}"
        return DatasetService(
            runtime.native, NAME, [str(cache)], self.location, mirror_dir=str(mirror)
        )

    def replica_args(self, cache: Path) -> list[str]:
        """What a child process needs to open a replica of its own."""
        self.replicas += 1
        return [str(cache), self.location, str(self.root / f"mirror-{self.replicas}")]

    def objects(self) -> dict[str, bytes]:
        """Every object of the store, by name below the location, with its bytes."""
        if self.s3 is None:
            base = Path(self.location)
            return {
                str(p.relative_to(base)): p.read_bytes()
                for p in sorted(base.rglob("*"))
                if p.is_file() and not p.name.startswith(".tmp-") and p.name != "active.lock"
            }
        found: dict[str, bytes] = {}
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
            for item in page.get("Contents", []):
                body = self.s3.get_object(Bucket=self.bucket, Key=item["Key"])["Body"].read()
                found[item["Key"].split("/", 1)[1]] = body
        return found

    def log(self) -> list[str]:
        """The activation log's entry names (20 digits), in order."""
        return sorted(n for n in self.objects() if re.search(r"(^|/)active/\d{20}\.json$", n))

    def put(self, name: str, body: bytes) -> None:
        """Write an object as anyone with write access could (not through the engine)."""
        if self.s3 is None:
            path = Path(self.location) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body)
        else:
            self.s3.put_object(Bucket=self.bucket, Key=f"state/{name}", Body=body)


@pytest.fixture(params=["directory", "radosgw"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "directory":
        yield Backend("directory", str(tmp_path / "state"), tmp_path)
        return
    ceph = request.getfixturevalue("ceph")
    monkeypatch = request.getfixturevalue("monkeypatch")
    for key, value in ceph.environment().items():
        monkeypatch.setenv(key, value)
    boto3 = pytest.importorskip("boto3")
    env = ceph.environment()
    s3 = boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_REGION"],
    )
    bucket = f"drt-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    yield Backend("radosgw", f"s3://{bucket}/state", tmp_path, s3, bucket)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("contract"), ListSource("pop", make_records(N)))


def weighted(service: DatasetService, weight: float) -> pa.Table:
    table = pa.table(service.metadata())
    at = table.schema.get_field_index("weight")
    return table.set_column(at, "weight", pa.array([weight] * table.num_rows, pa.float64()))


def epoch(service: DatasetService) -> pa.Table:
    request = service.pin(StreamRequest(dataset=NAME, seed=3, epoch=0))
    return pa.RecordBatchReader.from_stream(service.stream(request.for_rank(0))).read_all()


def wait_for_active(service: DatasetService, population: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while service.active().population != population:
        assert time.monotonic() < deadline, f"{population} never became active"
        time.sleep(0.05)


def population_of(entry: bytes) -> str:
    return str(json.loads(entry)["population"])


# -- all or nothing ---------------------------------------------------------------


def test_a_refused_update_adds_nothing(
    backend: Backend, runtime: drt.DatasetRuntime, cache: Path
) -> None:
    service = backend.replica(runtime, cache)
    before, objects = service.active().population, backend.objects()
    bad = weighted(service, -1.0)
    with pytest.raises(drt.InvalidPopulationError, match="weight"):
        service.put(bad, True)
    assert backend.objects() == objects, "nothing was published or logged"
    assert service.active().population == before


# -- concurrent activations -------------------------------------------------------

CONTENDER = contender_script(NAME)


def test_concurrent_activations_each_get_their_own_entry_and_one_wins_each_round(
    backend: Backend, runtime: drt.DatasetRuntime, cache: Path
) -> None:
    first = backend.replica(runtime, cache)  # the store exists with its first entry
    count = 6
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                CONTENDER,
                *backend.replica_args(cache),
                str(10 + 100 * i),
                str(count),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        acknowledged = []
        for proc in procs:
            out, _ = proc.communicate(timeout=WAIT_SECONDS * 2)
            assert proc.returncode == 0
            acknowledged += [json.loads(line) for line in out.split()]
    finally:
        for proc in procs:
            proc.kill()
    objects = backend.objects()
    log = backend.log()
    assert len(log) == 1 + 2 * count, log
    logged = [population_of(objects[name]) for name in log[1:]]
    assert sorted(logged) == sorted(acknowledged), "every acknowledged activation, once"
    wait_for_active(first, logged[-1])
    assert backend.replica(runtime, cache).active().population == logged[-1]


# -- last acknowledged ------------------------------------------------------------


def test_the_last_acknowledged_activation_is_active_on_every_replica(
    backend: Backend, runtime: drt.DatasetRuntime, cache: Path
) -> None:
    a, b = backend.replica(runtime, cache), backend.replica(runtime, cache)
    last = ""
    for i in range(4):
        writer = (a, b)[i % 2]
        last, _ = writer.put(weighted(writer, 2.0 + i), True)
        assert writer.active().population == last, "at once on the replica that activated"
    for service in (a, b, backend.replica(runtime, cache)):
        wait_for_active(service, last)
    assert epoch(a).equals(epoch(b))


# -- immutability -----------------------------------------------------------------


def test_published_objects_are_never_rewritten(
    backend: Backend, runtime: drt.DatasetRuntime, cache: Path
) -> None:
    service = backend.replica(runtime, cache)
    population, _ = service.put(weighted(service, 2.0), False)
    before = {
        name: hashlib.sha256(body).hexdigest()
        for name, body in backend.objects().items()
        if "checkpoint" not in name  # a hint, overwritten by design
    }
    service.put(weighted(service, 2.0), True)  # the same table again, now activated
    service.put(weighted(service, 3.0), True)
    after = backend.objects()
    for name, digest in before.items():
        assert hashlib.sha256(after[name]).hexdigest() == digest, f"{name} was rewritten"
    assert population in service.populations()


# -- crashes ----------------------------------------------------------------------

PUTTER = textwrap.dedent(
    """
    import json, sys
    import pyarrow as pa
    import dataset_rt as drt
    from dataset_rt.service import DatasetService

    cache, location, mirror = sys.argv[1:4]
    runtime = drt.DatasetRuntime(num_workers=1)
    service = DatasetService(runtime.native, "contract", [cache], location, mirror_dir=mirror)
    base = pa.table(service.metadata())
    at = base.schema.get_field_index("weight")
    print("ready", flush=True)
    for i in range(10_000):
        weights = pa.array([1.0 + i / 7] * base.num_rows, pa.float64())
        population, _ = service.put(base.set_column(at, "weight", weights), True)
        print(json.dumps(population), flush=True)
    """
)


def test_a_writer_killed_at_any_point_leaves_a_good_store(
    backend: Backend, runtime: drt.DatasetRuntime, cache: Path
) -> None:
    backend.replica(runtime, cache)
    rng = random.Random(46)
    for _ in range(4):  # bounded: four kills at random points of a put loop
        proc = subprocess.Popen(
            [sys.executable, "-c", PUTTER, *backend.replica_args(cache)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.05, 0.6))
            proc.send_signal(signal.SIGKILL)
            out, _ = proc.communicate(timeout=WAIT_SECONDS)
        finally:
            proc.kill()
        acknowledged = [json.loads(line) for line in out.split()]
        fresh = backend.replica(runtime, cache)
        active = fresh.active().population
        assert active in fresh.populations(), "the active population is stored"
        objects = backend.objects()
        log = [population_of(objects[name]) for name in backend.log()]
        # The newest entry is active: the last acknowledged activation, or one
        # in flight after it whose entry was written; none acknowledged is lost.
        assert active == log[-1]
        assert set(acknowledged) <= set(log)
        assert len(epoch(fresh)) == N, "and it serves"


# -- damaged and hostile entries --------------------------------------------------


def test_damaged_and_hostile_log_entries_are_skipped_and_puts_go_on(
    backend: Backend, runtime: drt.DatasetRuntime, cache: Path
) -> None:
    service = backend.replica(runtime, cache)
    good, _ = service.put(weighted(service, 2.0), True)
    [*_, newest] = backend.log()
    log_dir, last = newest.rsplit("/", 1)
    seq = int(last.removesuffix(".json"))
    hostile = {
        seq + 1: b"{not json",
        seq + 2: b" " * (1 << 20),
        seq + 3: json.dumps({"population": "b" * 32, "epoch_len": 3}).encode(),
        seq + 4: json.dumps({"population": "../x", "epoch_len": 3}).encode(),
        10**6: b"{}",
    }
    for number, body in hostile.items():
        backend.put(f"{log_dir}/{number:020}.json", body)
    backend.put(f"{log_dir}/99999999999999999999.json", b"{}")
    started = backend.replica(runtime, cache)  # a replica starts with them present
    for replica in (service, started):
        time.sleep(FRESHNESS + 0.1)
        assert replica.active().population == good
        assert len(epoch(replica)) == N
    newer, _ = started.put(weighted(started, 5.0), True)
    appended = f"{log_dir}/{seq + 5:020}.json"
    assert appended in backend.log(), "appended after the damaged entries"
    wait_for_active(service, newer)
