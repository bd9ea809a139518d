"""docs/training.md's example, executed: a DDP run with ``torchrun`` against the
demo server crashes after a checkpoint, and resumes at another world size and
worker count to the end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from flight.test_server_cli import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
TIMEOUT = 300


def torchrun(ranks: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={ranks}",
            str(EXAMPLE),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def test_the_guides_training_loop_crashes_and_resumes_at_another_world_size(
    tmp_path: Path,
) -> None:
    checkpoint = tmp_path / "train.pt"
    with ServerProcess(["--port", "0", "--data-dir", str(tmp_path / "data")]) as server:
        location = server.location()
        common = ["--location", location, "--checkpoint", str(checkpoint), "--epochs", "2"]
        crashed = torchrun(2, *common, "--balance-at", "5", "--crash-after", "20")
        assert crashed.returncode != 0, crashed.stdout + crashed.stderr
        assert "balanced classes from position" in crashed.stdout, crashed.stderr
        saved = torch.load(checkpoint, weights_only=True)
        assert saved["step"] == 20
        state = saved["loader"]
        # 20 steps of 2 ranks x 32 samples; the switch at step 5 is in the state.
        assert (state["epoch"], state["position"]) == (0, 20 * 2 * 32)
        assert [segment[0] for segment in state["segments"]] == [0, 5 * 2 * 32]

        resumed = torchrun(3, *common, "--workers", "1")
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert "resumed at step 20: epoch 0, position 1280" in resumed.stdout
        assert "epoch 1 done" in resumed.stdout
