"""The README's Python examples run as written (against a real server for Flight)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from conftest import ListSource, make_records

import dataset_rt as drt
from flight_server import Catalog, DatasetFlightServer, DatasetSpec

README = Path(__file__).parents[1] / "README.md"
README_LOCATION = "grpc://127.0.0.1:8815"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def _run(code: str, cwd: Path) -> None:
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})
    finally:
        os.chdir(previous)


def test_readme_has_examples() -> None:
    assert len(_python_blocks()) >= 4


@pytest.mark.parametrize("index", range(len(_python_blocks())))
def test_readme_example_runs(index: int, tmp_path: Path, runtime: drt.DatasetRuntime) -> None:
    code = _python_blocks()[index]
    if README_LOCATION not in code:
        _run(code, tmp_path)
        return
    [written] = runtime.write_cache(
        ListSource("demo_v1", make_records(40)),
        tmp_path / "caches",
        writer_config=drt.WriterConfig(show_progress=False),
    )
    catalog = Catalog([DatasetSpec("demo", (written.path,))], tmp_path / "state", runtime)
    with DatasetFlightServer(catalog, "grpc://127.0.0.1:0") as server:
        _run(code.replace(README_LOCATION, server.location), tmp_path)
