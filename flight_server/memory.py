"""The server process's allocator settings, applied before its threads start.

glibc gives each thread that allocates concurrently an arena of its own, up to
eight per core, and keeps each arena's freed memory for reuse. A ``do_put``
passes through many threads (gRPC's, which hold the messages as they arrive,
Python's, the engine's writers), so every arena ends up holding the high-water
mark of what passed through it, and the process's anonymous memory becomes the
sum of those marks. Two arenas keep that sum near one mark: on a 10^7-row put
in 32 MB messages the server's peak RssAnon fell from 399-557 MiB to 331-367
MiB, and what it kept after the put from 254-336 to 132-169 MiB, at the same
rate (benchmarks/README.md, "The server's malloc arenas").

An operator's ``MALLOC_ARENA_MAX`` wins: glibc reads it itself, and then
nothing is set here. Other C libraries have no such arenas: nothing to do.
"""

from __future__ import annotations

import ctypes
import os
import platform

# <malloc.h>: mallopt's parameter number for the arena cap.
_M_ARENA_MAX = -8
ARENAS = 2


def cap_malloc_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas for the threads started from now on; True if set."""
    if "MALLOC_ARENA_MAX" in os.environ or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return False
    return bool(libc.mallopt(_M_ARENA_MAX, arenas))
