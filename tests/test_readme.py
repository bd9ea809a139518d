"""The README's Python examples run as written and print what the README shows.

An example's documented output is the ```text block right after its ```python
block; an example without one must print nothing. Printed output is compared
exactly, with two normalisations for values that legitimately vary:

- the test server's address (a free port) is written back as the README's
  ``grpc://127.0.0.1:8815``;
- ``...`` in a documented line stands for any text within that line (doctest's
  ELLIPSIS), e.g. a population id.

The Flight examples run against the Quick start's demo dataset served by a fresh
server, after the Flight examples before them (the ``do_put`` example changes
what later examples read), as a reader running them in order would see them.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import dataset_rt as drt
from flight_server import Catalog, DatasetFlightServer, DatasetSpec
from flight_server.demo import DEMO_NAME, ensure_demo_cache

README = Path(__file__).parents[1] / "README.md"
README_LOCATION = "grpc://127.0.0.1:8815"
EXAMPLE = re.compile(r"```python\n(.*?)```(?:\s*```text\n(.*?)```)?", flags=re.DOTALL)


@dataclass(frozen=True)
class Example:
    line: int  # of the ```python fence in README.md
    code: str
    output: str  # the documented output; "" when the example prints nothing

    @property
    def needs_server(self) -> bool:
        return README_LOCATION in self.code


def _examples() -> list[Example]:
    text = README.read_text()
    return [
        Example(text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2) or "")
        for m in EXAMPLE.finditer(text)
    ]


def _run(example: Example, cwd: Path, location: str = README_LOCATION) -> str:
    """Run ``example`` in ``cwd`` against ``location``; what it printed, normalised."""
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


@pytest.mark.parametrize("index", range(len(_examples())))
def test_readme_example_prints_what_readme_shows(
    index: int, tmp_path: Path, runtime: drt.DatasetRuntime, demo_cache: Path
) -> None:
    examples = _examples()
    example = examples[index]
    if not example.needs_server:
        _check_output(example, _run(example, tmp_path))
        return
    catalog = Catalog([DatasetSpec(DEMO_NAME, (demo_cache,))], tmp_path / "state", runtime)
    with DatasetFlightServer(catalog, "grpc://127.0.0.1:0") as server:
        for earlier in examples[:index]:
            if earlier.needs_server:
                _run(earlier, tmp_path, server.location)
        _check_output(example, _run(example, tmp_path, server.location))


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
