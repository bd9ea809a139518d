"""The server process caps glibc's malloc arenas (flight_server/memory.py)."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="malloc arenas are glibc's"
)

# As `python -m flight_server` does: the cap first, then the server's imports
# (pyarrow and the engine start threads), then six threads that each allocate
# once: glibc gives each new allocating thread an arena of its own until the
# cap. malloc_stats() prints one "Arena N:" per arena.
_COUNT_ARENAS = """
import ctypes, sys, threading
from flight_server.memory import cap_malloc_arenas
print(cap_malloc_arenas() if sys.argv[1] == "cap" else None, flush=True)
import flight_server.cli  # the server's imports start threads of their own
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
held, go = [], threading.Barrier(6)
def allocate():
    go.wait()
    held.append(libc.malloc(1 << 16))
threads = [threading.Thread(target=allocate) for _ in range(6)]
for t in threads: t.start()
for t in threads: t.join()
libc.malloc_stats()
"""


def _arenas(mode: str, **env: str) -> tuple[str, int]:
    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env
    done = subprocess.run(
        [sys.executable, "-c", _COUNT_ARENAS, mode],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip(), len(re.findall(r"^Arena \d+:", done.stderr, re.MULTILINE))


def test_without_the_cap_each_allocating_thread_gets_an_arena() -> None:
    # The control: shows that the count below can fail.
    printed, arenas = _arenas("none")
    assert printed == "None"
    assert arenas >= 7


def test_the_cap_holds_the_process_to_two_arenas() -> None:
    assert _arenas("cap") == ("True", 2)


def test_an_operators_malloc_arena_max_wins() -> None:
    assert _arenas("cap", MALLOC_ARENA_MAX="4") == ("False", 4)
