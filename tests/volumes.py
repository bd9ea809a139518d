"""Small volumes for the tests of a full disk: a tmpfs mounted for the test (it
needs the right to mount: root, as in CI; the test is skipped, saying why,
elsewhere), and a file that fills one (tests/faults/test_disk_full.py,
tests/test_object_store.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

VOLUME = "2m"


@contextlib.contextmanager
def small_volume(path: Path, size: str = VOLUME) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (unmounted on exit)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip()}); needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30, check=False)


def fill(volume: Path) -> Path:
    """Fill ``volume`` to its last page with one file; returns it."""
    filler = volume / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for size in (1 << 16, 1 << 12):  # tmpfs allocates whole pages
            chunk = b"\0" * size
            for _ in range(100_000):  # bounded: far more than the volume holds
                try:
                    os.write(fd, chunk)
                except OSError:
                    break
    finally:
        os.close(fd)
    return filler
