"""Writer progress: drawn on a terminal, silent otherwise."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
import dataset_rt as drt

class Source:
    name = "progress"
    def __len__(self):
        return 3000
    def __iter__(self):
        for i in range(3000):
            yield drt.CacheInput(data=bytes(2048), metadata={"i": i})

runtime = drt.DatasetRuntime(num_workers=2)
[result] = runtime.write_cache(Source(), sys.argv[1])
assert isinstance(result, drt.CacheWriteSuccess), result
"""


def _run(target: Path, *, terminal: bool) -> str:
    if not terminal:
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(target)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return done.stderr
    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", SCRIPT, str(target)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=follower,
        )
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the follower side closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert process.wait(timeout=120) == 0
    finally:
        os.close(leader)
    return b"".join(chunks).decode(errors="replace")


def test_progress_is_drawn_on_a_terminal(tmp_path: Path) -> None:
    output = _run(tmp_path, terminal=True)
    assert "writing progress" in output
    assert "records" in output
    assert "MB/s" in output
    assert "3000/3000" in output


def test_progress_is_silent_without_a_terminal(tmp_path: Path) -> None:
    assert _run(tmp_path, terminal=False) == ""
