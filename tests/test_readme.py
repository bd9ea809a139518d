"""The README's examples run as a reader runs them and print what the README shows.

A reader follows the README top to bottom in a fresh directory, and then does it
again. So do these tests: every example runs in the README's order, all of them
in one fresh temporary directory, twice in a row. The second pass finds what the
first one left (caches, files, the server's populations) and must print the same.

What runs:

- every ```python block, each as its own program (a fresh namespace);
- every ```bash block followed by a ```text block (its documented output), one
  command a line, in a subprocess; ``uv run python`` runs as the test's own
  interpreter (``uv run`` would first sync the environment). The other shell
  blocks start servers, containers or builds, and are not run here.

An example's documented output is the ```text block right after it; a Python
example without one must print nothing. Printed output is compared exactly, with
two normalisations for values that legitimately vary:

- the test server's address (a free port) is written back as the README's
  ``grpc://127.0.0.1:8815``;
- ``...`` in a documented line stands for any text within that line (doctest's
  ELLIPSIS), e.g. a population id.

The Flight examples run against the Quick start's demo dataset served by one
fresh server for both passes, as a reader who runs the README twice against the
server they started would see them (the ``do_put`` example changes what later
examples read).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import dataset_rt as drt
from flight_server import Catalog, DatasetFlightServer, DatasetSpec
from flight_server.demo import DEMO_NAME, ensure_demo_cache

README = Path(__file__).parents[1] / "README.md"
README_LOCATION = "grpc://127.0.0.1:8815"
EXAMPLE = re.compile(r"```python\n(.*?)```(?:\s*```text\n(.*?)```)?", flags=re.DOTALL)
# A ```python or ```bash block and the ```text block of its output, if any.
BLOCK = re.compile(r"```(python|bash)\n(.*?)```(?:\s*```text\n(.*?)```)?", flags=re.DOTALL)
UV_RUN_PYTHON = ["uv", "run", "python"]
SHELL_TIMEOUT = 120  # seconds, per command


@dataclass(frozen=True)
class Example:
    line: int  # of the ```python (or ```bash) fence in README.md
    code: str
    output: str  # the documented output; "" when the example prints nothing
    language: str = "python"

    @property
    def needs_server(self) -> bool:
        return README_LOCATION in self.code


def _examples() -> list[Example]:
    """The README's examples that run, in the README's order."""
    text = README.read_text()
    examples = [
        Example(text.count("\n", 0, m.start()) + 1, m.group(2), m.group(3) or "", m.group(1))
        for m in BLOCK.finditer(text)
    ]
    return [e for e in examples if e.language == "python" or e.output]


def _run(example: Example, cwd: Path, location: str = README_LOCATION) -> str:
    """Run ``example`` in ``cwd`` against ``location``; what it printed, normalised."""
    if example.language == "bash":
        return _run_shell(example, cwd, location)
    code = example.code.replace(README_LOCATION, location)
    printed = io.StringIO()
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, f"{README}:{example.line}", "exec"), {"__name__": "__readme__"})
    finally:
        os.chdir(previous)
    return printed.getvalue().replace(location, README_LOCATION)


def _run_shell(example: Example, cwd: Path, location: str) -> str:
    """Run a shell example's commands in ``cwd``, one a line; their stdout, normalised."""
    printed = []
    for number, line in enumerate(example.code.splitlines()):
        words = shlex.split(line.replace(README_LOCATION, location), comments=True)
        if not words:
            continue
        where = f"README.md line {example.line + 1 + number}"
        assert words[: len(UV_RUN_PYTHON)] == UV_RUN_PYTHON, f"{where}: only `uv run python` runs"
        done = subprocess.run(
            [sys.executable, *words[len(UV_RUN_PYTHON) :]],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=SHELL_TIMEOUT,
            check=False,
        )
        assert done.returncode == 0, f"{where} exits {done.returncode}: {done.stderr}"
        printed.append(done.stdout)
    return "".join(printed).replace(location, README_LOCATION)


def _matches(documented: str, printed: str) -> bool:
    """``printed`` equals ``documented``, where ``...`` matches any text within a line."""
    pattern = "\n".join(
        ".*?".join(re.escape(part) for part in line.split("...")) for line in documented.split("\n")
    )
    return re.fullmatch(pattern, printed) is not None


def _check_output(example: Example, printed: str) -> None:
    if not _matches(example.output, printed):
        # The plain comparison fails and shows the difference.
        assert printed == example.output, f"README.md line {example.line} prints otherwise"


@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory: pytest.TempPathFactory, runtime: drt.DatasetRuntime) -> Path:
    """The demo cache that ``python -m flight_server`` writes and serves."""
    return ensure_demo_cache(runtime, tmp_path_factory.mktemp("demo"))


def test_readme_has_examples() -> None:
    examples = _examples()
    assert len(examples) >= 4
    assert sum(1 for e in examples if e.output) >= 4
    assert any(e.language == "bash" for e in examples)
    assert any(e.needs_server for e in examples)


def test_readme_runs_top_to_bottom_twice_in_one_fresh_directory(
    tmp_path: Path, runtime: drt.DatasetRuntime, demo_cache: Path
) -> None:
    """Every example in order, in one fresh directory, twice; each prints what the
    README shows on both passes, and the second pass leaves the same files."""
    examples = _examples()
    cwd = tmp_path / "reader"
    cwd.mkdir()
    catalog = Catalog([DatasetSpec(DEMO_NAME, (demo_cache,))], tmp_path / "state", runtime)
    entries: list[set[str]] = []
    with DatasetFlightServer(catalog, "grpc://127.0.0.1:0") as server:
        for run in ("first", "second"):
            for example in examples:
                location = server.location if example.needs_server else README_LOCATION
                try:
                    _check_output(example, _run(example, cwd, location))
                except BaseException as error:
                    error.add_note(f"on the {run} pass through the README")
                    raise
            entries.append({str(p.relative_to(cwd)) for p in cwd.rglob("*")})
    assert entries[1] == entries[0], "the second pass left other files than the first"


@pytest.mark.parametrize(
    ("documented", "printed", "matches"),
    [
        ("1 2\n", "1 2\n", True),
        ("1 2\n", "1 3\n", False),
        ("1 2\n", "1 2", False),
        ("{'id': '...', 'rows': 2}\n", "{'id': '0f3a', 'rows': 2}\n", True),
        ("{'id': '...', 'rows': 2}\n", "{'id': '0f3a', 'rows': 3}\n", False),
        ("a ...\nb\n", "a x\ny\nb\n", False),  # ... never spans lines
        ("", "", True),
        ("", "unexpected\n", False),
    ],
)
def test_output_comparison(documented: str, printed: str, matches: bool) -> None:
    assert _matches(documented, printed) is matches
