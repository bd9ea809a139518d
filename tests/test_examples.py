"""The example programs users already run (``../shared/examples/``) run unmodified."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1].parent / "shared" / "examples"
BALANCE = EXAMPLES / "balance.py"

EPOCH_LEN = 120
# Two classes reweighted to equal total weight: each draw is label 1 with p = 1/2.
# Five binomial standard deviations either side of the mean.
BOUND = 5 * math.sqrt(EPOCH_LEN * 0.5 * 0.5)


def _run_balance(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BALANCE)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _table_rows(stdout: str) -> list[tuple[int, float]]:
    """The data rows of the printed Polars table (between the ``╞═`` and ``└─`` rules)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("╞"))
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("└"):
            break
        cells = [cell.strip() for cell in line.strip("│").split("┆")]
        rows.append((int(cells[0]), float(cells[1])))
    return rows


def _observed_counts(stdout: str) -> tuple[int, int]:
    match = re.search(r"^Observed class counts: \[(\d+), (\d+)\]$", stdout, re.MULTILINE)
    assert match is not None, stdout
    return int(match.group(1)), int(match.group(2))


def _tree_state(root: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``root`` with its size and modification time."""
    return {
        str(path.relative_to(root)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in sorted(root.rglob("*"))
    }


def _check_output(result: subprocess.CompletedProcess[str]) -> tuple[int, int]:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    # The progress bar draws only on a terminal; a captured stderr stays silent.
    assert result.stderr == ""

    assert "shape: (2, 2)" in result.stdout
    rows = _table_rows(result.stdout)
    assert sorted(label for label, _ in rows) == [0, 1]
    for _, weight_sum in rows:
        assert math.isclose(weight_sum, 1.0, rel_tol=1e-9)

    majority, minority = _observed_counts(result.stdout)
    assert majority + minority == EPOCH_LEN
    for count in (majority, minority):
        assert abs(count - EPOCH_LEN / 2) <= BOUND, (majority, minority)
    return majority, minority


def test_balance_example_runs_twice_and_reuses_its_cache(tmp_path: Path) -> None:
    assert BALANCE.is_file(), BALANCE

    first = _run_balance(tmp_path)
    first_counts = _check_output(first)

    cache_root = tmp_path / "cache_balance"
    assert cache_root.is_dir()
    assert [p.name for p in cache_root.iterdir()] == ["imbalanced_v1"]
    before = _tree_state(cache_root)
    assert any(not name.startswith(".") for name in before)

    second = _run_balance(tmp_path)
    second_counts = _check_output(second)

    # Same seed, same cache, same population: the same draws.
    assert second_counts == first_counts
    assert sorted(_table_rows(second.stdout)) == sorted(_table_rows(first.stdout))
    # The cache was reused as it was: nothing written, renamed or added.
    assert _tree_state(cache_root) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache_balance"]
