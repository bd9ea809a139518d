"""End to end on object storage: compose profile ``object-store``, three replicas
that share nothing but a bucket of a real S3 store (Ceph's radosgw in its own
container, built from Debian's packages by docker/build-ceph-image.sh).

Each replica has its own address and its own read-through mirror (in its
container, so a recreated replica starts cold); no volume is shared. The suite
checks identical streams across replicas, failover mid-stream, concurrent
activations through two replicas, a cold replica against a warm one, and a
bucket cut off by the test (its container disconnected from the project's
network): UNAVAILABLE with a clear message, nothing lost, recovery when it
returns.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import polars as pl
import pyarrow.flight as flight
import pytest

from dataset_rt import Partition
from e2e.test_compose import (  # noqa: F401  (image and library_epoch are fixtures)
    SEED,
    Project,
    _ids,
    _wait_healthy,
    build_ceph_image,
    http_get,
    image,
    library_epoch,
    wait_container_healthy,
    wait_http_ok,
)
from flight_client import DatasetClient, EveryLocationFailedError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

#: What the compose file gives the bundled store when the environment sets nothing.
ACCESS_KEY, SECRET_KEY = "dataset-rt-demo", "dataset-rt-demo-secret"
#: A replica sees another's activation within the activation log's poll (1 s):
#: this bound leaves room for a loaded machine.
REACH_SECONDS = 10.0


@pytest.fixture(scope="module")
def cluster(image: str) -> Iterator[Project]:  # noqa: F811  (the imported fixture)
    build_ceph_image()
    project = Project(image, "object-store")
    try:
        project.up()
        yield project
    finally:
        project.down()


def s3(project: Project) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=project.object_store,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )


def keys(project: Project, prefix: str) -> list[str]:
    """Every key under ``prefix`` in the bucket ``datasets`` (paged)."""
    pages = s3(project).get_paginator("list_objects_v2").paginate(Bucket="datasets", Prefix=prefix)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def docker(*args: str) -> str:
    return subprocess.run(
        ["docker", *args], check=True, capture_output=True, text=True, timeout=120
    ).stdout


def mirrored_shard_bytes(project: Project, service: str) -> int:
    """Bytes of cache shards in a replica's read-through mirror."""
    out = docker(
        "exec",
        project.container(service),
        "sh",
        "-c",
        "find /mirror -name 'shard-*.bin' -type f -exec cat {} + | wc -c",
    )
    return int(out.strip() or 0)


DEMO_SHARD_BYTES = 2000 * 1024  # the demo's payloads


def wait_mirrored(project: Project, service: str) -> None:
    """Until a replica's mirror holds the demo's shards: a first read's records come
    by range, the shard whole after them, in the background
    (storage/cache/planned.rs)."""
    deadline = time.monotonic() + 30
    while mirrored_shard_bytes(project, service) < DEMO_SHARD_BYTES:
        assert time.monotonic() < deadline, f"{service}'s mirror never warmed"
        time.sleep(0.2)


def active_everywhere(project: Project) -> list[str]:
    return [
        str(DatasetClient([r]).populations("demo")["active"]["population"])
        for r in project.replicas
    ]


def wait_active_everywhere(project: Project, population: str) -> float:
    """Seconds until every replica names ``population`` active (bounded)."""
    started = time.monotonic()
    while (seen := active_everywhere(project)) != [population] * len(project.replicas):
        if time.monotonic() - started > REACH_SECONDS:
            raise AssertionError(f"after {REACH_SECONDS} s the replicas name {seen} active")
        time.sleep(0.05)
    return time.monotonic() - started


def pinned_ticket(project: Project, epoch: int) -> dict[str, Any]:
    """The ticket of a whole epoch, its population pinned by the server that made it."""
    info = DatasetClient(project.replicas).epoch_info("demo", SEED, epoch)
    return dict(json.loads(info.endpoints[0].ticket.ticket))


def read_at(ticket: dict[str, Any], location: str) -> list[tuple[int, int, int]]:
    """The ticket's rows as ``location`` itself serves them (a FlightInfo would
    advertise every replica, so reads name the one they measure)."""
    return _ids(DatasetClient([location], retries=1).stream_ticket(ticket, [location]))


def test_replicas_share_nothing_but_the_bucket(cluster: Project) -> None:
    for service, probes in zip(cluster.replica_services, cluster.replica_probes, strict=True):
        mounts = json.loads(docker("inspect", "-f", "{{json .Mounts}}", cluster.container(service)))
        assert mounts == [], f"{service} mounts {mounts}: the profile shares no volume"
        assert wait_http_ok(f"{probes}/readyz") == "ready\n", service
        assert wait_container_healthy(cluster.container(service)) == "healthy", service
    # The cache is in the bucket, published (its marker written last).
    published = [k for k in keys(cluster, "caches/demo_v1/") if k.endswith("/published.json")]
    assert len(published) == 1, published


def test_every_replica_streams_the_library_epoch(
    cluster: Project,
    library_epoch: list[tuple[int, int]],  # noqa: F811
) -> None:
    client = DatasetClient(cluster.replicas)
    quarters = [Partition(rank=r, world_size=4) for r in range(4)]
    per_rank = [_ids(client.epoch("demo", SEED, 0, partition=q, batches=True)) for q in quarters]
    delivered = sorted(row for rank in per_rank for row in rank)
    assert [(c, s) for _, c, s in delivered] == library_epoch
    ticket = pinned_ticket(cluster, 2)
    streams = [read_at(ticket, location) for location in cluster.replicas]
    assert streams[0] == streams[1] == streams[2]
    assert len(streams[0]) == 2000


def test_a_replica_killed_mid_stream_is_replaced_without_changing_the_stream(
    cluster: Project,
) -> None:
    client = DatasetClient(cluster.replicas, retries=4, backoff=0.2)
    epoch_len = 300_000  # 300k draws of 1 KiB: the kill lands mid-stream
    expected = _ids(client.epoch("demo", SEED, 3, epoch_len=epoch_len, batches=True))
    stream = client.epoch("demo", SEED, 3, epoch_len=epoch_len, batches=True)
    delivered = _ids([next(stream)])
    docker("kill", cluster.container("s3-replica-1"))
    delivered.extend(_ids(stream))
    assert delivered == expected
    assert client.failovers, "the stream never failed over"
    cluster.compose("up", "-d", "--no-deps", "s3-replica-1")
    _wait_healthy(cluster.replicas[0])


def test_concurrent_activations_through_two_replicas_each_take_their_own_turn(
    cluster: Project,
) -> None:
    table = DatasetClient([cluster.replicas[0]]).get_metadata("demo")
    log_prefix = next(
        k.rsplit("/", 1)[0] + "/" for k in keys(cluster, "state/demo/") if "/active/" in k
    )
    for round_ in range(3):
        before = keys(cluster, log_prefix)
        acknowledged: dict[str, str] = {}
        errors: list[BaseException] = []

        def activate(
            location: str,
            weight: float,
            acknowledged: dict[str, str] = acknowledged,
            errors: list[BaseException] = errors,
        ) -> None:
            try:
                reweighted = table.with_columns(pl.lit(weight).alias("weight"))
                acknowledged[location] = DatasetClient([location]).update_metadata(
                    "demo", reweighted
                )
            except BaseException as error:
                errors.append(error)

        threads = [
            threading.Thread(target=activate, args=(cluster.replicas[i], 2.0 + 2 * round_ + i))
            for i in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not errors, errors
        assert len(set(acknowledged.values())) == 2
        # Each acknowledged activation took its own entry of the log: two more,
        # one per population, and the newer of them is the active one everywhere.
        after = keys(cluster, log_prefix)
        new = after[len(before) :]
        assert after[: len(before)] == before
        assert len(new) == 2, (before, after)
        entries = [
            json.loads(s3(cluster).get_object(Bucket="datasets", Key=k)["Body"].read()) for k in new
        ]
        assert {e["population"] for e in entries} == set(acknowledged.values())
        wait_active_everywhere(cluster, entries[-1]["population"])


def test_a_cold_replica_warms_its_mirror_and_streams_what_a_warm_one_does(
    cluster: Project,
) -> None:
    ticket = pinned_ticket(cluster, 8)
    warm_location, cold_location = cluster.replicas[1], cluster.replicas[2]
    expected = read_at(ticket, warm_location)  # warms replica 2, if it was not
    cluster.compose("up", "-d", "--no-deps", "--force-recreate", "s3-replica-3")
    _wait_healthy(cold_location)
    assert mirrored_shard_bytes(cluster, "s3-replica-3") == 0, "a recreated replica starts cold"
    timings = {}
    for name, location in (("cold", cold_location), ("warm", warm_location)):
        started = time.perf_counter()
        assert read_at(ticket, location) == expected, name
        timings[name] = time.perf_counter() - started
    # The first read warms it.
    wait_mirrored(cluster, "s3-replica-3")
    started = time.perf_counter()
    assert read_at(ticket, cold_location) == expected
    timings["the same replica again"] = time.perf_counter() - started
    print("epoch seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in timings.items()))


def test_a_bucket_cut_off_is_unavailable_then_recovers(cluster: Project) -> None:
    client = DatasetClient([cluster.replicas[0]])
    table = client.get_metadata("demo")
    active = str(client.populations("demo")["active"]["population"])
    # A ticket pins its population; this replica has it and the shards mirrored.
    ticket = pinned_ticket(cluster, 4)
    expected = read_at(ticket, cluster.replicas[0])
    wait_mirrored(cluster, cluster.replica_services[0])
    store = cluster.container("object-store")
    docker("network", "disconnect", cluster.network(), store)
    try:
        # What the mirror holds is served on without the store.
        assert read_at(ticket, cluster.replicas[0]) == expected
        time.sleep(1.5)  # past the activation log's poll: the next read asks the store
        started = time.monotonic()
        with pytest.raises(flight.FlightUnavailableError, match="object storage"):
            client.update_metadata("demo", table.with_columns(pl.lit(9.0).alias("weight")))
        print(f"activation refused after {time.monotonic() - started:.1f} s")
        # Every replica shares the store, so the client's failover finds none.
        with pytest.raises(EveryLocationFailedError, match=r"Unavailable.*object storage"):
            DatasetClient(cluster.replicas).epoch_info("demo", SEED, 9)
        code, body = http_get(f"{cluster.replica_probes[0]}/readyz")
        assert code == 503, (code, body)
        assert "object storage" in body
        assert SECRET_KEY not in body
        # Alive, only not ready: nothing for an orchestrator to restart.
        assert http_get(f"{cluster.replica_probes[0]}/healthz") == (200, "ok\n")
    finally:
        # Back under its service name, as compose had attached it.
        docker("network", "connect", "--alias", "object-store", cluster.network(), store)
    # Recovery without a restart; nothing was lost or changed.
    wait_http_ok(f"{cluster.replica_probes[0]}/readyz", timeout=60)
    assert active_everywhere(cluster) == [active] * 3
    population = client.update_metadata("demo", table.with_columns(pl.lit(9.0).alias("weight")))
    wait_active_everywhere(cluster, population)
    assert len(_ids(client.epoch("demo", SEED, 9, batches=True))) == 2000
