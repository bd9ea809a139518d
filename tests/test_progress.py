"""Writer progress: drawn on a terminal, silent otherwise."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

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
    return _on_a_terminal([sys.executable, "-c", SCRIPT, str(target)])


def _on_a_terminal(command: list[str], *, stdout_too: bool = False) -> str:
    """What ``command`` wrote to a terminal (200 columns) on stderr, and on
    stdout too with ``stdout_too`` (as a user at a terminal sees both)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 200, 0, 0))
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=follower if stdout_too else subprocess.DEVNULL,
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


def test_the_rate_is_a_whole_number_of_records_per_second(tmp_path: Path) -> None:
    output = _run(tmp_path, terminal=True)
    rates = re.findall(r"([\d,.]+)/s", output)
    assert rates, output
    assert all("." not in rate for rate in rates), rates


def test_the_ok_line_after_a_progress_bar_starts_a_line_of_its_own(tmp_path: Path) -> None:
    """``import`` at a terminal: the bar (stderr) is left on screen, finished, and
    the command's "ok:" line (stdout) comes on the next line, not after the bar."""
    n = 3000
    table = pa.table({"data": [bytes(512)] * n, "i": list(range(n))})
    pq.write_table(table, tmp_path / "data.parquet")
    output = _on_a_terminal(
        [
            sys.executable, "-m", "dataset_rt", "import", str(tmp_path / "data.parquet"),
            "--payload-column", "data", "--name", "bar", "--base-dir", str(tmp_path),
        ],
        stdout_too=True,
    )  # fmt: skip
    assert f"{n}/{n} records" in output  # the finished bar
    before, ok, _ = output.rpartition("ok: bar -> ")
    assert ok, output
    assert before.endswith("\n"), f"the ok line follows {before[-60:]!r}"
