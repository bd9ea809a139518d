"""Population stores on S3-compatible object storage (issue 24), against a real
store: a one-node Ceph radosgw started for the session (tests/ceph_s3.py).

Replicas here are `DatasetService`s with their own mirror directories over the
same bucket prefix and the same caches: they share nothing on disk but the
caches' bytes. The bucket is inspected with boto3, a client independent of ours.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from activations import contender_script
from ceph_s3 import CephS3, free_port
from conftest import ListSource, make_records, write
from slow_store import SlowDownProxy
from terminal import on_a_terminal
from volumes import fill, small_volume

import dataset_rt as drt
from dataset_rt.service import DatasetService, StreamRequest

N = 12
NAME = "objects"
POLL_SECONDS = 1.0  # population/remote.rs POLL
WAIT_SECONDS = 60.0

boto3 = pytest.importorskip("boto3")
botocore_exceptions = pytest.importorskip("botocore.exceptions")


@pytest.fixture
def s3(ceph: CephS3, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A boto3 client of the store, with our engine's environment pointing at it."""
    for key, value in ceph.environment().items():
        monkeypatch.setenv(key, value)
    env = ceph.environment()
    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_REGION"],
    )


@pytest.fixture
def bucket(s3: Any) -> str:
    name = f"drt-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("objects"), ListSource("pop", make_records(N)))


def replica(runtime: drt.DatasetRuntime, cache: Path, url: str, mirror: Path) -> DatasetService:
    return DatasetService(runtime.native, NAME, [str(cache)], url, mirror_dir=str(mirror))


def keys(s3: Any, bucket: str, part: str) -> list[str]:
    """The keys of ``bucket`` whose path has the segment ``part``, sorted."""
    found: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        found += [o["Key"] for o in page.get("Contents", []) if f"/{part}/" in o["Key"]]
    return sorted(found)


def reweighted(service: DatasetService, weight: float) -> pa.Table:
    table = pa.table(service.metadata())
    at = table.schema.get_field_index("weight")
    return table.set_column(at, "weight", pa.array([weight] * table.num_rows, pa.float64()))


def epoch(service: DatasetService, population: str | None = None) -> pa.Table:
    keys_ = {"dataset": NAME, "seed": 7, "epoch": 0}
    if population:
        keys_ |= {"population": population, "epoch_len": N}
    request = service.pin(StreamRequest(**keys_))
    stream = service.stream(request.for_rank(0))
    try:
        return pa.RecordBatchReader.from_stream(stream).read_all()
    except pa.ArrowInvalid:
        stream.raise_failure()  # the engine's own error class
        raise


def arrived(mirror: Path, pattern: str) -> list[Path]:
    """The files of ``mirror`` matching ``pattern`` once there are some: a shard is
    fetched whole in the background once its records cost as much by range."""
    deadline = time.monotonic() + WAIT_SECONDS
    while not (found := sorted(mirror.rglob(pattern))):
        assert time.monotonic() < deadline, f"no {pattern} ever arrived in {mirror}"
        time.sleep(0.05)
    return found


def wait_for_active(service: DatasetService, population: str) -> float:
    start = time.monotonic()
    while service.active().population != population:
        assert time.monotonic() - start < WAIT_SECONDS, "the activation never arrived"
        time.sleep(0.05)
    return time.monotonic() - start


# -- the store itself -----------------------------------------------------------


def test_the_store_enforces_create_only_writes(s3: Any, bucket: str) -> None:
    """What the design relies on (If-None-Match: *), checked without our code, and
    what it avoids: radosgw 16 refuses If-Match with the quoted ETag S3 returns."""
    etag = s3.put_object(Bucket=bucket, Key="k", Body=b"one", IfNoneMatch="*")["ETag"]
    with pytest.raises(botocore_exceptions.ClientError) as refused:
        s3.put_object(Bucket=bucket, Key="k", Body=b"two", IfNoneMatch="*")
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    with pytest.raises(botocore_exceptions.ClientError):
        s3.put_object(Bucket=bucket, Key="k", Body=b"three", IfMatch=etag)
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"one"


# -- populations ----------------------------------------------------------------


def test_a_replica_serves_what_another_stored_and_activated(
    runtime: drt.DatasetRuntime, cache: Path, bucket: str, s3: Any, tmp_path: Path
) -> None:
    url = f"s3://{bucket}/state"
    a = replica(runtime, cache, url, tmp_path / "a")
    b = replica(runtime, cache, url, tmp_path / "b")
    # Both started on an empty store: one default population, one activation.
    assert a.active().population == b.active().population
    assert len(keys(s3, bucket, "active")) == 1
    population, rows = a.put(reweighted(a, 2.0), True)
    assert rows == N
    assert a.active().population == population  # at once on the replica that activated
    waited = wait_for_active(b, population)
    assert waited <= POLL_SECONDS + 0.5
    # b had never seen it: it is fetched into b's mirror, checked, mapped, served alike.
    assert epoch(b).equals(epoch(a))
    assert pa.table(b.metadata()).equals(pa.table(a.metadata()))
    assert (tmp_path / "b").rglob(f"{population}.arrow")
    assert sorted(b.populations()) == sorted(a.populations())
    stored = keys(s3, bucket, "populations")
    assert any(k.endswith(f"{population}.arrow") for k in stored)
    assert any(k.endswith(f"{population}.rows") for k in stored)
    # A cold replica (empty mirror) starts on the store's active population.
    c = replica(runtime, cache, url, tmp_path / "c")
    assert c.active().population == population
    assert epoch(c).equals(epoch(a))


FIRST_USE = """
import sys
import dataset_rt as drt
from dataset_rt.service import DatasetService

cache, url, mirror, show = sys.argv[1:]
runtime = drt.DatasetRuntime(num_workers=1)
service = DatasetService(
    runtime.native, "objects", [cache], url, mirror_dir=mirror, show_progress=show == "show"
)
service.active()  # maps the active population: fetched into this mirror first
"""


def test_a_population_fetched_on_its_first_use_draws_a_bar_on_a_terminal(
    runtime: drt.DatasetRuntime, cache: Path, bucket: str, s3: Any, tmp_path: Path
) -> None:
    """A replica's first use of a population downloads its files into the mirror
    (GBs at scale): a bar of the bytes on a terminal; none with show_progress=False
    (the server's --quiet)."""
    url = f"s3://{bucket}/state"
    a = replica(runtime, cache, url, tmp_path / "a")
    population, _ = a.put(reweighted(a, 2.0), True)
    command = [sys.executable, "-c", FIRST_USE, str(cache), url]
    shown = on_a_terminal([*command, str(tmp_path / "b"), "show"])
    assert f"fetching population {population[:12]}" in shown, shown
    assert "KiB" in shown, shown
    assert on_a_terminal([*command, str(tmp_path / "c"), "hide"]) == ""
    assert list((tmp_path / "c").rglob(f"{population}.rows")), "fetched all the same"


def test_damaged_and_hostile_log_entries_never_take_the_dataset_offline(
    runtime: drt.DatasetRuntime, cache: Path, bucket: str, s3: Any, tmp_path: Path
) -> None:
    """Issue 46, finding 2: before, one garbage entry made every default stream,
    list and put INTERNAL, an entry naming a missing population NOT_FOUND for all,
    ``99999999999999999999.json`` stopped a new replica at start, and a 64 MiB
    entry was echoed into every message."""
    url = f"s3://{bucket}/state"
    a = replica(runtime, cache, url, tmp_path / "a")
    good, _ = a.put(reweighted(a, 2.0), True)
    [first, *_] = keys(s3, bucket, "active")
    log = first.rsplit("/", 1)[0]
    hostile = {
        f"{log}/{a_seq:020}.json": body
        for a_seq, body in [
            (3, b"{not json"),
            (4, b" " * (64 << 20)),
            (5, b'{"population": "' + b"b" * 32 + b'", "epoch_len": 3}'),
            (6, b'{"population": "../x", "epoch_len": 3}'),
            (10**6, b"{}"),
        ]
    }
    hostile[f"{log}/99999999999999999999.json"] = b"{}"
    for key, body in hostile.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    # A replica starting now, and the one running, keep the last good entry.
    b = replica(runtime, cache, url, tmp_path / "b")
    for service in (a, b):
        time.sleep(POLL_SECONDS + 0.1)
        assert service.active().population == good
        assert len(epoch(service)) == N
        assert good in service.populations()
        assert service.stats().skipped_log_entries == 4  # nothing past the gap is read
    # A put still works, appends after the damaged entries and is seen by all.
    newer, _ = b.put(reweighted(b, 3.0), True)
    assert any(k.endswith(f"{7:020}.json") for k in keys(s3, bucket, "active"))
    wait_for_active(a, newer)
    assert epoch(a).equals(epoch(b))


def test_set_epoch_len_and_claims_go_through_the_bucket(
    runtime: drt.DatasetRuntime, cache: Path, bucket: str, tmp_path: Path
) -> None:
    url = f"s3://{bucket}/state"
    a = replica(runtime, cache, url, tmp_path / "a")
    b = replica(runtime, cache, url, tmp_path / "b")
    assert a.set_epoch_len(5) == 5
    deadline = time.monotonic() + WAIT_SECONDS
    while b.active().epoch_len != 5:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    run = uuid.uuid4().hex
    assert a.claim_run(run, after=0, epoch=0, position=0) == 1
    # Every rank of one job claims from the same checkpoint: the same generation.
    assert b.claim_run(run, after=0, epoch=0, position=0) == 1
    assert b.claim_run(run, after=1, epoch=0, position=4) == 2
    with pytest.raises(drt.FencedError, match="resumed elsewhere"):
        a.check_run(run, 1)
    a.check_run(run, 2)


def test_removal_is_refused_on_object_storage(
    runtime: drt.DatasetRuntime, cache: Path, bucket: str, tmp_path: Path
) -> None:
    a = replica(runtime, cache, f"s3://{bucket}/state", tmp_path / "a")
    first = a.active().population
    a.put(reweighted(a, 3.0), True)
    with pytest.raises(drt.InvalidArgumentError, match="written once and never removed"):
        a.remove_population(first)
    assert first in a.populations()


CONTENDER = contender_script(NAME)


def test_concurrent_activations_from_two_replicas_each_get_their_own_entry(
    cache: Path, bucket: str, s3: Any, tmp_path: Path
) -> None:
    """Two processes (replicas with their own mirrors) activate at once: every
    acknowledged activation is an entry of the log (none overwritten by a
    last-writer-wins put), and the newest entry is what every replica serves."""
    url = f"s3://{bucket}/state"
    count = 8
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                CONTENDER,
                str(cache),
                url,
                str(tmp_path / f"m{i}"),
                str(10.0 + 100 * i),
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
            acknowledged += [line.strip('"') for line in out.split()]
    finally:
        for proc in procs:
            proc.kill()
    assert len(acknowledged) == 2 * count
    log = keys(s3, bucket, "active")
    # One entry for the first start (the two replicas raced for it too), one per activation.
    assert len(log) == 1 + 2 * count
    logged = [
        s3.get_object(Bucket=bucket, Key=k)["Body"].read().decode().split('"population":"')[1][:32]
        for k in log[1:]
    ]
    assert sorted(logged) == sorted(acknowledged)
    runtime = drt.DatasetRuntime(num_workers=1)
    assert replica(runtime, cache, url, tmp_path / "late").active().population == logged[-1]


# -- when the store is away -------------------------------------------------------


def test_an_unreachable_store_is_store_unavailable(
    runtime: drt.DatasetRuntime, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    for key, value in (("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s")):
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    monkeypatch.setenv("AWS_TIMEOUT", "30")  # bare seconds, as the docs allow (issue 46)
    start = time.monotonic()
    with pytest.raises(drt.StoreUnavailableError, match=r"could not .* reachable") as failed:
        replica(runtime, cache, "s3://nowhere/state", tmp_path / "m")
    assert time.monotonic() - start < WAIT_SECONDS
    # The endpoint and the key layout are the operator's, not the client's (issue 46).
    text = str(failed.value)
    for private in ("127.0.0.1", "caches-", "active/"):
        assert private not in text, text
    assert isinstance(drt.StoreUnavailableError("x"), drt.CacheIOError)


def test_a_store_that_goes_away_and_returns(
    runtime: drt.DatasetRuntime, cache: Path, ceph: CephS3, bucket: str, tmp_path: Path
) -> None:
    """While the gateway is down an activation fails as StoreUnavailableError and
    changes nothing; when it is back, the same replica works on."""
    a = replica(runtime, cache, f"s3://{bucket}/state", tmp_path / "a")
    before = a.active().population
    table = reweighted(a, 4.0)
    ceph.stop_gateway()
    try:
        with pytest.raises(drt.StoreUnavailableError):
            a.put(table, True)
    finally:
        ceph.start_gateway()
    time.sleep(POLL_SECONDS)
    assert a.active().population == before
    population, _ = a.put(table, True)
    assert a.active().population == population != before


def test_a_silent_store_is_unavailable_within_seconds_and_the_replica_recovers(
    runtime: drt.DatasetRuntime, cache: Path, ceph: CephS3, bucket: str, tmp_path: Path
) -> None:
    """A store that stops answering without refusing (a network cut: here radosgw
    stopped by SIGSTOP) is found out by a probe within seconds (remote/health.rs):
    the request waiting on it fails as StoreUnavailableError, later ones fail at
    once, and when the store answers again the same replica works on."""
    a = replica(runtime, cache, f"s3://{bucket}/state", tmp_path / "a")
    before = a.active().population
    table = reweighted(a, 4.0)
    with ceph.silenced():
        started = time.monotonic()
        with pytest.raises(drt.StoreUnavailableError, match="has not answered"):
            a.put(table, True)
        first = time.monotonic() - started
        started = time.monotonic()
        with pytest.raises(drt.StoreUnavailableError, match="has not answered"):
            a.put(table, True)
        second = time.monotonic() - started
    print(f"silent store: first request failed after {first:.1f} s, the next {second:.2f} s")
    # Bounds far above the 2 s stall + 3 s probe, far below the 30 s of retries.
    assert first < 15, first
    assert second < 2, second
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        try:
            assert a.active().population == before
            break
        except drt.StoreUnavailableError:
            assert time.monotonic() < deadline, "the replica never saw the store again"
            time.sleep(0.2)
    population, _ = a.put(table, True)
    assert a.active().population == population != before


@pytest.fixture
def published(
    runtime: drt.DatasetRuntime, cache: Path, bucket: str, tmp_path: Path
) -> tuple[str, pa.Table]:
    """The module's cache uploaded to ``bucket``: its URL, and its epoch read locally."""
    report = drt._native.upload_cache(str(cache), f"s3://{bucket}/caches")
    local = DatasetService(runtime.native, NAME, [str(cache)], str(tmp_path / "local"))
    return report.url, epoch(local)


@pytest.fixture
def throttling(ceph: CephS3, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlowDownProxy]:
    """A slow-down proxy in front of the store, forwarding every request until its
    ``mode`` says otherwise, as this process's S3 endpoint."""
    with SlowDownProxy(ceph.endpoint, "off") as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        yield proxy


def slow_downs_counted(proxy: SlowDownProxy, before: int) -> int:
    """This process's count of slow-down answers since ``before``, once it has
    caught up with what the proxy sent (an answer is counted as it arrives)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while (counted := drt._native.object_store_slow_downs() - before) < proxy.slow_downs:
        assert time.monotonic() < deadline, (counted, proxy.slow_downs)
        time.sleep(0.05)
    return counted


def test_slow_down_answers_are_retried_and_counted(
    runtime: drt.DatasetRuntime,
    published: tuple[str, pa.Table],
    throttling: SlowDownProxy,
    bucket: str,
    tmp_path: Path,
) -> None:
    """A store that answers each request with S3's 503 SlowDown once (issue 49):
    a replica opens the cache, serves its epochs exactly and activates a
    population as if nothing happened; every slow-down answer was retried, and
    each is counted for /metrics."""
    url, expected = published
    proxy, proxy.mode = throttling, "once"
    before = drt._native.object_store_slow_downs()
    a = DatasetService(
        runtime.native, NAME, [url], f"s3://{bucket}/state", mirror_dir=str(tmp_path / "m")
    )
    assert epoch(a).equals(expected)
    assert epoch(a).equals(expected)
    population, _ = a.put(reweighted(a, 3.0), True)
    assert a.active().population == population
    assert proxy.slow_downs > 10, "every distinct request was answered 503 once"
    assert slow_downs_counted(proxy, before) == proxy.slow_downs
    print(f"{proxy.slow_downs} slow-down answers retried, {proxy.forwarded} forwarded")


def test_a_store_that_keeps_asking_to_slow_down_is_unavailable_not_damage(
    runtime: drt.DatasetRuntime,
    published: tuple[str, pa.Table],
    throttling: SlowDownProxy,
    bucket: str,
    tmp_path: Path,
) -> None:
    """When every retry is answered 503 SlowDown too, what fails is
    StoreUnavailableError (UNAVAILABLE over Flight, which clients retry): a stream
    under way, an activation, a replica's start; never CorruptCacheError, and
    nothing changes. Once the store serves again, the same replica works on."""
    url, expected = published
    state, proxy = f"s3://{bucket}/state", throttling
    a = DatasetService(runtime.native, NAME, [url], state, mirror_dir=str(tmp_path / "a"))
    before = a.active().population
    table = reweighted(a, 5.0)
    proxy.mode = "always"
    start = time.monotonic()
    with pytest.raises(drt.StoreUnavailableError, match="slow down") as failed:
        epoch(a)
    print(f"a throttled stream failed after {time.monotonic() - start:.1f} s")
    assert time.monotonic() - start < WAIT_SECONDS
    assert "127.0.0.1" not in str(failed.value), "the endpoint is the operator's"
    with pytest.raises(drt.StoreUnavailableError, match="slow down"):
        a.put(table, True)
    with pytest.raises(drt.StoreUnavailableError, match="slow down"):
        DatasetService(runtime.native, NAME, [url], state, mirror_dir=str(tmp_path / "b"))
    proxy.mode = "off"
    assert a.active().population == before
    assert epoch(a).equals(expected)
    population, _ = a.put(table, True)
    assert a.active().population == population != before


# -- caches -----------------------------------------------------------------------


def test_upload_publishes_a_cache_once_with_its_files_first(
    cache: Path, bucket: str, s3: Any
) -> None:
    url = f"s3://{bucket}/caches"
    report = drt._native.upload_cache(str(cache), url)
    assert report.uploaded
    assert report.url == f"{url}/pop"
    info = drt._native.inspect_cache(str(cache))
    assert report.cache_id == info.cache_id
    # Each file under its own two-hex-digit prefix (a layout spread over 256, so
    # that a store's per-prefix request rate is not one cache's bound).
    prefix = f"caches/pop/{report.version}/"
    listed = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert "caches/pop/published.json" in listed
    published = s3.get_object(Bucket=bucket, Key="caches/pop/published.json")
    record = json.loads(published["Body"].read())
    assert record == {
        "format_version": 1,
        "cache_id": report.cache_id,
        "version": report.version,
        "layout": "spread",
    }
    spread = {key[len(prefix) :] for key in listed - {"caches/pop/published.json"}}
    files = sorted(p.name for p in cache.iterdir())
    assert sorted(key.split("/")[1] for key in spread) == files
    assert all(re.fullmatch(r"[0-9a-f]{2}/[^/]+", key) for key in spread), spread
    assert len({key.split("/")[0] for key in spread}) > 1, spread
    for key in spread:
        body = s3.get_object(Bucket=bucket, Key=prefix + key)["Body"].read()
        assert body == (cache / key.split("/")[1]).read_bytes(), key
    # The same cache again: nothing sent; the CLI says so.
    assert not drt._native.upload_cache(str(cache), url).uploaded
    done = subprocess.run(
        [sys.executable, "-m", "dataset_rt", "upload", str(cache), url],
        capture_output=True, text=True, timeout=WAIT_SECONDS, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "already published" in done.stdout


def test_another_cache_of_the_same_name_is_refused(
    cache: Path, bucket: str, s3: Any, tmp_path: Path
) -> None:
    url = f"s3://{bucket}/caches"
    other = write(tmp_path, ListSource("pop", make_records(N + 1, seed=5)))
    drt._native.upload_cache(str(cache), url)
    before = s3.list_objects_v2(Bucket=bucket)["KeyCount"]
    with pytest.raises(drt.InvalidArgumentError, match="already holds another cache"):
        drt._native.upload_cache(str(other), url)
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == before


def test_two_caches_uploaded_under_one_name_at_once_publish_one(
    bucket: str, s3: Any, tmp_path: Path
) -> None:
    script = "import sys, dataset_rt as drt; drt._native.upload_cache(sys.argv[1], sys.argv[2])"
    for round_ in range(2):
        url = f"s3://{bucket}/race{round_}"
        caches = [
            write(tmp_path / f"{round_}-{i}", ListSource("pop", make_records(N, seed=10 + i)))
            for i in range(2)
        ]
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", script, str(c), url],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for c in caches
        ]
        results = [(p.wait(timeout=WAIT_SECONDS), p.communicate()[1]) for p in procs]
        assert sorted(code for code, _ in results) == [0, 1], results
        assert any("already holds another cache" in err for _, err in results)
        body = s3.get_object(Bucket=bucket, Key=f"race{round_}/pop/published.json")["Body"]
        published = body.read().decode()
        here = [k for k in keys(s3, bucket, "pop") if k.startswith(f"race{round_}/")]
        # race<n>/pop/<version>/<xx>/<file>
        versions = {k.split("/")[2] for k in here if k.count("/") == 4}
        assert len(versions) == 1, "the losing upload's files were removed"
        assert next(iter(versions)) in published


def test_a_damaged_cache_is_not_uploaded(bucket: str, s3: Any, tmp_path: Path) -> None:
    damaged = write(tmp_path, ListSource("pop", make_records(N)))
    shard = damaged / "shard-00000.bin"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(drt.CorruptCacheError):
        drt._native.upload_cache(str(damaged), f"s3://{bucket}/caches")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_replicas_read_a_published_cache_through_their_mirrors(
    runtime: drt.DatasetRuntime, cache: Path, bucket: str, s3: Any, tmp_path: Path
) -> None:
    """No replica has the cache's directory: each reads it from the bucket through
    its own mirror (manifest, index and metadata at open; records by range as the
    stream needs them, and a shard smaller than what its requests cost whole, in
    the background), and serves what a server over the local directory serves."""
    report = drt._native.upload_cache(str(cache), f"s3://{bucket}/caches")
    local = DatasetService(runtime.native, NAME, [str(cache)], str(tmp_path / "local"))
    state = f"s3://{bucket}/state"
    a = DatasetService(runtime.native, NAME, [report.url], state, mirror_dir=str(tmp_path / "a"))
    assert a.cache_ids == local.cache_ids
    shards = list((tmp_path / "a").rglob("shard-*.bin"))
    assert shards == [], "shards are fetched when first read, not at open"
    expected = epoch(local)
    requests, fetched = drt._native.object_store_reads()
    assert epoch(a).equals(expected)
    more_requests, more_fetched = drt._native.object_store_reads()
    assert more_requests > requests, "counted for /metrics"
    assert more_fetched > fetched
    assert arrived(tmp_path / "a", "shard-*.bin")
    assert epoch(a).equals(expected), "and is served from there alike"
    b = DatasetService(runtime.native, NAME, [report.url], state, mirror_dir=str(tmp_path / "b"))
    assert epoch(b).equals(expected)
    assert pa.table(b.metadata()).equals(pa.table(local.metadata()))


def test_a_damaged_object_is_refused_as_corrupt(
    runtime: drt.DatasetRuntime, cache: Path, bucket: str, s3: Any, tmp_path: Path
) -> None:
    report = drt._native.upload_cache(str(cache), f"s3://{bucket}/caches")
    (key,) = [k for k in keys(s3, bucket, report.version) if k.endswith("/shard-00000.bin")]
    data = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 0xFF
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    service = DatasetService(
        runtime.native, NAME, [report.url], str(tmp_path / "state"), mirror_dir=None
    )
    with pytest.raises(drt.CorruptCacheError, match="fails its checksum"):
        epoch(service)


def test_a_damaged_mirror_copy_says_how_to_fetch_it_again(
    runtime: drt.DatasetRuntime, cache: Path, bucket: str, tmp_path: Path
) -> None:
    report = drt._native.upload_cache(str(cache), f"s3://{bucket}/caches")
    state, mirror = str(tmp_path / "state"), tmp_path / "mirror"
    expected = epoch(DatasetService(runtime.native, NAME, [str(cache)], str(tmp_path / "l")))
    first = DatasetService(runtime.native, NAME, [report.url], state, mirror_dir=str(mirror))
    assert epoch(first).equals(expected)
    del first
    (shard,) = arrived(mirror, "shard-00000.bin")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    damaged = DatasetService(runtime.native, NAME, [report.url], state, mirror_dir=str(mirror))
    with pytest.raises(drt.CorruptCacheError, match="delete the mirrored directory"):
        epoch(damaged)
    del damaged
    shutil.rmtree(mirror / "caches")
    again = DatasetService(runtime.native, NAME, [report.url], state, mirror_dir=str(mirror))
    assert epoch(again).equals(expected)


def test_a_missing_cache_url_is_not_found(
    runtime: drt.DatasetRuntime, bucket: str, tmp_path: Path
) -> None:
    with pytest.raises(drt.NotFoundError, match="python -m dataset_rt upload"):
        DatasetService(runtime.native, NAME, [f"s3://{bucket}/none/pop"], str(tmp_path / "s"))


@pytest.mark.parametrize("budget_in_shards", [3, 0.5])
def test_the_mirror_keeps_at_most_its_budget_of_shards(
    runtime: drt.DatasetRuntime, bucket: str, tmp_path: Path, budget_in_shards: float
) -> None:
    """A mirror smaller than the cache (three shards, or half of one: less than a
    tenth of the cache) keeps at most its budget and still serves every epoch
    exactly: what it does not hold is read by range from the store."""
    records = make_records(64, payload_size=4096)
    sharded = write(tmp_path / "w", ListSource("pop", records), max_shard_bytes=16 * 1024)
    shard_bytes = [p.stat().st_size for p in sharded.glob("shard-*.bin")]
    assert len(shard_bytes) >= 8
    report = drt._native.upload_cache(str(sharded), f"s3://{bucket}/caches")
    local = DatasetService(runtime.native, NAME, [str(sharded)], str(tmp_path / "local"))
    budget = int(budget_in_shards * max(shard_bytes))
    drt._native.set_mirror_budget(budget)
    try:
        mirror = tmp_path / "m"
        remote = DatasetService(
            runtime.native, NAME, [report.url], f"s3://{bucket}/state", mirror_dir=str(mirror)
        )
        for _ in range(2):
            assert epoch(remote).equals(epoch(local))
            kept = sum(p.stat().st_size for p in (mirror / "caches").rglob("shard-*.bin"))
            assert kept <= budget
    finally:
        drt._native.set_mirror_budget(0)


def test_a_full_mirror_volume_is_read_by_range_and_keeps_nothing_half_written(
    runtime: drt.DatasetRuntime, bucket: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A replica whose mirror volume fills up after it opened the cache: the
    whole-shard fetches fail (the disk is full), a shard's first failure is a
    warning and the shard is read by range instead, so every epoch is still
    served exactly; no shard and no temporary file is left on the volume. Once
    there is room, the shards are mirrored again."""
    records = make_records(64, payload_size=4096)
    sharded = write(tmp_path / "w", ListSource("pop", records), max_shard_bytes=16 * 1024)
    report = drt._native.upload_cache(str(sharded), f"s3://{bucket}/caches")
    local = DatasetService(runtime.native, NAME, [str(sharded)], str(tmp_path / "local"))
    expected = epoch(local)
    with small_volume(tmp_path / "mirror", size="4m") as mirror:
        remote = DatasetService(
            runtime.native, NAME, [report.url], f"s3://{bucket}/state", mirror_dir=str(mirror)
        )
        remote.active()  # the population's files are mirrored before the volume fills
        filler = fill(mirror)
        for _ in range(2):
            assert epoch(remote).equals(expected)
        assert list(mirror.rglob("shard-*.bin")) == []
        # A fetch still in flight in the background holds its temporary file
        # until its write fails; none may stay.
        deadline = time.monotonic() + WAIT_SECONDS
        while (left := list(mirror.rglob(".tmp-*"))) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert left == []
        warned = [line for line in capfd.readouterr().err.splitlines() if "warning:" in line]
        shards = [re.search(r"shard-\d+\.bin", line) for line in warned]
        named = [found.group() for found in shards if found]
        assert len(named) == len(warned) > 0, warned
        assert len(set(named)) == len(named), f"a shard warned about twice: {warned}"
        filler.unlink()
        assert epoch(remote).equals(expected)
        assert arrived(mirror, "shard-*.bin"), "mirrored once there is room"


# -- the server -------------------------------------------------------------------


def test_two_servers_with_only_the_bucket_serve_alike_and_share_activations(
    cache: Path, bucket: str, tmp_path: Path
) -> None:
    """``python -m flight_server`` twice, each with its own data dir and nothing on
    disk in common: the cache and the populations are in the bucket."""
    import polars as pl
    from flight.test_server_cli import ServerProcess, epoch_ids

    from flight_client import DatasetClient

    report = drt._native.upload_cache(str(cache), f"s3://{bucket}/caches")
    with contextlib.ExitStack() as stack:
        servers = [
            stack.enter_context(ServerProcess(replica_args(report.url, bucket, tmp_path / f"r{i}")))
            for i in range(2)
        ]
        a, b = (s.location() for s in servers)
        assert epoch_ids(a, "objects") == epoch_ids(b, "objects")
        with DatasetClient(a) as client:
            table = client.get_metadata("objects")
            population = client.update_metadata(
                "objects", table.with_columns(pl.lit(2.0).alias("weight"))
            )
        deadline = time.monotonic() + WAIT_SECONDS
        with DatasetClient(b) as client:
            while client.get_metadata("objects")["weight"].to_list() != [2.0] * N:
                assert time.monotonic() < deadline, "b never saw the activation"
                time.sleep(0.1)
        assert epoch_ids(a, "objects") == epoch_ids(b, "objects")
        assert population
        for server in servers:
            assert server.stop() == 0, server.output()


def replica_args(cache_url: str, bucket: str, data_dir: Path) -> list[str]:
    """A server with only its own data dir: the cache and the state are in the bucket."""
    state = f"s3://{bucket}/state"
    dataset = f"objects={cache_url}"
    return ["--port", "0", "--data-dir", str(data_dir), "--state-dir", state, "--dataset", dataset]
