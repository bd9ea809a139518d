"""End to end in real containers: the image, both compose profiles, replicas,
failover, network partitions and a shared population store.

Run with ``uv run pytest -m e2e``. Needs a Docker engine with Compose; the image
is built from this checkout on a local Debian base (docker/build-base-image.sh),
so no registry is needed. Every container, network and volume is removed at the
end (compose project names are unique per run).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.flight as flight
import pytest
from prometheus_client.parser import text_string_to_metric_families

import dataset_rt as drt
from flight_client import DatasetClient
from flight_server.demo import DemoSource

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

ROOT = Path(__file__).parents[2]
IMAGE = os.environ.get("DATASET_RT_E2E_IMAGE", "dataset-rt-flight:e2e")
BASE = os.environ.get("DATASET_RT_E2E_BASE", "dataset-rt-base:local")
CEPH_IMAGE = os.environ.get("DATASET_RT_E2E_CEPH_IMAGE", "dataset-rt-ceph:local")
SEED = 11


def _compose_command() -> list[str] | None:
    if (
        shutil.which("docker")
        and subprocess.run(
            ["docker", "compose", "version"], capture_output=True, check=False
        ).returncode
        == 0
    ):
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


COMPOSE = _compose_command()
if (
    COMPOSE is None
    or subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0
):
    pytest.skip("no Docker engine with Compose on this machine", allow_module_level=True)


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@functools.cache
def build_image() -> str:
    """Build the base and the project image once per test process (every module
    that uses the `image` fixture gets its own fixture instance)."""
    subprocess.run(["bash", "docker/build-base-image.sh", BASE], cwd=ROOT, check=True)
    subprocess.run(["bash", "docker/build-image.sh", IMAGE, BASE], cwd=ROOT, check=True)
    return IMAGE


@functools.cache
def build_ceph_image() -> str:
    """The object store's image (Ceph from Debian's packages), once per test process."""
    subprocess.run(["bash", "docker/build-ceph-image.sh", CEPH_IMAGE], cwd=ROOT, check=True)
    return CEPH_IMAGE


@pytest.fixture(scope="session")
def image() -> str:
    return build_image()


REPLICAS = 3


class Project:
    """One compose project (unique name, own ports) that is always torn down.

    Every published port is a free one chosen here (Flight and the metrics side
    port, of the default server and of each replica, and the object store's), so
    projects never collide. The replicas of the ``object-store`` profile are the
    services ``s3-replica-N``; those of ``replicated`` are ``replica-N``.
    """

    def __init__(self, image: str, profile: str) -> None:
        self.name = f"drte2e{uuid.uuid4().hex[:8]}"
        self.profile = profile
        ports = _free_ports(2 * (1 + REPLICAS) + 1)
        flight_ports, metrics_ports = ports[: 1 + REPLICAS], ports[1 + REPLICAS : -1]
        self.env = {
            **os.environ,
            "FLIGHT_IMAGE": image,
            "OBJECT_STORE_IMAGE": CEPH_IMAGE,
            "COMPOSE_PROFILES": profile,
            "FLIGHT_PORT": str(flight_ports[0]),
            "METRICS_PORT": str(metrics_ports[0]),
            "OBJECT_STORE_PORT": str(ports[-1]),
        }
        #: The object store's S3 endpoint as the host reaches it (object-store profile).
        self.object_store = f"http://127.0.0.1:{ports[-1]}"
        prefix = "s3-" if profile == "object-store" else ""
        self.replica_services = [f"{prefix}replica-{i}" for i in range(1, 1 + REPLICAS)]
        self.replicas: list[str] = []
        #: The metrics side port (``http://127.0.0.1:PORT``) of each replica.
        self.replica_probes: list[str] = []
        for i in range(1, 1 + REPLICAS):
            port, metrics = flight_ports[i], metrics_ports[i]
            self.env[f"REPLICA_{i}_PORT"] = str(port)
            self.env[f"REPLICA_{i}_URI"] = f"grpc://127.0.0.1:{port}"
            self.env[f"REPLICA_{i}_METRICS_PORT"] = str(metrics)
            self.replicas.append(f"grpc://127.0.0.1:{port}")
            self.replica_probes.append(f"http://127.0.0.1:{metrics}")
        self.default_location = f"grpc://127.0.0.1:{flight_ports[0]}"
        self.default_probes = f"http://127.0.0.1:{metrics_ports[0]}"

    def compose(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``docker compose ARGS`` in this project; with ``check``, a failure
        raises with compose's own output and the services' recent logs."""
        assert COMPOSE is not None
        base = [*COMPOSE, "-p", self.name, "--profile", self.profile]
        done = subprocess.run(
            [*base, *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=600
        )
        if check and done.returncode != 0:
            logs = subprocess.run(
                [*base, "logs", "--no-color", "--tail", "40"],
                cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            raise RuntimeError(
                f"docker compose {' '.join(args)} failed ({done.returncode}):\n"
                f"{done.stderr[-3000:]}\n--- service logs ---\n{logs.stdout[-6000:]}"
            )
        return done

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).stdout.strip()

    def network(self) -> str:
        return f"{self.name}_default"

    def up(self) -> None:
        self.compose("up", "-d")
        locations = [self.default_location] if self.profile == "default" else self.replicas
        for location in locations:
            _wait_healthy(location)

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", check=False)


def _wait_healthy(location: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with flight.connect(location) as client:
                options = flight.FlightCallOptions(timeout=2)
                list(client.do_action(flight.Action("health", b""), options=options))
            return
        except Exception as error:
            last = error
            time.sleep(0.5)
    raise TimeoutError(f"{location} did not become healthy: {last}")


def health_status(container: str) -> str:
    """The container's healthcheck status in ``docker inspect`` (``starting``, ...)."""
    return subprocess.run(
        ["docker", "inspect", "-f", "{{.State.Health.Status}}", container],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()


def wait_container_healthy(container: str, timeout: float = 90) -> str:
    """Poll ``docker inspect`` until the compose healthcheck says ``healthy``
    (bounded in time; returns the last status seen)."""
    deadline = time.monotonic() + timeout
    status = health_status(container)
    while status != "healthy" and time.monotonic() < deadline:
        time.sleep(1)
        status = health_status(container)
    return status


def http_get(url: str) -> tuple[int, str]:
    """Status and body of a GET (an HTTP error status is an answer, not an exception)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode(errors="replace")


def wait_http_ok(url: str, timeout: float = 60) -> str:
    """The body of ``url`` once it answers 200 (polled, bounded in time)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            code, body = http_get(url)
            if code == 200:
                return body
            last = (code, body)
        except OSError as error:  # not listening yet
            last = error
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer 200 in {timeout} s: {last}")


def scrape(probes: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` parsed: (sample name, sorted labels) -> value."""
    code, text = http_get(f"{probes}/metrics")
    assert code == 200, (code, text)
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample_sum(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(
        value
        for (sample, have), value in samples.items()
        if sample == name and labels.items() <= dict(have).items()
    )


@pytest.fixture
def default_project(image: str) -> Iterator[Project]:
    project = Project(image, "default")
    try:
        project.up()
        yield project
    finally:
        project.down()


@pytest.fixture(scope="module")
def cluster(image: str) -> Iterator[Project]:
    project = Project(image, "replicated")
    try:
        project.up()
        yield project
    finally:
        project.down()


@pytest.fixture(scope="module")
def library_epoch(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int, int]]:
    """Epoch 0 of the demo as a single-process library iterator gives it."""
    runtime = drt.DatasetRuntime(num_workers=2)
    base = tmp_path_factory.mktemp("library")
    result = runtime.from_cache_sources(
        DemoSource(),
        base,
        reader_config=drt.ReaderConfig(seed=SEED),
        writer_config=drt.WriterConfig(show_progress=False),
    )
    assert isinstance(result, drt.CacheSourcesDatasetSuccess), result
    return [(s.cache_id, s.sample_id) for s in result.dataset]


def _ids(batches: Iterable[Any]) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    for batch in batches:
        columns = batch.to_pydict()
        out.extend(zip(columns["position"], columns["cache_id"], columns["sample_id"], strict=True))
    return out


def test_default_profile_serves_the_demo_to_a_plain_pyarrow_client(
    default_project: Project,
) -> None:
    probes = default_project.default_probes  # the metrics side port, from the host
    assert wait_http_ok(f"{probes}/healthz") == "ok\n"
    assert wait_http_ok(f"{probes}/readyz") == "ready\n"
    client = flight.connect(default_project.default_location)
    assert [info.descriptor.path for info in client.list_flights()] == [[b"demo"]]
    command = {"dataset": "demo", "seed": SEED, "epoch": 0}
    info = client.get_flight_info(flight.FlightDescriptor.for_command(json.dumps(command)))
    table = client.do_get(info.endpoints[0].ticket).read_all()
    assert table.num_rows == info.total_records == 2000
    # A do_get is counted when its stream ends on the server: poll briefly.
    deadline = time.monotonic() + 15
    while True:
        samples = scrape(probes)
        ok_gets = sample_sum(samples, "datasetrt_requests_total", method="do_get", status="OK")
        served = sample_sum(samples, "datasetrt_rows_served_total", dataset="demo")
        if (ok_gets >= 1 and served == table.num_rows) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert ok_gets >= 1, f'datasetrt_requests_total{{method="do_get",status="OK"}} is {ok_gets}'
    assert served == table.num_rows, (
        f'datasetrt_rows_served_total{{dataset="demo"}} is {served}, read {table.num_rows}'
    )
    status = wait_container_healthy(default_project.container("flight"))
    assert status == "healthy", (
        f"the compose healthcheck (flight_server.health on /readyz) says {status!r}"
    )


def test_every_replica_is_healthy_by_the_readyz_healthcheck(cluster: Project) -> None:
    for service, probes in zip(
        [f"replica-{i}" for i in range(1, 1 + REPLICAS)], cluster.replica_probes, strict=True
    ):
        assert wait_http_ok(f"{probes}/readyz") == "ready\n", service
        status = wait_container_healthy(cluster.container(service))
        assert status == "healthy", (
            f"{service}: the compose healthcheck (flight_server.health on /readyz) says {status!r}"
        )


def test_four_ranks_over_three_replicas_read_the_library_epoch(
    cluster: Project, library_epoch: list[tuple[int, int]]
) -> None:
    client = DatasetClient(cluster.replicas)
    info = client.epoch_info("demo", SEED, 0, partition=drt.Partition(world_size=4))
    for endpoint in info.endpoints:
        advertised = sorted(loc.uri.decode() for loc in endpoint.locations)
        assert advertised == sorted(cluster.replicas)
    quarters = [drt.Partition(rank=r, world_size=4) for r in range(4)]
    per_rank = [_ids(client.epoch("demo", SEED, 0, partition=q, batches=True)) for q in quarters]
    delivered = sorted(row for rank in per_rank for row in rank)
    assert [p for p, _, _ in delivered] == list(range(2000))  # 2000 = 4 x 500: every position
    assert [(c, s) for _, c, s in delivered] == library_epoch


def test_a_replica_killed_mid_stream_is_replaced_without_changing_the_stream(
    cluster: Project,
) -> None:
    client = DatasetClient(cluster.replicas, retries=4, backoff=0.2)
    # 300k draws of 1 KiB: far more than gRPC buffers, so the kill lands mid-stream.
    epoch_len = 300_000
    expected = _ids(client.epoch("demo", SEED, 3, epoch_len=epoch_len, batches=True))
    stream = client.epoch("demo", SEED, 3, epoch_len=epoch_len, batches=True)
    delivered = _ids([next(stream)])
    subprocess.run(
        ["docker", "kill", cluster.container("replica-1")], check=True, capture_output=True
    )
    killed_at = time.monotonic()
    arrivals: list[float] = []
    for batch in stream:
        arrivals.append(time.monotonic())
        delivered.extend(_ids([batch]))
    assert delivered == expected
    assert client.failovers, "the stream never failed over"
    failed_at = client.failovers[0][0]
    resumed = next(t for t in arrivals if t > failed_at)
    print(f"failover: {(resumed - killed_at) * 1000:.0f} ms from docker kill to the next batch")
    cluster.compose("up", "-d", "replica-1")
    _wait_healthy(cluster.replicas[0])


def test_a_partitioned_replica_is_routed_around_and_serves_again(cluster: Project) -> None:
    client = DatasetClient(cluster.replicas, retries=4, backoff=0.2)
    expected = _ids(client.epoch("demo", SEED, 5, batches=True))
    container = cluster.container("replica-2")
    subprocess.run(
        ["docker", "network", "disconnect", cluster.network(), container],
        check=True,
        capture_output=True,
    )
    try:
        # Rank 1 of 3 starts at replica-2, which is now unreachable.
        third = drt.Partition(rank=1, world_size=3)
        partitioned = _ids(client.epoch("demo", SEED, 5, partition=third, batches=True))
        full = _ids(client.epoch("demo", SEED, 5, partition=third, batches=True))
        assert partitioned == full
    finally:
        subprocess.run(
            ["docker", "network", "connect", cluster.network(), container],
            check=True,
            capture_output=True,
        )
    _wait_healthy(cluster.replicas[1])
    direct = DatasetClient([cluster.replicas[1]], retries=1)
    assert _ids(direct.stream_ticket(_ticket(client, 5), [cluster.replicas[1]])) == expected


def _ticket(client: DatasetClient, epoch: int) -> dict[str, Any]:
    info = client.epoch_info("demo", SEED, epoch)
    return dict(json.loads(info.endpoints[0].ticket.ticket))


def test_a_population_put_through_one_replica_streams_identically_from_another(
    cluster: Project,
) -> None:
    first = DatasetClient([cluster.replicas[0]])
    second = DatasetClient([cluster.replicas[2]])
    table = first.get_metadata("demo")
    balanced = table.with_columns((1.0 / pl.len().over("label")).alias("weight"))
    population = first.update_metadata("demo", balanced)
    assert population in second.populations("demo")["populations"]
    via_first = _ids(first.epoch("demo", SEED, 1, population=population, batches=True))
    via_second = _ids(second.epoch("demo", SEED, 1, population=population, batches=True))
    assert via_first == via_second
    assert second.get_metadata("demo", population=population).equals(
        first.get_metadata("demo", population=population)
    )


def test_concurrent_puts_through_different_replicas_never_corrupt_the_store(
    cluster: Project,
) -> None:
    table = DatasetClient([cluster.replicas[0]]).get_metadata("demo")
    ids: list[str] = []
    errors: list[BaseException] = []

    def put(location: str, scale: float) -> None:
        try:
            reweighted = table.with_columns((pl.col("weight") * scale).alias("weight"))
            ids.append(
                DatasetClient([location]).update_metadata("demo", reweighted, activate=False)
            )
        except BaseException as error:
            errors.append(error)

    threads = [
        threading.Thread(target=put, args=(cluster.replicas[i % 3], 1.0 + i % 2)) for i in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    assert len(set(ids)) == 2
    reader = DatasetClient([cluster.replicas[1]])
    for population in set(ids):
        assert reader.get_metadata("demo", population=population).height == 2000


def test_an_unknown_population_is_not_found_on_every_replica(cluster: Project) -> None:
    for location in cluster.replicas:
        with pytest.raises(KeyError, match="not in the store"):
            list(DatasetClient([location]).epoch("demo", SEED, 0, population="f" * 32))
