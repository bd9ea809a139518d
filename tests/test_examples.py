"""The example programs run as their users run them, twice in a fresh directory.

- ``examples/`` (the programs the README and docs point to): each one prints what
  its docstring shows, on a first run and on a second run in the same directory,
  which leaves the same files (``examples/train_ddp.py`` needs ``torchrun`` and a
  server: tests/training/test_guide.py runs it).
- ``../shared/examples/`` (programs users wrote against dataset-rt 0.4.8) run
  unmodified: the compatibility the project keeps.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_readme import _matches

REPO_EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# Run elsewhere, and why: they need more than `python example.py`.
RUN_ELSEWHERE = {
    "train_ddp.py": "needs torchrun and a server: tests/training/test_guide.py",
    "ray_write.py": "needs Ray: tests/on_ray/test_example.py",
    "ray_train.py": "needs Ray Train and a Ray cluster: tests/on_ray/test_train.py",
}
EXAMPLES = Path(__file__).resolve().parents[1].parent / "shared" / "examples"
BALANCE = EXAMPLES / "balance.py"
# The docstring's documented output: the indented block after a line that ends
# "prints ...:" (up to the docstring's end or the first unindented line).
DOCUMENTED = re.compile(r"prints[^\n]*:\n\n((?:    [^\n]*\n|\n)+)")


def _repo_examples() -> list[Path]:
    return sorted(p for p in REPO_EXAMPLES.glob("*.py") if p.name not in RUN_ELSEWHERE)


def _documented_output(example: Path) -> str:
    """What the example's docstring shows it prints."""
    docstring = example.read_text().split('"""')[1] + "\n"
    match = DOCUMENTED.search(docstring)
    assert match, f"{example.name}'s docstring shows no output (indented, after 'prints ...:')"
    lines = match.group(1).rstrip("\n").split("\n")
    return "".join(line.removeprefix("    ") + "\n" for line in lines)


def test_every_example_is_run() -> None:
    names = {p.name for p in REPO_EXAMPLES.glob("*.py")}
    assert "balance.py" in names
    assert set(RUN_ELSEWHERE) <= names, "an example run elsewhere is gone: update RUN_ELSEWHERE"


@pytest.mark.parametrize("example", _repo_examples(), ids=lambda p: p.name)
def test_example_runs_twice_in_a_fresh_directory_and_prints_its_doc(
    example: Path, tmp_path: Path
) -> None:
    documented = _documented_output(example)
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(example)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""  # no progress bar without a terminal, no warning
        assert _matches(documented, done.stdout), (
            f"{example.name} prints otherwise:\n{done.stdout}\nits docstring shows:\n{documented}"
        )
        runs.append((done.stdout, _tree_state(tmp_path)))
    (first, written), (second, after) = runs
    assert second == first
    # The second run reuses what the first wrote: nothing written, renamed or added.
    assert after == written


def test_the_balance_example_balances(tmp_path: Path) -> None:
    """What examples/balance.py shows, as a statistical statement: three classes of
    equal total weight, so each of 3000 draws is a class with p = 1/3."""
    done = subprocess.run(
        [sys.executable, str(REPO_EXAMPLES / "balance.py"), "--seed", "11"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    match = re.search(
        r"^drawn per class in 3000 samples: \[(\d+), (\d+), (\d+)\]$", done.stdout, re.M
    )
    assert match, done.stdout
    counts = [int(n) for n in match.groups()]
    assert sum(counts) == 3000
    bound = 5 * math.sqrt(3000 * (1 / 3) * (2 / 3))  # five binomial standard deviations
    assert all(abs(n - 1000) <= bound for n in counts), counts
    assert "weight per class: [1.0, 1.0, 1.0]" in done.stdout


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
