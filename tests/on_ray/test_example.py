"""examples/ray_write.py runs as its docstring says, twice in a fresh directory, on
the session's two-node Ray cluster (tests/on_ray/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_examples import REPO_EXAMPLES, _documented_output, _tree_state
from test_readme import _matches

pytest.importorskip("ray")

EXAMPLE = REPO_EXAMPLES / "ray_write.py"


def test_the_ray_example_runs_twice_and_prints_its_doc(ray_cluster: Any, tmp_path: Path) -> None:
    documented = _documented_output(EXAMPLE)
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(EXAMPLE), "--address", ray_cluster.address],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert _matches(documented, done.stdout), done.stdout
        runs.append((done.stdout, _tree_state(tmp_path)))
    (first, written), (second, after) = runs
    assert second == first
    assert after == written  # the second run only opened the committed dataset
