"""Real data-parallel runs: ``torch.distributed`` (gloo, CPU) ranks as separate
processes, each with DataLoader workers, against a real Flight server and the
in-process library. Runs are killed with SIGKILL and resumed from the saved
loader state at other world sizes and worker counts.

What is held: every position the partition rule covers is consumed exactly
once across the killed run and its resumption, none twice, none lost; each
position's sample is the uninterrupted run's; with the same world and workers
every rank's batch sequence is the uninterrupted one; a mid-run population
switch survives the kill; a replica killed mid-epoch changes nothing.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch
from flight.test_failover import rows_sent, two_servers
from flight.test_server_cli import ServerProcess

from dataset_rt.loader import LocalSource, StreamSource
from dataset_rt.torch import DatasetLoader
from flight_client import FlightSource

from .conftest import BIG_RECORDS, DATASET, RECORDS, SEED

RANK_PROGRAM = Path(__file__).with_name("ddp_rank.py")
BATCH = 8
RUN_TIMEOUT = 180.0
Record = dict[str, Any]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Face:
    """How ranks reach the data: a spec fragment and a source for the test itself."""

    name: str
    spec: dict[str, Any]
    source: StreamSource


@dataclass
class Run:
    logs: list[list[Record]]  # per rank: the step records, in order
    switches: list[Record]

    def consumed(self, before_step: int | None = None) -> list[tuple[int, tuple[int, int]]]:
        return [
            (p, (i[0], i[1]))
            for records in self.logs
            for r in records
            if before_step is None or r["step"] < before_step
            for p, i in zip(r["positions"], r["ids"], strict=True)
        ]

    def sequence(self, rank: int, before_step: int | None = None) -> list[list[int]]:
        return [
            r["positions"]
            for r in self.logs[rank]
            if before_step is None or r["step"] < before_step
        ]


def launch(
    tmp: Path, name: str, face: Face, world_size: int, workers: int, **spec: Any
) -> list[subprocess.Popen[bytes]]:
    """Start ``world_size`` rank processes (each its own process group, so a kill
    takes its DataLoader workers too)."""
    body = face.spec | {
        "dataset": DATASET,
        "seed": SEED,
        "batch_size": BATCH,
        "workers": workers,
        "log": str(tmp / name),
    }
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(body | spec))
    port = free_port()
    processes = []
    for rank in range(world_size):
        env = dict(os.environ) | {
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        processes.append(
            subprocess.Popen(
                [sys.executable, str(RANK_PROGRAM), str(path)],
                env=env,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
            )
        )
    return processes


def read_run(tmp: Path, name: str, world_size: int) -> Run:
    logs: list[list[Record]] = []
    switches: list[Record] = []
    for rank in range(world_size):
        path = tmp / f"{name}.rank{rank}"
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        logs.append([r for r in lines if "step" in r])
        switches += [r for r in lines if "switch" in r]
    return Run(logs, switches)


def finish(processes: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT
    try:
        for process in processes:
            code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
            assert code == 0, f"a rank exited with {code}"
    finally:
        kill(processes)


def kill(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def run(tmp: Path, name: str, face: Face, world_size: int, workers: int, **spec: Any) -> Run:
    finish(launch(tmp, name, face, world_size, workers, **spec))
    return read_run(tmp, name, world_size)


def run_and_kill(
    tmp: Path, name: str, face: Face, world_size: int, workers: int, steps: int, **spec: Any
) -> tuple[Run, dict[str, Any]]:
    """Run until rank 0 checkpoints after ``steps`` steps, then SIGKILL every rank."""
    checkpoint = tmp / f"{name}.pt"
    processes = launch(
        tmp,
        name,
        face,
        world_size,
        workers,
        checkpoint_at=steps,
        checkpoint=str(checkpoint),
        linger=1.0,
        **spec,
    )
    deadline = time.monotonic() + RUN_TIMEOUT
    try:
        while not checkpoint.exists():
            assert all(p.poll() is None for p in processes), "a rank died before the checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within the time limit"
            time.sleep(0.05)
        time.sleep(0.5)  # the ranks go on past the checkpoint: that work is lost
        assert all(p.poll() is None for p in processes), "a rank ended before the kill"
    finally:
        kill(processes)
    saved = torch.load(checkpoint, weights_only=True)
    return read_run(tmp, name, world_size), dict(saved["loader"])


def reference(face: Face, state: dict[str, Any] | None = None) -> dict[int, tuple[int, int]]:
    """position -> ids of the whole epoch, read in one stream by a single rank with
    the same population segments (an uninterrupted run)."""
    whole = DatasetLoader(face.source, DATASET, batch_size=1, seed=SEED, columns=["label"])
    if state is not None:
        whole.load_state_dict(state | {"position": 0, "steps": 0})
    return {
        b["position"].tolist()[0]: (b["cache_id"].tolist()[0], b["sample_id"].tolist()[0])
        for b in whole
    }


def covered_end(start: int, world_size: int, length: int = RECORDS) -> int:
    """The end of what the rule covers from ``start`` (the worker count plays no part)."""
    return start + (length - start) // BATCH // world_size * world_size * BATCH


def check_exactly_once(
    consumed: list[tuple[int, tuple[int, int]]], end: int, truth: dict[int, tuple[int, int]]
) -> None:
    positions = [p for p, _ in consumed]
    assert len(positions) == len(set(positions)), "a position was consumed twice"
    assert sorted(positions) == list(range(end)), "a covered position was lost"
    wrong = [(p, ids) for p, ids in consumed if truth[p] != ids]
    assert not wrong, f"positions with another sample than the uninterrupted run: {wrong[:5]}"


# -- faces ------------------------------------------------------------------------


@contextmanager
def flight_face(cache: Path, root: Path) -> Iterator[Face]:
    with ServerProcess(
        [
            "--port",
            "0",
            "--dataset",
            f"{DATASET}={cache}",
            "--state-dir",
            str(root / "state"),
            "--data-dir",
            str(root / "data"),
        ]
    ) as server:
        location = server.location()
        yield Face("flight", {"face": "flight", "locations": [location]}, FlightSource(location))


@contextmanager
def local_face(cache: Path, root: Path) -> Iterator[Face]:
    state_dir = root / "state"
    yield Face(
        "local",
        {"face": "local", "caches": [str(cache)], "state_dir": str(state_dir)},
        LocalSource([cache], state_dir, name=DATASET),
    )


@pytest.fixture(params=["flight", "local"])
def face(request: pytest.FixtureRequest, cache: Path, tmp_path: Path) -> Iterator[Face]:
    opener = flight_face if request.param == "flight" else local_face
    with opener(cache, tmp_path / "service") as opened:
        yield opened


# -- the runs ---------------------------------------------------------------------


def test_killed_at_world_2_resumed_at_world_3_consumes_every_position_once(
    face: Face, tmp_path: Path
) -> None:
    steps = 6
    first, state = run_and_kill(tmp_path, "first", face, 2, 2, steps)
    assert state["position"] == steps * 2 * BATCH
    assert state["world_size"] == 2
    second = run(tmp_path, "second", face, 3, 1, resume=str(tmp_path / "first.pt"))
    consumed = first.consumed(before_step=steps) + second.consumed()
    check_exactly_once(consumed, covered_end(state["position"], 3), reference(face))


def test_resumed_with_the_same_world_each_rank_repeats_the_uninterrupted_sequence(
    face: Face, tmp_path: Path
) -> None:
    steps = 5
    whole = run(tmp_path, "whole", face, 2, 2)
    first, _ = run_and_kill(tmp_path, "first", face, 2, 2, steps)
    second = run(tmp_path, "second", face, 2, 2, resume=str(tmp_path / "first.pt"))
    for rank in range(2):
        resumed = first.sequence(rank, before_step=steps) + second.sequence(rank)
        assert resumed == whole.sequence(rank), f"rank {rank}"
    assert len(whole.sequence(0)) == RECORDS // BATCH // 2


def test_a_switch_before_the_checkpoint_is_reproduced_at_another_world_size(
    face: Face, tmp_path: Path
) -> None:
    switch_step, steps = 3, 7
    first, state = run_and_kill(tmp_path, "first", face, 2, 2, steps, switch_at=switch_step)
    at = switch_step * 2 * BATCH
    assert {s["switch"] for s in first.switches} == {at}, "the ranks disagree on the switch"
    assert [s[0] for s in state["segments"]] == [0, at]
    second = run(tmp_path, "second", face, 3, 2, resume=str(tmp_path / "first.pt"))
    consumed = first.consumed(before_step=steps) + second.consumed()
    check_exactly_once(consumed, covered_end(state["position"], 3), reference(face, state))
    labels = {
        p: label
        for run_ in (first, second)
        for records in run_.logs
        for r in records
        for p, label in zip(r["positions"], r["labels"], strict=True)
    }
    assert {labels[p] for p in labels if p >= at} == {2}
    assert len({labels[p] for p in labels if p < at}) > 1


def test_a_replica_killed_mid_epoch_changes_nothing_a_rank_receives(
    big_cache: Path, tmp_path: Path
) -> None:
    batch = 16
    with two_servers(big_cache, tmp_path, advertise=False) as servers:
        locations = [server.location() for server in servers]
        face = Face(
            "flight", {"face": "flight", "locations": locations}, FlightSource(locations[1])
        )
        truth = reference(face)
        whole = run(tmp_path, "whole", face, 2, 1, batch_size=batch)
        before = rows_sent(locations[1])
        processes = launch(tmp_path, "failover", face, 2, 1, batch_size=batch, step_sleep=0.05)
        try:
            deadline = time.monotonic() + RUN_TIMEOUT
            log = tmp_path / "failover.rank0"
            while not log.exists() or not log.read_text().strip():
                assert time.monotonic() < deadline, "the run made no progress"
                time.sleep(0.05)
            servers[0].kill()
            finish(processes)
        finally:
            kill(processes)
        failover = read_run(tmp_path, "failover", 2)
        # Rank 1 started on the survivor; rank 0's stream moved there mid-epoch.
        resumed = rows_sent(locations[1]) - before - BIG_RECORDS // 2
        assert resumed > 0, "rank 0's stream never failed over: the kill came too late"
    for rank in range(2):
        assert failover.sequence(rank) == whole.sequence(rank), f"rank {rank}"
    positions = sorted(p for p, _ in failover.consumed())
    assert positions == list(range(BIG_RECORDS))
    assert all(truth[p] == ids for p, ids in failover.consumed())


def test_the_loader_works_after_the_parent_used_a_flight_client_whatever_the_start_method(
    cache: Path, tmp_path: Path
) -> None:
    """A training script talks to the server, then starts a loader with workers,
    even with ``fork`` as the process-wide start method: it must not hang."""
    program = tmp_path / "fork_default.py"
    program.write_text(
        "import multiprocessing, sys\n"
        "from flight_client import DatasetClient\n"
        "from flight_client.torch import FlightLoader\n"
        "if __name__ == '__main__':\n"
        "    multiprocessing.set_start_method('fork')\n"
        "    location = sys.argv[1]\n"
        "    with DatasetClient(location) as client:\n"
        "        client.get_metadata('toy')\n"
        "        loader = FlightLoader(location, 'toy', batch_size=8, seed=1, num_workers=2)\n"
        "        print(sum(len(b['payload']) for b in loader))\n"
    )
    with flight_face(cache, tmp_path / "service") as opened:
        done = subprocess.run(
            [sys.executable, str(program), opened.spec["locations"][0]],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip()) == RECORDS // BATCH * BATCH


def test_a_loader_on_the_library_and_on_a_server_deliver_the_same_batches(
    cache: Path, tmp_path: Path
) -> None:
    with flight_face(cache, tmp_path / "service") as remote:
        local = LocalSource([cache], tmp_path / "local-state", name=DATASET)
        batches = [
            [
                (b["position"].tolist(), b["sample_id"].tolist())
                for b in DatasetLoader(
                    source, DATASET, batch_size=BATCH, seed=SEED, rank=1, world_size=3
                )
            ]
            for source in (remote.source, local)
        ]
    assert batches[0] == batches[1]


def test_a_switch_to_an_unknown_population_on_a_server_fails_at_once(
    cache: Path, tmp_path: Path
) -> None:
    with flight_face(cache, tmp_path / "service") as remote:
        run = DatasetLoader(remote.source, DATASET, batch_size=BATCH, seed=SEED)
        with pytest.raises(pa.ArrowKeyError, match="f" * 32):
            run.switch_population("f" * 32)
        assert len(run.segments) == 1
