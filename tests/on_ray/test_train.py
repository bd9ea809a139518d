"""Ray Train resumes exactly (issue 48, deliverable 4): examples/ray_train.py on the
session's two-node Ray cluster. A run of 2 workers loses rank 1 (``os._exit``) right
after a checkpoint; Ray Train restarts the workers from its latest checkpoint; a
second run resumes the first one's final checkpoint with 3 workers. The audit of
the last state (``--seen``) equals, sample for sample, what the workers delivered up
to each checkpoint they resumed from: no sample twice, none skipped.

Heavy (two Ray Train runs, about 4 minutes on 2 cores): ``-m slow``, run by
``.ci/run`` (``make test-ray``)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from test_examples import REPO_EXAMPLES

import dataset_rt as drt
from dataset_rt.parts import DatasetWrite

pytest.importorskip("ray")
pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EXAMPLE = REPO_EXAMPLES / "ray_train.py"
ROWS, PARTS, EPOCH_LEN = 20_000, 4, 2048


def write_dataset(location: Path) -> None:
    """What examples/ray_write.py writes, in this process."""
    runtime = drt.DatasetRuntime(num_workers=2)
    write = DatasetWrite.begin(location)
    per = ROWS // PARTS
    parts = []
    for p in range(PARTS):
        ids = range(p * per, (p + 1) * per)
        rows = pa.table(
            {
                "image": [i.to_bytes(8, "little") * 8 for i in ids],
                "label": pa.array([i % 10 for i in ids], pa.int64()),
            }
        )
        parts.append(
            write.write_part(
                f"part-{p:05d}",
                rows,
                payload_column="image",
                runtime=runtime,
                writer_config=drt.WriterConfig(show_progress=False),
            )
        )
    write.commit(parts, name="images")


def train(cwd: Path, address: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--address", address, "--epoch-len", str(EPOCH_LEN), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def delivered(log_dir: Path) -> list[tuple[int, int, int, int]]:
    """(epoch, position, cache_id, sample_id) of every sample a run's state counts:
    of each worker process that was replaced, the steps before its successor's
    first step (the checkpoint it resumed from); of the last, every step."""
    attempts: dict[int, list[list[dict[str, Any]]]] = {}
    for log in log_dir.glob("rank*.jsonl"):
        rank = int(log.name.split("-")[0].removeprefix("rank"))
        records = [json.loads(line) for line in log.read_text().splitlines()]
        attempts.setdefault(rank, []).append(records)
    rows = []
    for runs in attempts.values():
        runs.sort(key=lambda records: records[0]["step"])
        for i, records in enumerate(runs):
            until = runs[i + 1][0]["step"] if i + 1 < len(runs) else None
            for record in records:
                if until is not None and record["step"] >= until:
                    continue
                for position, (cache_id, sample_id) in zip(
                    record["positions"], record["ids"], strict=True
                ):
                    rows.append((record["epoch"], position, cache_id, sample_id))
    return rows


def test_a_killed_ray_train_worker_resumes_exactly_also_on_more_workers(
    ray_cluster: Any, tmp_path: Path
) -> None:
    write_dataset(tmp_path / "datasets" / "images")
    first = train(tmp_path, ray_cluster.address, "--kill-at", "12", "--output", "first")
    assert "done: 2 workers" in first
    assert (tmp_path / "first.log" / "killed").exists()
    # Rank 1 ran twice: the killed process and its replacement.
    assert len(list((tmp_path / "first.log").glob("rank1-*.jsonl"))) == 2
    second = train(
        tmp_path,
        ray_cluster.address,
        "--workers", "3", "--epochs", "3", "--resume-from", "first.ckpt", "--output", "second",
    )  # fmt: skip
    assert "done: 3 workers" in second

    # Every run's first records continue where the checkpoint it resumed from ends.
    seen = delivered(tmp_path / "first.log") + delivered(tmp_path / "second.log")
    audit = subprocess.run(
        [
            sys.executable, "-m", "dataset_rt", "audit", "second.pt", "--seen",
            "--cache", "datasets/images", "--state-dir", "datasets/images.state",
            "--manifest", "seen.parquet",
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert audit.returncode == 0, audit.stderr
    manifest = pl.read_parquet(tmp_path / "seen.parquet")
    audited = list(manifest.select("epoch", "position", "cache_id", "sample_id").iter_rows())
    duplicates = [row for row, n in Counter(seen).items() if n > 1]
    assert duplicates == []
    assert sorted(seen) == sorted(audited)  # 0 missing, 0 extra, 0 wrong sample
    # Whole epochs were consumed once each: every position of epochs 0 and 1.
    for epoch in (0, 1):
        positions = sorted(p for e, p, _, _ in seen if e == epoch)
        assert positions == list(range(epoch * EPOCH_LEN, (epoch + 1) * EPOCH_LEN))
