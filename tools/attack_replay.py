"""The audits' attacks, replayed against a real server: what it does now, with
its memory, threads and CPU beside the figures the audits measured before.

Not a test and not a benchmark: it prints a report and asserts nothing. The
pass/fail checks of every attack replayed here are tests: issue 10's in
``tests/flight/test_limits.py`` (endpoints, idle streams, the idle deadline,
shutdown, puts) and ``tests/test_hardening.py`` (a duplicate column), issue
22's in ``tests/faults/`` (one file per finding). Run it to see what an attack
costs the server, or to replay the attacks against an older tree::

    uv run --no-sync python tools/attack_replay.py                 # about 3-4 minutes on 2 cores
    uv run --no-sync python tools/attack_replay.py --quick         # fewer streams and put rows
    uv run --no-sync python tools/attack_replay.py --only issue22  # the probe's attacks only
    PYTHONPATH=/old/tree .venv/bin/python tools/attack_replay.py --only issue22

It uses the benchmarks' server and cache helpers (``benchmarks/_flight_common.py``).

Each attack runs against a fresh ``python -m flight_server`` subprocess on
loopback serving one cache of ``--records`` records of 1 KiB (written to a
temporary directory), with the default limits unless the row says otherwise:

1. ``get_flight_info`` with ``world_size`` 10^6 and 2^32 (and, for scale, the
   largest one answered, ``--max-endpoints``);
2. 512 ``do_get`` streams opened and never read, from several client processes
   and connections (whose transport stops too: see `attacker`), while a normal
   client reads a small epoch (2000 x 1 KiB):
   a. with the default limits (all loopback clients are one client: its address);
   b. with ``--max-streams 512 --max-streams-per-client 512
      --stream-idle-timeout 5``, to see the idle deadline free them;
   c. with the default limits and ``--token-file``: the attackers share one
      token, the normal client has its own (a client is then its token);
3. SIGTERM with 64 idle streams open (``--max-streams-per-client 64``, since
   all loopback clients are one client);
4. a 10-million-row ``do_put`` sent in batches, with ``--max-put-rows 1000000``;
5. a ``do_put`` whose table has two ``weight`` columns;

and then the attacks of the adversarial probe of issue 22 (`_fault_attacks`: a
shard cut under the server, re-spelt token headers, path traversal and deep
JSON in the audit CLI, a full state volume, the HTTP side port, bad tokens in
the metrics). ``--only issue10`` or ``--only issue22`` runs one set.

Printed: one table, "attack | what the server did | now | before", where
"before" is what the audit measured before the limits existed (or the probe,
before its fixes). Server RSS, threads and CPU time come from /proc/<pid>; open
streams and calls by status from the server's /metrics. Every loop and wait is
bounded in count and time (the attackers stop opening streams after a time
budget); clients are closed and every server stopped (killed if need be) in
``finally``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The shared helpers (a server subprocess, a cache of payloads, the table) live
# with the benchmarks; neither folder is a package, so both go on the path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _fault_attacks
from _flight_common import BenchError, ServerProcess, human_bytes, make_log, render, write_cache

DATASET = "attacks"
RECORD_BYTES = 1024
CALL_TIMEOUT = 60.0  # the gRPC deadline of a normal client's call
IDLE_CALL_TIMEOUT = 100.0  # ... of an idle stream (it must outlive the attack)
PHASE_TIMEOUT = IDLE_CALL_TIMEOUT + 60.0  # the most the attackers may take to report
PROBE_CHUNKS = 256  # the most batches a probe reads from one idle stream
PUT_CHUNK_ROWS = 65_536  # rows per record batch of the big put (~2 MiB)
PUT_LIMIT = 1_000_000  # --max-put-rows of attack 4
SHUTDOWN_STREAMS = 64
NO_BDP = [("grpc.http2.bdp_probe", 0)]  # the attackers' gRPC channel (see `attacker`)
CLIENT_MEMORY_CAP = 3 << 30  # an attacker process stops opening streams past this RSS
IDLE_TIMEOUT = 5.0  # --stream-idle-timeout of attack 2b
ATTACKER_TOKEN = "attacker-token-0123456789abcdef"
NORMAL_TOKEN = "normal-client-token-0123456789"
#: An epoch no one reads to the end (10^7 records of 1 KiB).
IDLE = {"dataset": DATASET, "seed": 7, "epoch": 0, "epoch_len": 10**7}
#: A normal client's epoch: 2000 records with their payloads.
NORMAL = {"dataset": DATASET, "seed": 1, "epoch": 0, "epoch_len": 2000}

log = make_log("attacks")


@dataclass(frozen=True)
class Scale:
    records: int
    idle_streams: int
    attackers: int  # client processes
    connections: int  # per client process (<= 16 streams each: see `attacker`)
    open_budget: float  # seconds the attackers may spend opening streams
    put_rows: int


FULL = Scale(20_000, 512, 8, 4, 40.0, 10_000_000)
QUICK = Scale(5_000, 128, 4, 2, 20.0, 2_000_000)


# -- what a client sees -------------------------------------------------------------


def status_of(error: BaseException) -> str:
    """The gRPC status a pyarrow client read from ``error`` (the server's own
    mapping), or the error's type when it is not a Flight status."""
    from flight_server.metrics import status_of as flight_status

    status = flight_status(error)
    return type(error).__name__ if status == "UNKNOWN" else status


def refusal(error: BaseException) -> str:
    """The status, and which limit or deadline its message names."""
    status = status_of(error)
    text = str(error)
    if status == "UNAVAILABLE":
        if "--max-streams-per-client" in text:
            return "UNAVAILABLE (per-client limit)"
        if "--max-streams " in text:
            return "UNAVAILABLE (total limit)"
    if status == "DEADLINE_EXCEEDED":
        if "--stream-idle-timeout" in text:
            return "DEADLINE_EXCEEDED (idle deadline)"
        return "DEADLINE_EXCEEDED (client's own deadline)"
    return status


def short(error: BaseException) -> str:
    return str(error).split(". Detail:")[0].split(". gRPC client debug")[0][:300]


def call_options(token: str | None = None, timeout: float = CALL_TIMEOUT) -> Any:
    import pyarrow.flight as flight

    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return flight.FlightCallOptions(timeout=timeout, headers=headers)


def ticket(body: dict[str, Any]) -> Any:
    import pyarrow.flight as flight

    return flight.Ticket(json.dumps(body).encode())


# -- the attackers: spawned processes holding idle streams --------------------------


def attacker(index: int, jobs: Any, results: Any) -> None:
    """Open idle streams on request (``("open", location, count, connections,
    token, budget)``: each takes its first batch and is then never read), hold
    them until ``("close", probe)``: then read up to PROBE_CHUNKS batches of the
    first ``probe`` streams (what does an idle stream's client get?), cancel
    them all and close the connections. ``None`` (or an orphaned process) ends.

    The connections turn gRPC's BDP probing off (``grpc.http2.bdp_probe`` 0), so
    that a client that stops reading also stops its transport: with it on, a
    pyarrow client's transport keeps widening its flow-control windows and takes
    the unread batches into its own memory (GiBs in seconds), the server streams
    on at full speed and never sees an idle stream. 16 streams per connection."""
    import pyarrow.flight as flight

    parent = os.getppid()
    clients: list[Any] = []
    readers: list[Any] = []
    while True:
        try:
            job = jobs.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() == parent:
                continue
            job = None  # orphaned: leave
        if job is None or job[0] == "close":
            outcomes: Counter[str] = Counter()
            for reader in readers[: job[1] if job else 0]:
                outcomes[probe(reader)] += 1
            for reader in readers:
                with contextlib.suppress(Exception):
                    reader.cancel()
            for client in clients:
                with contextlib.suppress(Exception):
                    client.close()
            readers.clear()
            clients.clear()
            if job is None:
                return
            results.put(("closed", index, dict(outcomes)))
            continue
        _, location, count, connections, token, budget = job
        began = time.monotonic()
        clients = [flight.connect(location, generic_options=NO_BDP) for _ in range(connections)]
        options = call_options(token, IDLE_CALL_TIMEOUT)
        opened: Counter[str] = Counter()
        messages: dict[str, str] = {}
        for i in range(count):
            if time.monotonic() - began > budget:
                opened["not tried (time budget)"] += count - i
                break
            if sample(os.getpid()).rss > CLIENT_MEMORY_CAP:
                opened["not tried (client memory cap)"] += count - i
                break
            try:
                reader = clients[i % connections].do_get(ticket(IDLE), options=options)
                reader.read_chunk()  # the stream started: the server admitted it
                readers.append(reader)
                opened["admitted"] += 1
            except Exception as error:  # counted by status: what the attacker saw
                kind = refusal(error)
                opened[kind] += 1
                messages.setdefault(kind, short(error))
        results.put(("opened", index, (dict(opened), messages, time.monotonic() - began)))


def probe(reader: Any) -> str:
    """Read an idle stream again: how it ends, or that it still streams."""
    try:
        for _ in range(PROBE_CHUNKS):
            reader.read_chunk()
    except StopIteration:
        return "ended"
    except Exception as error:  # the status is the figure
        return refusal(error)
    return f"still streaming after {PROBE_CHUNKS} batches"


class Attackers:
    """``size`` spawned attacker processes, reused by every attack."""

    def __init__(self, size: int) -> None:
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.jobs = [ctx.Queue() for _ in range(size)]
        self.procs = [
            ctx.Process(target=attacker, args=(i, q, self.results), daemon=True)
            for i, q in enumerate(self.jobs)
        ]
        for proc in self.procs:
            proc.start()
        self.busy = 0

    def _collect(self, kind: str) -> list[Any]:
        deadline = time.monotonic() + PHASE_TIMEOUT
        got: dict[int, Any] = {}
        while len(got) < self.busy:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"attackers: {self.busy - len(got)} not {kind} in time")
            try:
                state, index, body = self.results.get(timeout=min(1.0, left))
            except queue.Empty:
                continue
            if state == kind:
                got[index] = body
        return [got[i] for i in sorted(got)]

    def open(
        self,
        location: str,
        streams: int,
        processes: int,
        connections: int,
        budget: float,
        token: str | None = None,
    ) -> tuple[Counter[str], dict[str, str], float]:
        """``streams`` idle streams over ``processes`` processes; the outcomes, a
        message of each refusal kind, and the seconds the slowest process took."""
        self.busy = min(processes, len(self.jobs))
        for i in range(self.busy):
            count = streams // self.busy + (i < streams % self.busy)
            self.jobs[i].put(("open", location, count, connections, token, budget))
        outcomes: Counter[str] = Counter()
        messages: dict[str, str] = {}
        slowest = 0.0
        for opened, texts, seconds in self._collect("opened"):
            outcomes.update(opened)
            messages.update(texts)
            slowest = max(slowest, seconds)
        return outcomes, messages, slowest

    def close(self, probe_per_process: int = 0) -> Counter[str]:
        """Close every stream (reading the first few of each process again first)."""
        for i in range(self.busy):
            self.jobs[i].put(("close", probe_per_process))
        outcomes: Counter[str] = Counter()
        for probed in self._collect("closed"):
            outcomes.update(probed)
        self.busy = 0
        return outcomes

    def stop(self) -> None:
        for job_queue in self.jobs:
            with contextlib.suppress(Exception):
                job_queue.put(None)
        for proc in self.procs:
            proc.join(10.0)
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)


# -- the server ---------------------------------------------------------------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Sample:
    """A process's VmRSS, Threads and CPU seconds (user + system) at one moment."""

    rss: int
    threads: int
    cpu: float
    at: float

    def __str__(self) -> str:
        return f"{human_bytes(self.rss)}/{self.threads} thr"

    def cpu_share(self, later: Sample) -> str:
        """The share of one core the process used from this sample to ``later``."""
        span = later.at - self.at
        return f"{(later.cpu - self.cpu) / span:.0%}" if span > 0 else "-"


def sample(pid: int) -> Sample:
    """``pid``'s figures now (zeros once it is gone)."""
    rss = threads = 0
    cpu = 0.0
    with contextlib.suppress(OSError, IndexError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(stat[11]) + int(stat[12])) / CLOCK_TICKS  # utime, stime
    return Sample(rss, threads, cpu, time.monotonic())


class Peak:
    """Samples a process every 20 ms while in the ``with`` block: the peaks."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.rss = self.threads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            now = sample(self.pid)
            self.rss, self.threads = max(self.rss, now.rss), max(self.threads, now.threads)
            self._stop.wait(0.02)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def __str__(self) -> str:
        return f"{human_bytes(self.rss)}/{self.threads} thr"


@dataclass
class Server:
    """A ``python -m flight_server`` subprocess with ``--metrics-port 0``."""

    process: ServerProcess
    location: str
    metrics_url: str

    @property
    def pid(self) -> int:
        return self.process.proc.pid

    def sample(self) -> Sample:
        return sample(self.pid)

    def metrics(self) -> tuple[int, Counter[str]]:
        """Streams open now, and the do_get calls so far by status."""
        with urllib.request.urlopen(self.metrics_url + "/metrics", timeout=10) as answer:
            text = answer.read().decode()
        open_streams = 0.0
        calls: Counter[str] = Counter()
        pattern = re.compile(r'datasetrt_requests_total\{method="do_get",status="(\w+)"\} (\S+)')
        for line in text.splitlines():
            if line.startswith("datasetrt_streams_open{"):
                open_streams += float(line.rsplit(" ", 1)[1])
            found = pattern.match(line)
            if found:
                calls[found.group(1)] += int(float(found.group(2)))
        return int(open_streams), calls

    def stderr_tail(self) -> str:
        return self.process.stderr.read_text(errors="replace")[-4000:]


@contextlib.contextmanager
def running_server(name: str, cache: Path, root: Path, *extra: str) -> Iterator[Server]:
    # -P: the server imports what this process imports (PYTHONPATH), not the cwd's tree.
    command = [sys.executable, "-P", "-m", "flight_server", "--port", "0", "--metrics-port", "0"]
    command += ["--dataset", f"{DATASET}={cache}", "--state-dir", str(root / f"state-{name}")]
    command += ["--data-dir", str(root / "data"), "--log-level", "WARNING", *extra]
    process = ServerProcess.start(name, command, root)
    try:
        location = process.wait_location()
        deadline = time.monotonic() + 30.0
        url = None
        while url is None and time.monotonic() < deadline:
            url = re.search(r"metrics and probes at (http://\S+)", process.stdout.read_text())
            time.sleep(0.05)
        if url is None:
            raise BenchError(f"{name} server printed no metrics address")
        yield Server(process, location, url.group(1))
    finally:
        process.stop()  # SIGTERM, then SIGKILL after 10 s


# -- a normal client ------------------------------------------------------------------


def normal_epoch(location: str, token: str | None = None) -> tuple[str, float]:
    """A fresh client reads NORMAL whole: ``("OK", seconds)`` or the status it got."""
    import pyarrow.flight as flight

    began = time.monotonic()
    try:
        with flight.connect(location) as client:
            table = client.do_get(ticket(NORMAL), options=call_options(token)).read_all()
        if table.num_rows != NORMAL["epoch_len"]:
            return f"{table.num_rows} rows", time.monotonic() - began
        return "OK", time.monotonic() - began
    except Exception as error:  # the status is the figure
        return refusal(error), time.monotonic() - began


def epoch_figure(location: str, token: str | None = None, repeats: int = 3) -> str:
    """The median of ``repeats`` normal epochs, or how the first one failed."""
    times = []
    for _ in range(repeats):
        status, seconds = normal_epoch(location, token)
        if status != "OK":
            return f"{status} in {seconds * 1000:.0f} ms"
        times.append(seconds)
    return f"{statistics.median(times):.3f} s"


def info_figure(location: str, token: str | None = None) -> str:
    """A unary call (get_flight_info, world_size 8): not bounded by the stream slots."""
    import pyarrow.flight as flight

    body = {"dataset": DATASET, "seed": 1, "epoch": 0, "world_size": 8}
    began = time.monotonic()
    try:
        with flight.connect(location) as client:
            descriptor = flight.FlightDescriptor.for_command(json.dumps(body).encode())
            client.get_flight_info(descriptor, call_options(token))
    except Exception as error:  # the status is the figure
        return status_of(error)
    return f"{(time.monotonic() - began) * 1000:.0f} ms"


def act(client: Any, kind: str, body: dict[str, Any]) -> Any:
    import pyarrow.flight as flight

    action = flight.Action(kind, json.dumps(body).encode())
    [answer] = list(client.do_action(action, options=call_options()))
    return json.loads(answer.body.to_pybytes())


def population_state(client: Any) -> tuple[str, int]:
    """The active population and how many are stored."""
    answer = act(client, "list_populations", {"dataset": DATASET})
    return answer["active"]["population"], len(answer["populations"])


def send_put(client: Any, table: Any) -> tuple[str, int, str]:
    """``do_put`` of ``table`` in batches of PUT_CHUNK_ROWS: the outcome (the
    answer, or the status), the rows sent before it, and the error's message.
    The server's refusal may surface at a write, at the answer or at ``close``."""
    import pyarrow.flight as flight

    descriptor = flight.FlightDescriptor.for_command(json.dumps({"dataset": DATASET}).encode())
    writer, answers = client.do_put(descriptor, table.schema, options=call_options())
    sent = 0
    try:
        for batch in table.to_batches(max_chunksize=PUT_CHUNK_ROWS):
            writer.write_batch(batch)
            sent += batch.num_rows
        writer.done_writing()
        answer = answers.read()
        writer.close()
    except Exception as error:  # the status is the figure
        with contextlib.suppress(Exception):
            writer.close()
        return status_of(error), sent, short(error)
    body = answer.to_pybytes().decode()[:100] if answer is not None else "no PutResult"
    return f"accepted: {body}", sent, ""


def wait_for(condition: Callable[[], bool], timeout: float) -> float | None:
    """Seconds until ``condition`` held (polled every 0.1 s), None past ``timeout``."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if condition():
            return time.monotonic() - began
        time.sleep(0.1)
    return None


def counts(outcomes: Counter[str]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in outcomes.most_common()) or "none"


# -- the attacks ----------------------------------------------------------------------

Row = list[str]
STREAMS_BEFORE = "106 MiB/17 thr -> 1.8 GiB/530 thr; 1.58 GiB after they left"


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, attack: str, did: str, now: str, before: str = "") -> None:
        self.rows.append([attack, did, now, before])
        log(f"{attack} | {did} | {now}")


def attack_world_size(report: Report, server: Server) -> None:
    """1. get_flight_info with a huge world_size (and the largest one answered)."""
    import pyarrow.flight as flight

    befores = {10**6: "37 s, RSS +1.56 GiB", 2**32: "passed 4 GiB RSS in 87 s"}
    names = {10**6: "10^6", 2**32: "2^32", 65_536: "65536 (= the limit)"}
    with flight.connect(server.location) as client:
        for world_size in (10**6, 2**32, 65_536):
            body = {"dataset": DATASET, "seed": 1, "epoch": 0, "world_size": world_size}
            descriptor = flight.FlightDescriptor.for_command(json.dumps(body).encode())
            start = server.sample()
            with Peak(server.pid) as peak:
                began = time.monotonic()
                try:
                    answer = client.get_flight_info(descriptor, call_options())
                    did = f"answered, {len(answer.endpoints)} endpoints"
                except Exception as error:  # the status is the figure
                    did = status_of(error)
                    if "--max-endpoints 65536" in str(error):
                        did += ", names --max-endpoints"
                seconds = time.monotonic() - began
                time.sleep(0.3)
            end = server.sample()
            report.add(
                f"1. get_flight_info world_size {names[world_size]}",
                did,
                f"{seconds:.3f} s; RSS {human_bytes(start.rss)} -> {human_bytes(end.rss)} "
                f"(peak {human_bytes(peak.rss)})",
                befores.get(world_size, ""),
            )


@dataclass(frozen=True)
class StreamsAttack:
    tag: str
    options: str  # what the server runs with, for the table
    variant: bool = False  # wait for the idle deadline
    tokens: bool = False  # attackers share ATTACKER_TOKEN, the normal client has NORMAL_TOKEN


def attack_idle_streams(
    report: Report, server: Server, attackers: Attackers, scale: Scale, attack: StreamsAttack
) -> None:
    """2. Streams opened and never read; a normal client beside them."""
    tag = attack.tag
    attacker_token = ATTACKER_TOKEN if attack.tokens else None
    token = NORMAL_TOKEN if attack.tokens else None
    normal_epoch(server.location, token)  # warm-up
    start = server.sample()
    alone = epoch_figure(server.location, token)
    info_alone = info_figure(server.location, token)
    expired: float | None = None
    after_expiry: Sample | None = None
    epoch_expired = ""
    probed: Counter[str] = Counter()
    with Peak(server.pid) as peak:
        try:
            outcomes, messages, opening = attackers.open(
                server.location,
                scale.idle_streams,
                scale.attackers,
                scale.connections,
                scale.open_budget,
                attacker_token,
            )
            opened_at = time.monotonic()
            during = server.sample()
            open_during, _ = server.metrics()
            epoch_during = epoch_figure(server.location, token, repeats=1)
            info_during = info_figure(server.location, token)
            time.sleep(1.0)
            held = server.sample()
            if attack.variant:
                if wait_for(lambda: server.metrics()[0] == 0, IDLE_TIMEOUT + 20.0) is not None:
                    expired = time.monotonic() - opened_at
                time.sleep(1.5)  # the server returns memory at most once a second
                after_expiry = server.sample()
                epoch_expired = epoch_figure(server.location, token, repeats=1)
        finally:
            probed = attackers.close(probe_per_process=2 if attack.variant else 0)
    closed_at = time.monotonic()
    back = wait_for(lambda: server.sample().threads <= start.threads + 2, 10.0)
    time.sleep(1.5)
    after = server.sample()
    epoch_after = epoch_figure(server.location, token)
    time.sleep(1.5)
    settled = server.sample()
    _, calls = server.metrics()

    who = (
        "one token shared by the attackers" if attack.tokens else "one client: the loopback address"
    )
    report.add(
        f"{tag}. {scale.idle_streams} idle do_get streams ({attack.options})",
        counts(outcomes),
        f"{scale.attackers} processes x {scale.connections} connections, {who}; "
        f"{opening:.1f} s to open",
        "all 512 admitted",
    )
    for kind, text in sorted(messages.items()):
        report.notes.append(f"{tag}: {kind}: {text!r}")
    report.add(
        f"{tag}.   server RSS/threads",
        f"streams open (metrics): {open_during} after the attack"
        + (", 0 after the idle deadline" if expired is not None else ""),
        f"start {start}; attacked {during}"
        + (f"; deadline passed {after_expiry}" if after_expiry else "")
        + f"; clients gone {after}; after 3 normal epochs {human_bytes(settled.rss)} "
        f"(peak {peak})",
        STREAMS_BEFORE,
    )
    report.add(
        f"{tag}.   server CPU while held",
        "one core = 100%",
        f"{during.cpu_share(held)} over the 1 s after the attack",
    )
    if attack.variant:
        report.add(
            f"{tag}.   idle deadline ({IDLE_TIMEOUT:g} s)",
            "all cancelled" if expired is not None else "NOT all cancelled in time",
            (f"no stream open {expired:.1f} s after the attack" if expired is not None else "-")
            + f"; re-read idle streams got: {counts(probed)}",
            "none: held until the clients left",
        )
    report.add(
        f"{tag}.   normal client: epoch 2000 x 1 KiB",
        "its own token" if attack.tokens else "same address as the attackers",
        f"alone {alone}; beside them {epoch_during}"
        + (f"; past the deadline {epoch_expired}" if attack.variant else "")
        + f"; after they left {epoch_after}",
        "0.03 s -> 6-9 s",
    )
    report.add(
        f"{tag}.   normal client: get_flight_info",
        "a unary call needs no stream slot",
        f"alone {info_alone}; beside them {info_during}",
    )
    report.notes.append(
        f"{tag}: server /metrics do_get calls by status: {dict(calls)}; threads "
        + (
            f"back to start {back + closed_at - opened_at:.1f} s after the attack"
            if back is not None
            else "not back to start within 10 s of the close"
        )
    )


def attack_shutdown(report: Report, server: Server, attackers: Attackers, scale: Scale) -> None:
    """3. SIGTERM with idle streams open."""
    proc = server.process.proc
    try:
        outcomes, _, _ = attackers.open(server.location, SHUTDOWN_STREAMS, 4, 1, scale.open_budget)
        open_streams, _ = server.metrics()
        before = server.sample()
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code: int | str = proc.wait(60.0)
            took = f"{time.monotonic() - began:.2f} s"
        except subprocess.TimeoutExpired:
            code, took = "none: still running, killed", "> 60 s"
            proc.kill()
            proc.wait(10.0)
    finally:
        probed = attackers.close(probe_per_process=2)
    stalled = re.search(r"exiting with (\d+) streams", server.stderr_tail())
    report.add(
        f"3. SIGTERM with {open_streams} idle streams (--max-streams-per-client 64)",
        f"exit code {code}"
        + (f"; exits with {stalled.group(1)} stalled streams" if stalled else ""),
        f"exited {took} after the signal (--shutdown-grace 5); {before} at the signal; "
        f"re-read idle streams got: {counts(probed)}",
        "69.5 s (until the clients left)",
    )
    if outcomes.get("admitted", 0) != SHUTDOWN_STREAMS:
        report.notes.append(f"3: the idle streams: {counts(outcomes)}")


def attack_puts(report: Report, server: Server, scale: Scale) -> None:
    """4. A put of ``scale.put_rows`` rows; 5. a put with two weight columns."""
    import pyarrow as pa
    import pyarrow.flight as flight

    with flight.connect(server.location) as client:
        meta = client.do_get(ticket({"dataset": DATASET, "metadata": True})).read_all()
        state = population_state(client)
        big = pa.concat_tables([meta] * math.ceil(scale.put_rows / meta.num_rows))
        big = big.slice(0, scale.put_rows).combine_chunks()
        start = server.sample()
        with Peak(server.pid) as peak:
            began = time.monotonic()
            did, sent, message = send_put(client, big)
            seconds = time.monotonic() - began
            time.sleep(0.5)
        end = server.sample()
        if f"--max-put-rows {PUT_LIMIT}" in message:
            did += ", names --max-put-rows"
        if message:
            report.notes.append(f"4: {message!r}")
        unchanged = population_state(client) == state
        report.add(
            f"4. do_put {scale.put_rows / 1e6:g}M rows, {human_bytes(big.nbytes)} in batches "
            f"of {PUT_CHUNK_ROWS} (--max-put-rows {PUT_LIMIT})",
            did + ("; populations unchanged" if unchanged else "; POPULATIONS CHANGED"),
            f"{seconds:.2f} s; {sent / 1e6:.2f}M rows sent before the answer; RSS "
            f"{human_bytes(start.rss)} -> peak {human_bytes(peak.rss)} -> {human_bytes(end.rss)}",
            "accepted, RSS 2.08 GiB",
        )

        twice = meta.append_column("weight", meta.column("weight"))
        began = time.monotonic()
        did, _, message = send_put(client, twice)
        seconds = time.monotonic() - began
        if message:
            report.notes.append(f"5: {message!r}")
        after = population_state(client)
        report.add(
            f"5. do_put with two 'weight' columns ({meta.num_rows} rows)",
            did,
            f"{seconds:.3f} s; active population and count "
            + ("unchanged" if after == state else f"CHANGED: {state} -> {after}"),
            "",
        )


# -- the run --------------------------------------------------------------------------


def left_aligned(header: Row, rows: Sequence[Row]) -> tuple[Row, list[Row]]:
    """Pad every cell to its column's width: `render` right-aligns all but the first."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def pad(row: Row) -> Row:
        return [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]

    return pad(header), [pad(row) for row in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer streams and put rows")
    parser.add_argument("--records", type=int, default=None, help="records of 1 KiB in the cache")
    parser.add_argument(
        "--only",
        choices=["issue10", "issue22"],
        help="only the attacks of one audit: issue10 (1-5 above) or issue22 (_fault_attacks)",
    )
    args = parser.parse_args()
    scale = QUICK if args.quick else FULL
    records = args.records or scale.records
    report = Report()
    load = os.getloadavg()
    began = time.monotonic()
    attackers: Attackers | None = None
    with tempfile.TemporaryDirectory(prefix="attack-replay-") as tmp:
        root = Path(tmp)
        cache, wrote = write_cache(DATASET, records, RECORD_BYTES, root / "caches")
        log(f"wrote {records} records of 1 KiB in {wrote:.1f} s")
        tokens = root / "tokens"
        tokens.write_text(f"read {ATTACKER_TOKEN}\nread {NORMAL_TOKEN}\n")
        n = str(scale.idle_streams)
        variant = ["--max-streams", n, "--max-streams-per-client", n]
        variant += ["--stream-idle-timeout", f"{IDLE_TIMEOUT:g}"]
        streams_attacks = [
            (StreamsAttack("2a", "default limits"), []),
            (StreamsAttack("2b", " ".join(variant), variant=True), variant),
            (
                StreamsAttack("2c", "default limits, --token-file", tokens=True),
                # The bench reads /metrics without a token.
                ["--token-file", str(tokens), "--metrics-auth", "none"],
            ),
        ]
        try:
            if args.only != "issue22":
                attackers = Attackers(scale.attackers)
                with running_server("endpoints", cache, root) as server:
                    attack_world_size(report, server)
                for attack, options in streams_attacks:
                    with running_server(f"streams-{attack.tag}", cache, root, *options) as server:
                        attack_idle_streams(report, server, attackers, scale, attack)
                per_client = ["--max-streams-per-client", str(SHUTDOWN_STREAMS)]
                with running_server("shutdown", cache, root, *per_client) as server:
                    attack_shutdown(report, server, attackers, scale)
                with running_server("put", cache, root, "--max-put-rows", str(PUT_LIMIT)) as server:
                    attack_puts(report, server, scale)
        finally:
            if attackers is not None:
                attackers.stop()
        if args.only != "issue10":
            _fault_attacks.run_all(report, root, cache, DATASET)

    streams = (
        ""
        if args.only == "issue22"
        else f"; {scale.idle_streams} idle streams from {scale.attackers} client processes "
        f"(opening budget {scale.open_budget:g} s)"
    )
    print(
        f"{records} records of 1 KiB{streams}; all clients on loopback; "
        f"{time.monotonic() - began:.0f} s in all"
    )
    print(
        f"load average {load[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end, on "
        f"{os.cpu_count()} CPUs: figures are noisy"
    )
    print()
    header, rows = left_aligned(["attack", "what the server did", "now", "before"], report.rows)
    print(render(header, rows))
    if report.notes:
        print()
        for note in report.notes:
            print(f"- {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
