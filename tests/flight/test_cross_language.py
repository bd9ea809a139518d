"""Cross-language proof: a Rust `arrow-flight` client sees what the Python client sees.

``flight_probe`` (a workspace crate) knows nothing but the protocol: it lists the
datasets, asks ``get_flight_info`` for an epoch split into ranks, streams one
rank's ticket and prints the row count and an FNV-1a 64 checksum of the
``(cache_id, sample_id)`` sequence. The same figures computed from
``flight_client.DatasetClient`` must match exactly.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import ListSource, make_records, write

import dataset_rt as drt
from flight_client import DatasetClient
from flight_server import Catalog, DatasetFlightServer, DatasetSpec
from flight_server.demo import ensure_demo_cache

REPO = Path(__file__).resolve().parents[2]
# A cold release build of arrow-flight, tonic and tokio takes minutes on a small machine.
BUILD_TIMEOUT = 1800
PROBE_TIMEOUT = 120

# The build runs in the first test's setup, so that test needs the build's time too.
pytestmark = pytest.mark.timeout(BUILD_TIMEOUT + 300)

FNV_OFFSET_BASIS = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
U64_MASK = 2**64 - 1


def fnv1a64(data: Iterable[int], state: int = FNV_OFFSET_BASIS) -> int:
    for byte in data:
        state = ((state ^ byte) * FNV_PRIME) & U64_MASK
    return state


def python_figures(batches: Iterable[pa.RecordBatch]) -> tuple[int, str]:
    """Rows and checksum of a stream: FNV-1a 64 over LE cache_id then LE sample_id per row."""
    rows, state = 0, FNV_OFFSET_BASIS
    for batch in batches:
        cache_ids = batch.column("cache_id").to_pylist()
        sample_ids = batch.column("sample_id").to_pylist()
        for cache_id, sample_id in zip(cache_ids, sample_ids, strict=True):
            state = fnv1a64(struct.pack("<QQ", cache_id, sample_id), state)
        rows += batch.num_rows
    return rows, f"{state:016x}"


@dataclass(frozen=True)
class ProbeOutput:
    datasets: list[str]
    rows: int
    checksum: str
    stdout: str


@pytest.fixture(scope="session")
def probe() -> Path:
    """The release ``flight_probe`` binary, built once per session."""
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.skip("cargo is not on PATH: cannot build the Rust flight_probe")
    try:
        build = subprocess.run(
            [cargo, "build", "--release", "-p", "flight_probe", "--message-format=json"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"cargo build -p flight_probe took longer than {BUILD_TIMEOUT} s")
    if build.returncode != 0:
        pytest.fail(f"cargo build -p flight_probe failed:\n{build.stderr[-4000:]}")
    for line in build.stdout.splitlines():
        message = json.loads(line) if line.startswith("{") else {}
        if (
            message.get("reason") == "compiler-artifact"
            and message.get("target", {}).get("name") == "flight_probe"
            and message.get("executable")
        ):
            return Path(message["executable"])
    pytest.fail(f"cargo build named no flight_probe executable:\n{build.stdout[-2000:]}")


@pytest.fixture(scope="module")
def location(
    tmp_path_factory: pytest.TempPathFactory, runtime: drt.DatasetRuntime
) -> Iterator[str]:
    """A server with two datasets: the demo cache, and ``pair`` of two caches (cache ids 0, 1)."""
    tmp = tmp_path_factory.mktemp("cross_language")
    demo = ensure_demo_cache(runtime, tmp)
    pair = tuple(
        write(tmp / "caches", ListSource(name, make_records(rows, payload_size=64, seed=seed)))
        for name, rows, seed in (("pair_a", 300, 1), ("pair_b", 200, 2))
    )
    catalog = Catalog(
        [DatasetSpec("demo", (demo,)), DatasetSpec("pair", pair)],
        tmp / "state",
        runtime,
    )
    with DatasetFlightServer(catalog, "grpc://127.0.0.1:0") as server:
        yield server.location


def run_probe(probe: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(probe), *args],
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT,
        check=False,
    )


def parse_probe(result: subprocess.CompletedProcess[str]) -> ProbeOutput:
    """The three closing lines: ``datasets: a,b``, ``rows: N``, ``checksum: 16 hex``."""
    assert result.returncode == 0, f"flight_probe failed:\n{result.stderr}"
    last = result.stdout.splitlines()[-3:]
    assert len(last) == 3, result.stdout
    keys = [line.partition(": ")[0] for line in last]
    assert keys == ["datasets", "rows", "checksum"], result.stdout
    datasets, rows, checksum = (line.partition(": ")[2] for line in last)
    assert len(checksum) == 16, checksum
    int(checksum, 16)
    return ProbeOutput(datasets.split(","), int(rows), checksum, result.stdout)


def test_fnv1a64_is_the_standard_function() -> None:
    assert fnv1a64(b"") == 0xCBF29CE484222325
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a64(b"foobar") == 0x85944171F73967E8


# (dataset, seed, epoch, rank, world_size, epoch_len)
CASES = [
    ("demo", 1, 0, 0, 1, None),
    ("demo", 7, 2, 1, 3, None),
    ("pair", 3, 1, 2, 4, 500),
    ("pair", 0, 5, 0, 2, 333),
]


@pytest.mark.parametrize(("dataset", "seed", "epoch", "rank", "world_size", "epoch_len"), CASES)
def test_rust_probe_matches_python_client(
    probe: Path,
    location: str,
    dataset: str,
    seed: int,
    epoch: int,
    rank: int,
    world_size: int,
    epoch_len: int | None,
) -> None:
    args = ["--location", location, "--dataset", dataset, "--seed", str(seed)]
    args += ["--epoch", str(epoch), "--world-size", str(world_size), "--rank", str(rank)]
    if epoch_len is not None:
        args += ["--epoch-len", str(epoch_len)]
    rust = parse_probe(run_probe(probe, *args))

    with DatasetClient(location) as client:
        assert rust.datasets == client.datasets() == ["demo", "pair"]
        batches = client.epoch(
            dataset,
            seed,
            epoch,
            partition=drt.Partition(rank=rank, world_size=world_size),
            epoch_len=epoch_len,
            batches=True,
        )
        rows, checksum = python_figures(batches)

    assert rows > 0
    if epoch_len is not None:  # every rank gets floor(L / w) samples
        assert rows == epoch_len // world_size
    assert (rust.rows, rust.checksum) == (rows, checksum), rust.stdout


def test_rust_probe_distinguishes_ranks_and_epochs(probe: Path, location: str) -> None:
    """The checksum is not a constant: other ranks and epochs give other figures."""
    base = ["--location", location, "--dataset", "pair", "--seed", "3"]
    figures = {
        (epoch, rank): parse_probe(
            run_probe(probe, *base, "--epoch", str(epoch), "--world-size", "2", "--rank", str(rank))
        ).checksum
        for epoch in (0, 1)
        for rank in (0, 1)
    }
    assert len(set(figures.values())) == len(figures), figures


def test_rust_probe_reports_errors_without_panicking(probe: Path, location: str) -> None:
    no_epoch = run_probe(probe, "--location", location, "--dataset", "demo", "--seed", "1")
    assert no_epoch.returncode == 2
    assert "--epoch is required" in no_epoch.stderr

    unknown = run_probe(
        probe, "--location", location, "--dataset", "nope", "--seed", "1", "--epoch", "0"
    )
    assert unknown.returncode == 1
    assert "get_flight_info failed" in unknown.stderr
    assert "nope" in unknown.stderr

    bad_rank = run_probe(
        probe, "--location", location, "--dataset", "demo", "--seed", "1", "--epoch", "0",
        "--world-size", "2", "--rank", "2",
    )  # fmt: skip
    assert bad_rank.returncode == 2
    assert "--rank 2 is not below --world-size 2" in bad_rank.stderr

    unreachable = run_probe(
        probe, "--location", "grpc://127.0.0.1:1", "--dataset", "demo", "--seed", "1",
        "--epoch", "0",
    )  # fmt: skip
    assert unreachable.returncode == 1
    assert "cannot connect to grpc://127.0.0.1:1" in unreachable.stderr

    for result in (no_epoch, unknown, bad_rank, unreachable):
        assert "panicked" not in result.stderr, result.stderr
