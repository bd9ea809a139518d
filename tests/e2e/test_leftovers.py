"""Leftovers of killed writers, in real containers where every writer is pid 1.

Writes cut off by ``kill -9`` leave temporary entries: ``.<name>.partial-*``
cache directories and ``.tmp-*`` population files. Their writers hold an flock
on them while writing and the kernel drops it when the process dies, so a
cleaner recognises an abandoned entry by its lock, not by a process id (which
every container reuses: each writer here is pid 1). These are the in-process
tests of tests/test_hardening.py with one docker volume shared by containers:
``docker kill -s KILL`` kills a writer, ``docker pause`` stands for a live one
(a frozen process keeps its locks).

Run with ``uv run pytest -m e2e tests/e2e/test_leftovers.py``. Every container
and volume is removed at the end, also on failure. Every wait is bounded in time.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from e2e.test_compose import image  # noqa: F401  (the fixture; the image is built once)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

WAIT_SECONDS = 90.0
POLL_SECONDS = 0.25
#: Where the shared volume is mounted in every container: the image makes
#: /caches owned by its user, and a new volume mounted there takes that owner.
MOUNT = "/caches"
BASE = f"{MOUNT}/base"  # the caches' base directory
STATE = f"{MOUNT}/state"  # the population store's state directory


def docker(
    *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, check=check, timeout=timeout
    )


class Containers:
    """The containers and the volume of one test, all removed by `cleanup`."""

    def __init__(self, tag: str) -> None:
        self.image = tag
        self.label = f"drte2e{uuid.uuid4().hex[:8]}"
        self.names: list[str] = []
        self.volume = f"{self.label}-shared"
        self.observer = f"{self.label}-observer"

    def setup(self) -> None:
        """The shared volume, and the observer: a container that only sleeps, in
        which the test lists the volume and tries its locks."""
        docker("volume", "create", "--label", f"dataset-rt-e2e={self.label}", self.volume)
        self.start("observer", "-c", "import time; time.sleep(3600)")

    def _args(self, role: str, entrypoint: str | None) -> list[str]:
        name = f"{self.label}-{role}"
        self.names.append(name)  # recorded first: removed even if `docker run` fails
        args = ["--name", name, "--label", f"dataset-rt-e2e={self.label}"]
        args += ["-v", f"{self.volume}:{MOUNT}"]
        return args + (["--entrypoint", entrypoint] if entrypoint else [])

    def start(self, role: str, *command: str, entrypoint: str | None = "python") -> str:
        """A detached container (kept after it exits, for its logs)."""
        args = self._args(role, entrypoint)
        docker("run", "-d", *args, self.image, *command)
        return args[1]

    def run(self, role: str, *command: str, timeout: float = WAIT_SECONDS) -> str:
        """A container run to its end: its output (it must exit 0)."""
        args = self._args(role, "python")
        done = docker("run", *args, self.image, *command, check=False, timeout=timeout)
        assert done.returncode == 0, (role, done.stdout, done.stderr)
        return done.stdout

    def wait_for_line(self, name: str, prefix: str) -> str:
        """The first line of ``name``'s output that starts with ``prefix``."""
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            done = docker("logs", name)
            for line in done.stdout.splitlines():
                if line.startswith(prefix):
                    return line
            running = docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip()
            if running != "true":
                raise AssertionError(f"{name} ended before {prefix!r}: {done.stdout}{done.stderr}")
            time.sleep(POLL_SECONDS)
        raise AssertionError(f"{name} printed no {prefix!r} line in {WAIT_SECONDS} s")

    def pid_of(self, name: str) -> int:
        """The process id the script in ``name`` reported for itself."""
        return int(self.wait_for_line(name, "pid ").split()[1])

    def entries(self, *dirs: str) -> dict[str, bool]:
        """The temporary entries of ``dirs`` and whether each is locked by a writer."""
        out = docker("exec", self.observer, "python", "-c", INSPECT, *dirs).stdout
        return dict(json.loads(out))

    def pause(self, name: str) -> None:
        """Freeze every process of ``name`` (``docker pause``). The cgroup freezer
        can fail while a process is in uninterruptible I/O (an fsync): retried."""
        for _ in range(20):
            done = docker("pause", name, check=False)
            if done.returncode == 0:
                return
            time.sleep(POLL_SECONDS)
        raise AssertionError(f"cannot pause {name}: {done.stderr}")

    def kill(self, name: str) -> None:
        """``kill -9`` the container's pid 1 and wait until it is gone."""
        docker("kill", "-s", "KILL", name)
        # A frozen process dies of SIGKILL once thawed, before it runs any code.
        docker("unpause", name, check=False)
        status = docker("wait", name, timeout=WAIT_SECONDS).stdout.strip()
        assert status == "137", f"{name} exited with {status}, not by SIGKILL"

    def cleanup(self) -> None:
        """Remove every container of this test (by name and by label), then the volume."""

        def quietly(*args: str) -> str:
            try:
                return docker(*args, check=False, timeout=60).stdout
            except subprocess.TimeoutExpired:
                return ""

        found = quietly("ps", "-aq", "--filter", f"label=dataset-rt-e2e={self.label}").split()
        for container in [*self.names, *found]:
            quietly("unpause", container)  # a frozen one is thawed first, to be safe
            quietly("rm", "-f", "-v", container)
        quietly("volume", "rm", "-f", self.volume)


@pytest.fixture
def containers(image: str) -> Iterator[Containers]:  # noqa: F811
    made = Containers(image)
    try:
        made.setup()
        yield made
    finally:
        made.cleanup()


def wait_until(condition: Callable[[], Any], what: str) -> Any:
    """Poll ``condition`` until it answers something true (bounded in time)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(POLL_SECONDS)
    raise AssertionError(f"timed out after {WAIT_SECONDS} s waiting for {what}")


def script(text: str) -> str:
    return textwrap.dedent(text)


#: ``python -c INSPECT DIR...``: {path: locked} of the temporary entries (``.*``
#: names with ``.partial-`` or ``.tmp-*``) in each directory.
INSPECT = script(
    """
    import fcntl, json, os, sys

    found = {}
    for folder in sys.argv[1:]:
        names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        for name in names:
            if not (name.startswith(".tmp-") or ".partial-" in name):
                continue
            path = os.path.join(folder, name)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                found[path] = False
            except BlockingIOError:
                found[path] = True
            finally:
                os.close(fd)  # also lets go of a lock taken here
    print(json.dumps(found))
    """
)

#: ``python -c SLOW_WRITER BASE NAME``: writes a cache from a source that takes
#: far longer than a test waits (100k records, 10 ms each).
SLOW_WRITER = script(
    """
    import os, sys, time
    import dataset_rt as drt

    base, name = sys.argv[1], sys.argv[2]

    class SlowSource:
        def __init__(self):
            self.name = name

        def __iter__(self):
            for i in range(100_000):
                time.sleep(0.01)
                yield drt.CacheInput(bytes(64), {"i": i})

    print(f"pid {os.getpid()}", flush=True)
    print("writing", flush=True)
    drt.DatasetRuntime(num_workers=1).write_cache(
        SlowSource(), base, writer_config=drt.WriterConfig(show_progress=False)
    )
    """
)

#: ``python -c WRITER BASE NAME``: writes a small cache and prints its path.
WRITER = script(
    """
    import os, sys
    import dataset_rt as drt

    base, name = sys.argv[1], sys.argv[2]

    class Source:
        def __init__(self):
            self.name = name

        def __iter__(self):
            return iter([drt.CacheInput(bytes([i]) * 16, {"i": i}) for i in range(12)])

    print(f"pid {os.getpid()}", flush=True)
    config = drt.WriterConfig(show_progress=False)
    (result,) = drt.DatasetRuntime(num_workers=1).write_cache(Source(), base, writer_config=config)
    assert isinstance(result, drt.CacheWriteSuccess), result
    print(f"wrote {result.path}", flush=True)
    """
)


def partials(entries: dict[str, bool], name: str) -> dict[str, bool]:
    return {p: locked for p, locked in entries.items() if f"/.{name}.partial-" in p}


def test_a_killed_writers_partial_cache_is_removed_and_a_paused_writers_kept(
    containers: Containers,
) -> None:
    # A will be killed and B paused, both mid-write in the same base directory.
    a = containers.start("writer-a", "-c", SLOW_WRITER, BASE, "victim")
    b = containers.start("writer-b", "-c", SLOW_WRITER, BASE, "live")
    assert containers.pid_of(a) == containers.pid_of(b) == 1
    for writer in (a, b):
        containers.wait_for_line(writer, "writing")

    def locked_partials() -> dict[str, bool] | None:
        entries = containers.entries(BASE)
        found = partials(entries, "victim") | partials(entries, "live")
        return found if len(found) == 2 and all(found.values()) else None

    wait_until(locked_partials, "the locked partial directories of A and B")
    containers.pause(b)
    entries = containers.entries(BASE)
    (victim,) = partials(entries, "victim")
    (live,) = partials(entries, "live")
    # Paused mid-write (sleeping in its source, between records), B holds its lock.
    assert entries[live], f"B's {live} is not locked while B is paused"
    # Both names carry pid 1: a process id cannot tell a live writer from a dead one.
    for path in (victim, live):
        assert path.rsplit(".partial-", 1)[1].split("-")[0] == "1", path

    containers.kill(a)
    entries = containers.entries(BASE)
    assert entries.get(victim) is False, f"A's leftover {victim} should exist, unlocked: {entries}"
    assert entries.get(live) is True, entries

    # C (pid 1 too) writes another cache into the same base directory.
    out = containers.run("writer-c", "-c", WRITER, BASE, "next")
    assert "pid 1\n" in out, out
    assert f"wrote {BASE}/next\n" in out, out
    entries = containers.entries(BASE)
    assert victim not in entries, f"A's abandoned {victim} was not removed: {entries}"
    assert entries == {live: True}, f"B's live {live} must be kept: {entries}"

    # Once B is killed its lock is gone, and the next writer removes its leftover too.
    containers.kill(b)
    assert containers.entries(BASE) == {live: False}
    out = containers.run("writer-d", "-c", WRITER, BASE, "again")
    assert "pid 1\n" in out, out
    assert containers.entries(BASE) == {}
    listing = docker("exec", containers.observer, "ls", "-A", BASE).stdout.split()
    assert sorted(listing) == ["again", "next"]


#: ``python -c SETUP BASE STATE NAME``: writes a small cache, opens the
#: population store over it and prints the store's directory.
SETUP = script(
    """
    import glob, json, sys
    import dataset_rt as drt
    from dataset_rt.service import DatasetService

    base, state, name = sys.argv[1], sys.argv[2], sys.argv[3]

    class Source:
        def __init__(self):
            self.name = name

        def __iter__(self):
            return iter([drt.CacheInput(bytes([i]) * 16, {"i": i}) for i in range(12)])

    runtime = drt.DatasetRuntime(num_workers=1)
    config = drt.WriterConfig(show_progress=False)
    (result,) = runtime.write_cache(Source(), base, writer_config=config)
    assert isinstance(result, drt.CacheWriteSuccess), result
    DatasetService(runtime.native, name, [str(result.path)], state)
    (store,) = glob.glob(f"{state}/{name}/caches-*")
    print("store " + json.dumps(store), flush=True)
    """
)

#: ``python -c HOLDER DIR...``: creates a population temporary file in each
#: directory, named and locked as the engine's writers do, and holds the locks.
HOLDER = script(
    """
    import fcntl, json, os, sys, time

    held = []
    for n, folder in enumerate(sys.argv[1:]):
        path = os.path.join(folder, f".tmp-{os.getpid()}-{os.urandom(8).hex()}-{n}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"half a table")
        held.append(path)
    print(f"pid {os.getpid()}", flush=True)
    print("holding " + json.dumps(held), flush=True)
    time.sleep(3600)
    """
)

#: ``python -c OPEN CACHE STATE NAME``: opens the population store over ``STATE``.
OPEN = script(
    """
    import os, sys
    import dataset_rt as drt
    from dataset_rt.service import DatasetService

    cache, state, name = sys.argv[1], sys.argv[2], sys.argv[3]
    print(f"pid {os.getpid()}", flush=True)
    service = DatasetService(drt.DatasetRuntime(num_workers=1).native, name, [cache], state)
    print(f"active {service.active().population}", flush=True)
    """
)


def test_a_killed_holders_population_temp_files_are_removed_and_a_paused_holders_kept(
    containers: Containers,
) -> None:
    name = "pop"
    cache = f"{BASE}/{name}"
    out = containers.run("setup", "-c", SETUP, BASE, STATE, name)
    store = json.loads(out.split("store ", 1)[1])
    folders = [store, f"{store}/populations"]

    def hold(role: str) -> tuple[str, list[str]]:
        holder = containers.start(role, "-c", HOLDER, *folders)
        held = json.loads(containers.wait_for_line(holder, "holding ").split(" ", 1)[1])
        assert containers.pid_of(holder) == 1
        return holder, held

    killed, abandoned = hold("holder-killed")
    containers.kill(killed)
    paused, live = hold("holder-paused")
    containers.pause(paused)
    # Both holders were pid 1, so the files are named alike: only the locks differ.
    assert {p.split("/.tmp-")[1].split("-")[0] for p in abandoned + live} == {"1"}
    assert containers.entries(*folders) == {
        **dict.fromkeys(abandoned, False),
        **dict.fromkeys(live, True),
    }

    # A replica starts over the same state directory (pid 1: the server itself).
    server = containers.start(
        "server",
        "--dataset",
        f"{name}={cache}",
        "--state-dir",
        STATE,
        "--metrics-port",
        "9815",
        entrypoint=None,
    )

    def ready() -> bool:
        probe = ["python", "-m", "flight_server.health", "http://127.0.0.1:9815/readyz"]
        return docker("exec", server, *probe, check=False).returncode == 0

    wait_until(ready, "the server's /readyz")
    command = docker("exec", server, "cat", "/proc/1/cmdline").stdout.split("\0")
    assert "flight_server" in command, command
    entries = containers.entries(*folders)
    assert entries == dict.fromkeys(live, True), (
        f"opening the store must remove the abandoned {abandoned} and keep the held {live}"
    )

    # The paused holder is killed: a script opening the store (pid 1) removes its files.
    containers.kill(paused)
    assert containers.entries(*folders) == dict.fromkeys(live, False)
    out = containers.run("reopen", "-c", OPEN, cache, STATE, name)
    assert "pid 1\n" in out, out
    assert "active " in out, out
    assert containers.entries(*folders) == {}
