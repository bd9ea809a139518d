"""The attacks of issue 22 (an adversarial probe of the server), for ``attack_replay.py``.

    uv run --no-sync python tools/attack_replay.py --only issue22      # 1-3 minutes
    PYTHONPATH=/old/tree .venv/bin/python tools/attack_replay.py --only issue22

The tree attacked is the one ``flight_server`` imports from in this process
(``PYTHONPATH`` picks an older one). Its servers and CLIs run as ``python -P``
(no working directory on ``sys.path``), so they import the same tree; a note
names the files a server and a CLI really loaded (`Target.whence`). `ATTACKS`
lists the attacks; each adds rows "attack | what the server did | now |
before", numbered 22.<the probe's finding it replays>, "before" being what
the probe saw. Whether a message shows a server path is checked in 1 and 4.

An option the attacked tree lacks (``--min-free-bytes``) is passed only when its
``--help`` lists it; an attack that fails is reported as a row and the others
still run. Every loop is bounded in count and time; every server is stopped,
every socket closed and the tmpfs unmounted in ``finally``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from _flight_common import ServerProcess, human_bytes, make_log, write_cache

log = make_log("issue22")

WAIT = 20.0  # the deadline of one call or request, and of a bounded wait
CLI_TIMEOUT = 120.0  # of one audit run
PYTHON = [sys.executable, "-P"]  # imports what this process imports, whatever the cwd
READ_TOKEN = "issue22-read-token-0123456789ab"
ADMIN_TOKEN = "issue22-admin-token-0123456789"
#: One token, spelt as a client may spell its header.
SPELLINGS = ("Bearer {}", "bearer {}", "BEARER {}", "Bearer   {}", "bEaReR {}")
TRIES_PER_SPELLING = 17  # one past the default --max-streams-per-client
NO_BDP = [("grpc.http2.bdp_probe", 0)]  # an idle client's transport idles too
STREAMS_PER_CONNECTION = 8
CUT_TO = 4096  # bytes a cut shard keeps
TMPFS_BYTES = 8 << 20
FLOOR = 1 << 20  # --min-free-bytes of the full-disk server (when it has the option)
SILENT = 600  # connections to the side port that send nothing
SILENT_OPENERS, SILENT_OPEN_BUDGET = 16, 60.0  # threads and seconds to open them
SILENT_WATCH = 45.0  # seconds to watch the server close them
SCRAPERS, SCRAPES_EACH, SLOW_SCRAPE = 64, 24, 1.0
SCRAPE_BUDGET = 90.0  # seconds all scrapers may take together
BAD_CALLS = 101
DEEP = 100_000
#: An absolute path of two or more parts (as the server's redactor sees one).
ABSOLUTE_PATH = re.compile(r"(?<![\w:/<.])/(?:[\w.@+-]+/)+[\w.@+-]*")
PROBES = re.compile(r"metrics and probes at (http://\S+)")


class Rows(Protocol):
    """Where an attack reports (attack_replay.Report)."""

    notes: list[str]

    def add(self, attack: str, did: str, now: str, before: str = "") -> None: ...


# -- the tree under attack, its servers ------------------------------------------------


def run(command: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(command), capture_output=True, text=True, timeout=timeout)


@dataclass(frozen=True)
class Target:
    """The root the attacked packages import from, and its server's CLI options."""

    root: Path
    options: frozenset[str]

    @classmethod
    def here(cls) -> Target:
        import flight_server

        root = Path(flight_server.__file__).resolve().parent.parent
        helped = run([*PYTHON, "-m", "flight_server", "--help"], 60.0).stdout
        return cls(root, frozenset(re.findall(r"--[a-z][a-z-]+", helped)))

    @staticmethod
    def whence(server_pid: int) -> str:
        """What a CLI started as the servers are imports, and the native library
        the server ``server_pid`` mapped."""
        probe = "import flight_server as f, dataset_rt as d; print(f.__file__, d._native.__file__)"
        imported = run([*PYTHON, "-c", probe], 60.0).stdout.split()
        mapped: set[str] = set()
        with contextlib.suppress(OSError):
            maps = Path(f"/proc/{server_pid}/maps").read_text().splitlines()
            mapped = {line.split()[-1] for line in maps if "_native" in line}
        return f"a CLI imports {', '.join(imported)}; the server mapped {', '.join(sorted(mapped))}"


@dataclass
class Served:
    """A server subprocess: its Flight location and side port (wildcards as loopback)."""

    process: ServerProcess
    location: str
    probes: str  # the side port's address as the server printed it

    @property
    def pid(self) -> int:
        return self.process.proc.pid

    @property
    def url(self) -> str:
        return self.probes.replace("0.0.0.0", "127.0.0.1")

    def exit_code(self) -> int | None:
        return self.process.proc.poll()

    def stderr(self) -> str:
        return self.process.stderr.read_text(errors="replace")


@dataclass(frozen=True)
class Arena:
    """What every attack gets: where to report, the tree attacked, a scratch
    directory, and a cache of 1 KiB records served as ``dataset``."""

    rows: Rows
    target: Target
    root: Path
    cache: Path
    dataset: str

    @contextlib.contextmanager
    def serve(
        self,
        name: str,
        *extra: str,
        datasets: dict[str, Path] | None = None,
        state_dir: Path | None = None,
        wrapper: Sequence[str] = (),
    ) -> Iterator[Served]:
        """``python -m flight_server`` (``wrapper`` before it), stopped on exit."""
        command = [*wrapper, *PYTHON, "-m", "flight_server", "--port", "0", "--metrics-port", "0"]
        command += ["--log-level", "WARNING", "--data-dir", str(self.root / "data")]
        command += ["--state-dir", str(state_dir or self.root / f"state-{name}"), *extra]
        for dataset, cache in (datasets or {self.dataset: self.cache}).items():
            command += ["--dataset", f"{dataset}={cache}"]
        process = ServerProcess.start(name, command, self.root)
        try:
            location = process.wait_location().replace("0.0.0.0", "127.0.0.1")
            deadline = time.monotonic() + WAIT
            printed = PROBES.search(process.stdout.read_text())
            while printed is None and time.monotonic() < deadline:
                time.sleep(0.05)
                printed = PROBES.search(process.stdout.read_text())
            if printed is None:
                raise RuntimeError(f"{name} server printed no side-port address")
            yield Served(process, location, printed.group(1))
        finally:
            process.stop()


# -- what a client sees -----------------------------------------------------------------


def status_of(error: BaseException) -> str:
    from flight_server.metrics import status_of as flight_status

    status = flight_status(error)
    return type(error).__name__ if status == "UNKNOWN" else status


def refusal(error: BaseException) -> str:
    """The status, and which stream limit its message names."""
    status, text = status_of(error), str(error)
    if status == "UNAVAILABLE" and "--max-streams-per-client" in text:
        return "UNAVAILABLE (per-client limit)"
    if status == "UNAVAILABLE" and "--max-streams " in text:
        return "UNAVAILABLE (total limit)"
    return status


def short(error: BaseException | str, limit: int = 160) -> str:
    text = str(error).split(". Detail:")[0].split(". gRPC client debug")[0]
    text = text.removeprefix("Flight returned ").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def leak(message: str, *paths: Path) -> str:
    """Whether ``message`` shows a path of the server: "no", or "YES: the path"."""
    for path in paths:
        if str(path) in message:
            return f"YES: {path}"
    found = ABSOLUTE_PATH.search(message)
    return f"YES: {found.group(0)}" if found else "no"


def options(header: str | None = None, timeout: float = WAIT) -> Any:
    import pyarrow.flight as flight

    headers = [] if header is None else [(b"authorization", header.encode())]
    return flight.FlightCallOptions(timeout=timeout, headers=headers)


def command(body: dict[str, Any]) -> Any:
    import pyarrow.flight as flight

    return flight.FlightDescriptor.for_command(json.dumps(body).encode())


def read_epoch(client: Any, dataset: str) -> tuple[str, str]:
    """An in-order epoch read whole: ``("<n> rows", "")``, or the status the
    reader got and its message."""
    rows = 0
    try:
        body = {"dataset": dataset, "seed": 1, "epoch": 0, "shuffle": False}
        for endpoint in client.get_flight_info(command(body), options()).endpoints:
            for chunk in client.do_get(endpoint.ticket, options()):
                rows += chunk.data.num_rows
    except Exception as error:  # the status is the figure
        return status_of(error), short(error, 400)
    return f"{rows} rows", ""


def http_get(url: str, header: str | None = None, timeout: float = WAIT) -> tuple[str, str]:
    """The status code (or the error's kind) and the body of a GET."""
    request = urllib.request.Request(url)
    if header is not None:
        request.add_header("Authorization", header)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return str(answer.status), answer.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return str(error.code), error.read().decode(errors="replace")
    except OSError as error:  # a URLError wraps the socket's
        reason = getattr(error, "reason", error)
        return type(reason).__name__, str(reason)


def readyz(server: Served) -> str:
    status, body = http_get(server.url + "/readyz")
    return f"{status} {short(body.strip(), 110)}"


def threads_of(pid: int) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def counts(outcomes: Counter[str]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in outcomes.most_common()) or "none"


def wait_until(condition: Callable[[], bool], timeout: float) -> float | None:
    """Seconds until ``condition`` held (polled every 0.2 s), None past ``timeout``."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if condition():
            return time.monotonic() - began
        time.sleep(0.2)
    return None


# -- 1. a shard cut short under the server -----------------------------------------------


def attack_cut_shard(arena: Arena) -> None:
    """1. shard cut short: truncated while the server has it mapped, beside a
    second dataset; then restored."""
    import pyarrow.flight as flight

    rows, root = arena.rows, arena.root
    damaged, _ = write_cache("damaged", 2000, 1024, root / "caches-cut")
    healthy, _ = write_cache("healthy", 500, 1024, root / "caches-cut")
    shard = damaged / "shard-00000.bin"
    with (
        arena.serve("cut", datasets={"damaged": damaged, "healthy": healthy}) as server,
        flight.connect(server.location) as client,
    ):
        whence = arena.target.whence(server.pid)
        log(whence)
        rows.notes.append(f"the tree attacked: {whence}")
        read, _ = read_epoch(client, "damaged")  # every page mapped and read once
        logged = len(server.stderr())
        original = shard.read_bytes()
        with shard.open("r+b") as file:
            file.truncate(CUT_TO)
        status, message = read_epoch(client, "damaged")
        time.sleep(0.5)
        code = server.exit_code()
        lines = len(server.stderr()[logged:].splitlines())
        named = [what for what in ("damaged", "shard-00000.bin") if what in message]
        rows.add(
            f"22.1 shard cut to {CUT_TO} B under a server reading it ({read} before)",
            f"server alive; reader got {status}" if code is None else f"server DIED: exit {code}",
            f"message names {' and '.join(named) or 'neither dataset nor shard'}; "
            f"path shown: {leak(message, damaged, root)}; {lines} log lines after the cut",
            "exit -7 (SIGBUS), no log line; every stream of every dataset ended",
        )
        rows.notes.append(f"22.1: the reader of the cut shard got {status}: {message!r}")
        if code is not None:
            return
        other, _ = read_epoch(client, "healthy")
        not_ready = readyz(server)
        again, still = read_epoch(client, "damaged")
        restored = shard.with_name(shard.name + ".restored")  # a restore from a backup
        restored.write_bytes(original)
        restored.replace(shard)
        back = wait_until(lambda: readyz(server).startswith("200"), WAIT)
        after, reopened = read_epoch(client, "damaged")
        rows.add(
            "22.1   the other dataset; /readyz; the next requests",
            f"other dataset: {other}; /readyz {not_ready}",
            f"still cut: {again}; restored: "
            + (f"/readyz 200 after {back:.1f} s" if back is not None else "/readyz not 200")
            + f", epoch {after}; server alive: {server.exit_code() is None}",
            "(the server was gone)",
        )
        for when, text in (("still cut", still), ("restored", reopened)):
            if text:
                rows.notes.append(f"22.1: the next reader ({when}) got {text!r}")


# -- 2. one token, its header spelt five ways --------------------------------------------


@dataclass
class IdleStreams:
    """``do_get`` streams that took one batch and are never read again; all
    cancelled, and their connections closed, on exit."""

    location: str
    dataset: str
    clients: list[Any] = field(default_factory=list)
    readers: list[Any] = field(default_factory=list)

    def open(self, header: str) -> str:
        """One more stream: "admitted", or the refusal."""
        import pyarrow.flight as flight

        if len(self.readers) >= len(self.clients) * STREAMS_PER_CONNECTION:
            self.clients.append(flight.connect(self.location, generic_options=NO_BDP))
        body = {"dataset": self.dataset, "seed": 7, "epoch": 0, "epoch_len": 10**7}
        try:
            ticket = flight.Ticket(json.dumps(body).encode())
            reader = self.clients[-1].do_get(ticket, options(header, timeout=120.0))
            reader.read_chunk()
        except Exception as error:  # the refusal is the figure
            return refusal(error)
        self.readers.append(reader)
        return "admitted"

    def __enter__(self) -> IdleStreams:
        return self

    def __exit__(self, *exc: object) -> None:
        for reader in self.readers:
            with contextlib.suppress(Exception):
                reader.cancel()
        for client in self.clients:
            with contextlib.suppress(Exception):
                client.close()


def token_file(root: Path) -> Path:
    path = root / "tokens-issue22"
    path.write_text(f"read {READ_TOKEN}\nadmin {ADMIN_TOKEN}\n")
    return path


def attack_spellings(arena: Arena) -> None:
    """2. token spellings: one read token's header spelt five ways until each is
    refused (default limits: 64 streams, 16 per client), then an admin's stream."""
    admitted: list[int] = []
    refused: Counter[str] = Counter()
    with (
        arena.serve("spellings", "--token-file", str(token_file(arena.root))) as server,
        IdleStreams(server.location, arena.dataset) as streams,
    ):
        for spelling in SPELLINGS:
            admitted.append(0)
            for _ in range(TRIES_PER_SPELLING):
                outcome = streams.open(spelling.format(READ_TOKEN))
                if outcome != "admitted":
                    refused[outcome] += 1
                    break
                admitted[-1] += 1
        admin = streams.open(f"Bearer {ADMIN_TOKEN}")
    arena.rows.add(
        f"22.2 one read token, its header spelt {len(SPELLINGS)} ways (default limits: "
        "64 streams, 16 per client)",
        f"admitted {' + '.join(map(str, admitted))} = {sum(admitted)} streams",
        f"stopped by {counts(refused)}",
        "16 per spelling: one token took all 64 slots",
    )
    arena.rows.add(
        "22.2   then an admin token opens a stream", admin, "", "UNAVAILABLE (total limit)"
    )


# -- 3 and 7. the audit CLI -------------------------------------------------------------


@dataclass(frozen=True)
class AuditRig:
    """A population store under ``base / "state"`` and a valid loader state of it."""

    arena: Arena
    base: Path
    state: dict[str, Any]

    @classmethod
    def build(cls, arena: Arena, name: str) -> AuditRig:
        from dataset_rt.loader import LocalSource

        base = arena.root / name
        (base / "state").mkdir(parents=True)
        LocalSource([arena.cache], base / "state", name=arena.dataset)  # as a server makes it
        active = json.loads(next(base.rglob("active.json")).read_text())["population"]
        state = {
            "version": 1, "dataset": arena.dataset, "seed": 0, "shuffle": True,
            "columns": [], "epoch_len": 1000, "batch_size": 10, "world_size": 1, "epoch": 0,
            "position": 0, "steps": 0, "segments": [[0, active]],
        }  # fmt: skip
        return cls(arena, base, state)

    def attack(self, attack: str, text: str, before: str) -> None:
        """``python -m dataset_rt audit`` of a state file holding ``text``: its exit,
        stderr and what it created (then removed: each case starts clean)."""
        base, state_dir = self.base, self.base / "state"
        state = base / f"state-{len(list(base.glob('state-*.json')))}.json"
        state.write_text(text)
        there = set(base.rglob("*"))
        audit = [*PYTHON, "-m", "dataset_rt", "audit", str(state), "--cache", str(self.arena.cache)]
        audit += ["--state-dir", str(state_dir), "--group", "label", "--no-progress"]
        try:
            done = run(audit, CLI_TIMEOUT)
            code, stderr = str(done.returncode), done.stderr
        except subprocess.TimeoutExpired:
            code, stderr = f"none in {CLI_TIMEOUT:.0f} s (killed)", ""
        made = sorted(set(base.rglob("*")) - there)
        inside = [p for p in made if p.is_relative_to(state_dir)]
        outside = [p for p in made if not p.is_relative_to(state_dir)]
        lines = stderr.strip().splitlines()
        shape = "a traceback" if "Traceback" in stderr else f"{len(lines)} line(s) on stderr"
        created = "".join(
            f"; CREATED {len(paths)} paths {where} ({paths[0].relative_to(base)}/...)"
            for paths, where in ((outside, "outside the state dir"), (inside, "in it"))
            if paths
        )
        last = short(lines[-1] if lines else "", 130)
        self.arena.rows.add(attack, f"exit {code}, {shape}{created}", last, before)
        for path in made:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def attack_audit_names(arena: Arena) -> None:
    """3. audit names: loader states naming dataset ``../x`` (outside the state
    dir) and ``ghost`` (no store), beside a valid one."""
    rig = AuditRig.build(arena, "audit-names")
    rig.attack("22.3 audit of a valid state (control)", json.dumps(rig.state), "exit 0")
    outside = json.dumps(rig.state | {"dataset": "../x"})
    before = "a population store created outside the state dir"
    rig.attack("22.3 audit: loader state with dataset '../x'", outside, before)
    ghost = json.dumps(rig.state | {"dataset": "ghost"})
    rig.attack("22.3 audit: dataset 'ghost' (no store)", ghost, "a store created")


def attack_audit_inputs(arena: Arena) -> None:
    """7. audit inputs: a state of JSON nested 100k deep, and ``batch_size`` 2^40."""
    rig = AuditRig.build(arena, "audit-inputs")
    deep = "[" * DEEP + "]" * DEEP
    rig.attack(f"22.7 audit: state JSON nested {DEEP // 1000}k deep", deep, "a traceback")
    huge = json.dumps(rig.state | {"batch_size": 2**40})
    rig.attack("22.7 audit: batch_size 2^40", huge, "a traceback")


# -- 4. a full state volume --------------------------------------------------------------


@contextlib.contextmanager
def small_volume(path: Path, size: int) -> Iterator[list[str]]:
    """A tmpfs of ``size`` bytes mounted at ``path`` (unmounted on exit); yields
    the wrapper a server's command needs to see it: none when this process may
    mount, else ``unshare -rm`` mounting it in the server's own namespace (seen
    from here through ``/proc/<pid>/root``, gone with the server)."""
    path.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs"]
    mounted = run([*mount, str(path)], 30.0)
    if mounted.returncode != 0:
        log(f"mount refused ({mounted.stderr.strip()}): the server mounts it under unshare -rm")
        yield ["unshare", "-rm", "sh", "-c", f'{" ".join(mount)} "$0" && exec "$@"', str(path)]
        return
    try:
        yield []
    finally:
        if run(["umount", str(path)], 30.0).returncode != 0:
            run(["umount", "-l", str(path)], 30.0)


def free_bytes(path: Path) -> int:
    volume = os.statvfs(path)
    return volume.f_bavail * volume.f_frsize


def fill(filler: Path) -> None:
    """Grow ``filler`` until its volume is full."""
    chunk = b"\0" * (64 << 10)
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for _ in range(TMPFS_BYTES // len(chunk) + 64):  # bounded: the volume's size
            os.write(fd, chunk)
    except OSError:  # full
        pass
    finally:
        os.close(fd)


def shrink(filler: Path, nbytes: int) -> None:
    os.truncate(filler, max(0, filler.stat().st_size - nbytes))


def temp_files(volume: Path) -> str:
    """The temporary files of failed writes (``.tmp-*``) the store holds."""
    found = [p.stat().st_size for p in volume.rglob(".tmp-*") if p.is_file()]
    return f"temp files left: {len(found)}, {sum(found)} B"


def reweighted(table: Any, seed: int) -> Any:
    """``table`` with fixed-seed random weights: a population of its own."""
    import pyarrow as pa

    rng = random.Random(seed)
    weights = pa.array([rng.uniform(0.5, 1.5) for _ in range(table.num_rows)])
    return table.set_column(table.schema.get_field_index("weight"), "weight", weights)


def put(client: Any, dataset: str, table: Any) -> tuple[str, str]:
    """A ``do_put`` of ``table`` (not activated): "OK", or the status and message."""
    writer, answers = client.do_put(
        command({"dataset": dataset, "activate": False}), table.schema, options()
    )
    try:
        writer.write_table(table)
        writer.done_writing()
        answers.read()
        writer.close()
    except Exception as error:  # the status is the figure
        with contextlib.suppress(Exception):
            writer.close()
        return status_of(error), short(error, 400)
    return "OK", ""


def attack_full_disk(arena: Arena) -> None:
    """4. full disk: puts on an 8 MiB tmpfs as ``--state-dir``: their status,
    ``/readyz``, the temporary files failed puts leave, and puts once space returns."""
    import pyarrow.flight as flight

    rows, dataset, mount = arena.rows, arena.dataset, arena.root / "small-volume"
    floor = ["--min-free-bytes", str(FLOOR)] if "--min-free-bytes" in arena.target.options else []
    tmpfs = f"tmpfs {human_bytes(TMPFS_BYTES)}" + (f", --min-free-bytes {FLOOR}" if floor else "")
    with (
        small_volume(mount, TMPFS_BYTES) as wrapper,
        arena.serve("full", *floor, state_dir=mount, wrapper=wrapper) as server,
        flight.connect(server.location) as client,
    ):
        volume = Path(f"/proc/{server.pid}/root{mount}") if wrapper else mount
        filler = volume / "filler"
        metadata = flight.Ticket(json.dumps({"dataset": dataset, "metadata": True}).encode())
        table = client.do_get(metadata, options()).read_all()
        tables = (reweighted(table, seed) for seed in range(100))
        ready_at_start = readyz(server)
        first, _ = put(client, dataset, next(tables))
        stored = max((p.stat().st_size for p in volume.rglob("*.arrow")), default=0)
        fill(filler)
        full = free_bytes(volume)
        ready_full = readyz(server)
        status, message = put(client, dataset, next(tables))
        rows.add(
            f"22.4 do_put on a full state volume ({tmpfs}, {full} B free)",
            status,
            f"{short(message, 110)!r}; path shown: {leak(message, mount, arena.root)}",
            "INTERNAL 'the server's data is damaged: ... No space left on device' + its path",
        )
        rows.add(
            f"22.4   /readyz at {full} B free",
            ready_full,
            f"at the start ({human_bytes(TMPFS_BYTES)} volume, a put stored: {first}): "
            + ready_at_start,
            "200 ready at 0 bytes free",
        )
        if not stored:
            rows.notes.append("22.4: no stored population to size the puts by; stopped there")
            return
        # Room for 0.9 of a population: the first put fails after writing most of
        # it; then 2.5 more: enough for 3 puts only if the failures left nothing.
        shrink(filler, stored * 9 // 10)
        room = free_bytes(volume)
        failed = Counter(put(client, dataset, next(tables))[0] for _ in range(3))
        rows.add(
            f"22.4   3 puts of {human_bytes(stored)} with {human_bytes(room)} free",
            counts(failed),
            f"{temp_files(volume)}; free after: {human_bytes(free_bytes(volume))}",
            "temp files stayed until a restart",
        )
        shrink(filler, stored * 5 // 2)
        returned = free_bytes(volume)
        fitted = Counter(put(client, dataset, next(tables))[0] for _ in range(3))
        rows.add(
            f"22.4   then {human_bytes(stored * 5 // 2)} more freed ({human_bytes(returned)} "
            "free): 3 more puts",
            f"{fitted['OK']} of 3 stored" + (f"; {counts(fitted)}" if fitted["OK"] < 3 else ""),
            f"{temp_files(volume)}; server alive: {server.exit_code() is None}",
            "1 of 3 fitted",
        )


# -- 5 and 6. the side port; failed logins in the metrics --------------------------------


def unauthenticated(server: Served, header: str) -> int | None:
    """The UNAUTHENTICATED calls ``/metrics`` counts (None when it does not answer)."""
    status, text = http_get(server.url + "/metrics", header)
    if status != "200":
        return None
    pattern = re.compile(r'^datasetrt_requests_total\{[^}]*status="UNAUTHENTICATED"[^}]*\} (\S+)')
    return sum(int(float(m.group(1))) for m in map(pattern.match, text.splitlines()) if m)


def bad_call(client: Any, dataset: str, i: int) -> str:
    """Call ``i`` of the bad-token attack: four calls by four bad headers."""
    import pyarrow.flight as flight

    header = (None, "Bearer wrong-token-0123456789abcdef", f"Basic {READ_TOKEN}",
              f"Bearer {READ_TOKEN}x")[i // 4 % 4]  # fmt: skip
    calls: list[Callable[[Any], Any]] = [
        lambda o: list(client.list_flights(options=o)),
        lambda o: client.get_flight_info(command({"dataset": dataset, "seed": 1, "epoch": 0}), o),
        lambda o: client.do_get(flight.Ticket(b'{"dataset": "x"}'), o).read_all(),
        lambda o: list(client.do_action(flight.Action("list_populations", b"{}"), o)),
    ]
    try:
        calls[i % 4](options(header))
    except Exception as error:  # the status is the figure
        return status_of(error)
    return "OK"


def listen_overflows() -> int:
    """The kernel's ``TcpExt: ListenOverflows`` (this network namespace; 0 if unknown)."""
    with contextlib.suppress(OSError):
        lines = Path("/proc/net/netstat").read_text().splitlines()
        for names, values in zip(lines[::2], lines[1::2], strict=False):
            if names.startswith("TcpExt:"):
                found = dict(zip(names.split()[1:], values.split()[1:], strict=False))
                return int(found.get("ListenOverflows", 0))
    return 0


def scrape_storm(server: Served, header: str) -> str:
    """SCRAPERS threads scrape /metrics SCRAPES_EACH times, a fresh connection each."""
    deadline = time.monotonic() + SCRAPE_BUDGET

    def scraper(_: int) -> list[tuple[float, str]]:
        seen = []
        for _ in range(SCRAPES_EACH):
            if time.monotonic() > deadline:
                break
            began = time.monotonic()
            answer = http_get(server.url + "/metrics", header, timeout=10.0)
            seen.append((time.monotonic() - began, answer[0]))
        return seen

    overflows = listen_overflows()
    with ThreadPoolExecutor(SCRAPERS) as pool:
        seen = [s for scraper_seen in pool.map(scraper, range(SCRAPERS)) for s in scraper_seen]
    overflowed = listen_overflows() - overflows
    times = sorted(seconds for seconds, _ in seen)
    slow = sum(seconds > SLOW_SCRAPE for seconds in times)
    failed = Counter(status for _, status in seen if status != "200")
    return (
        f"{len(seen)} scrapes: {slow} over {SLOW_SCRAPE:g} s ({slow / max(1, len(seen)):.1%}), "
        f"{sum(failed.values())} failed{f' ({counts(failed)})' if failed else ''}; median "
        f"{times[len(times) // 2] * 1000:.0f} ms, slowest {times[-1]:.2f} s; listen-queue "
        f"overflows +{overflowed}"
    )


def silent_connections(rows: Rows, server: Served) -> None:
    """SILENT connections that send nothing: threads, a probe beside them, who closes them."""
    address = urlsplit(server.url)
    start = threads_of(server.pid)
    probe: list[str] = []
    connections: list[socket.socket] = []
    failed: Counter[str] = Counter()
    closed: set[int] = set()
    held, watched, opening = 0, 0.0, time.monotonic()

    def connect(_: int) -> socket.socket | str:
        if time.monotonic() - opening > SILENT_OPEN_BUDGET:
            return "not tried (time budget)"
        try:
            return socket.create_connection((address.hostname, address.port), 10.0)
        except OSError as error:
            return type(error).__name__

    try:
        # In parallel: a full listen queue costs each connect a SYN retransmit (1 s, 3 s, ...).
        with ThreadPoolExecutor(SILENT_OPENERS) as pool:
            for got in pool.map(connect, range(SILENT)):
                if isinstance(got, socket.socket):
                    connections.append(got)
                else:
                    failed[got] += 1
        opening = time.monotonic() - opening
        time.sleep(2.0)
        held = threads_of(server.pid)
        began = time.monotonic()

        def healthz() -> None:
            status, _ = http_get(server.url + "/healthz", timeout=2 * SILENT_WATCH)
            probe.append(f"{status} after {time.monotonic() - began:.1f} s")

        prober = threading.Thread(target=healthz, daemon=True)
        prober.start()
        for connection in connections:
            connection.setblocking(False)
        while len(closed) < len(connections) and time.monotonic() - began < SILENT_WATCH:
            for i, connection in enumerate(connections):
                if i in closed:
                    continue
                try:
                    if connection.recv(1) == b"":
                        closed.add(i)
                except BlockingIOError:  # open, nothing to read
                    pass
                except OSError:  # reset by the server
                    closed.add(i)
            held = max(held, threads_of(server.pid))  # the server accepts them over time
            time.sleep(0.5)
        watched = time.monotonic() - began
        prober.join(max(0.0, 2 * SILENT_WATCH - watched))
    finally:
        for connection in connections:
            connection.close()
    released = wait_until(lambda: threads_of(server.pid) <= start + 2, 10.0)
    rows.add(
        f"22.5 {SILENT} silent connections to the side port",
        f"server threads {start} -> {held} (peak); {len(connections)} opened in {opening:.1f} s"
        + (f", {counts(failed)}" if failed else ""),
        f"server closed {len(closed)} of {len(connections)} within {watched:.0f} s; /healthz "
        f"beside them: {probe[0] if probe else 'no answer'}; threads "
        + (f"back {released:.1f} s after the client closed" if released is not None else "held"),
        "600 threads held while the clients were silent",
    )


def attack_side_port(arena: Arena) -> None:
    """5/6. side port: ``/metrics`` without a token (``--host 0.0.0.0``), 64
    parallel scrapers, 600 silent connections; 101 calls with bad tokens against
    the UNAUTHENTICATED count of ``/metrics``."""
    import pyarrow.flight as flight

    rows, token = arena.rows, f"Bearer {READ_TOKEN}"
    extra = ["--host", "0.0.0.0", "--token-file", str(token_file(arena.root))]
    with arena.serve("sideport", *extra) as server:
        status, body = http_get(server.url + "/metrics")
        rows.add(
            "22.5 /metrics with --token-file, no token; --host 0.0.0.0",
            status + (", the metrics" if "datasetrt_" in body else ", no metrics"),
            f"side port on {urlsplit(server.probes).hostname}; with a read token: "
            + http_get(server.url + "/metrics", token)[0],
            "200 with the metrics; side port on --host's address",
        )
        counted = unauthenticated(server, token)
        with flight.connect(server.location) as client:
            seen = Counter(bad_call(client, arena.dataset, i) for i in range(BAD_CALLS))
        expected = (counted or 0) + BAD_CALLS
        wait_until(lambda: (unauthenticated(server, token) or 0) >= expected, 3.0)
        now = unauthenticated(server, token)
        rows.add(
            f"22.5 {SCRAPERS} parallel scrapers x {SCRAPES_EACH} /metrics",
            "a fresh connection per scrape",
            scrape_storm(server, token),
            "4-5 % over 1 s, 13 failed in 1,500 (listen backlog 5)",
        )
        silent_connections(rows, server)
    delta = "-" if counted is None or now is None else f"+{now - counted}"
    rows.add(
        f"22.6 {BAD_CALLS} calls with bad tokens (4 kinds x 4 headers)",
        counts(seen),
        f"UNAUTHENTICATED in /metrics: {counted} -> {now} ({delta})",
        "+0",
    )


# -- all of them -------------------------------------------------------------------------


def run_all(rows: Rows, root: Path, cache: Path, dataset: str) -> None:
    """Every attack, with scratch space under ``root`` and ``cache`` served as
    ``dataset``; one that fails is a row, and the next one runs."""
    arena = Arena(rows, Target.here(), root, cache, dataset)
    log(f"attacking the tree at {arena.target.root}")
    for attack in ATTACKS:
        name = "22." + (attack.__doc__ or attack.__name__).split(":")[0]
        began = time.monotonic()
        try:
            attack(arena)
        except Exception as error:  # reported: the other attacks still run
            rows.add(name, f"the attack failed: {type(error).__name__}", short(error, 200))
        log(f"{name}: {time.monotonic() - began:.0f} s")


ATTACKS: tuple[Callable[[Arena], None], ...] = (
    attack_cut_shard,
    attack_spellings,
    attack_audit_names,
    attack_full_disk,
    attack_side_port,
    attack_audit_inputs,
)
