"""Cold replicas against MosaicML Streaming and LitData: the first record and the
first epoch of a replica that has only the bucket, with an unbounded mirror and
with a mirror of 10 % of the dataset, against the same server over the local cache
directory and against MosaicML Streaming (MDS) and LitData reading the same records
from the same bucket.

Run from the project root (needs Ceph from Debian's packages, as .ci/run installs,
and for MDS and LitData the ``peers`` group in ``.venv-peers``; without it they are
skipped, saying why)::

    uv run --no-sync python benchmarks/bench_streaming.py                 # 8,000 x 64 KiB (500 MiB)
    uv run --no-sync python benchmarks/bench_streaming.py --record-kib 1  # 100,000 x 1 KiB
    uv run --no-sync python benchmarks/bench_streaming.py --quick         # 64 MiB (1 KiB: 20,000)
    uv run --no-sync python benchmarks/bench_streaming.py --reps 5 --json out.json

One one-node Ceph radosgw on loopback (memstore OSD, tests/ceph_s3.py) holds the
records three times: our cache (``write_cache``, then ``upload_cache``), the same
payloads as MDS shards (``MDSWriter``, column ``payload: bytes``, 64 MiB shards,
no compression) and as LitData chunks (``litdata.optimize``, one worker, ``{"payload":
bytes}``, ``chunk_bytes="64MB"``, no compression), both uploaded with boto3. Every
repetition runs each system once, in an order rotated from one repetition to the
next:

- **ours, cold**: a fresh ``python -m flight_server --dataset bench=s3://...``
  with an empty mirror (no bound); one plain ``pyarrow.flight`` client reads one
  shuffled epoch (``{"dataset", "seed": 1, "epoch", "shuffle": true}``). Time to
  first batch runs from the client's first ``get_flight_info`` to the first
  record batch of ``do_get``; the epoch's throughput includes that call.
- **ours, 10 % mirror**: a fresh replica with ``--mirror-max-bytes`` a tenth of
  the cache's bytes, two consecutive epochs.
- **warm, local directory**: one ``flight_server`` over the cache directory for
  the whole run (a warm-up epoch first), one epoch per repetition: the reference
  of the ratios (targets: cold >= 0.8x warm, 10 % mirror >= 0.5x warm).
- **MDS, cold**: in a subprocess of ``.venv-peers/bin/python``,
  ``StreamingDataset(remote="s3://...", local=<fresh empty dir>, shuffle=True,
  batch_size=<our server's batch rows>)`` iterated in process (no DataLoader
  workers); first sample timed from the construction, the epoch likewise. MDS
  reads S3 through boto3 (``S3_ENDPOINT_URL``).
- **LitData, cold**: likewise, ``StreamingDataset(Dir(path=<fresh empty dir>,
  url="s3://..."), shuffle=True, seed=<rep>, storage_options=<the store's endpoint
  and keys>)``. LitData reads S3 through obstore (object_store's Python binding),
  whose client options it fixes in code; plain HTTP to the loopback store needs
  ``allow_http``, which the step adds to them (nothing else is changed).

Every epoch checks its record count and payload bytes. The store's requests and
bytes sent are radosgw's own counters (``perf dump``: ``rgw.req``, ``rgw.get_b``)
read around each system's epochs, up to the stop of a replica (a background
fetch still running at the end counts). A second table gives the CPU seconds per
GiB served of the reader (the server process; a peer's whole process) and of the
store (radosgw and the OSD, from ``/proc``). Loopback radosgw has far more
bandwidth and far less latency than a remote store, but it runs on the same
cores as the readers: where a system makes many requests, the store's CPU per
request is what bounds it here.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent / "tests"))

import _flight_common as common  # noqa: E402  (the benchmarks directory is not a package)
from ceph_s3 import CephS3  # noqa: E402

DATASET = "bench"
BUCKET = "bench"
OURS_PREFIX = "caches"
MIB, GIB = common.MIB, common.GIB
PEERS_PYTHON = common.PROJECT_ROOT / ".venv-peers" / "bin" / "python"
DEFAULT_BYTES, QUICK_BYTES = 500 * MIB, 64 * MIB
DEFAULT_MAX_RECORDS, QUICK_MAX_RECORDS = 100_000, 20_000
STREAM_TIMEOUT = 600.0  # one epoch (a gRPC deadline on the call; MDS: its subprocess)
SETUP_TIMEOUT = 900.0  # writing and uploading a peer's shards
MEMSTORE_BYTES = 8 << 30  # tests/ceph_s3.py's memstore device: every copy lives in it


OURS = ("warm", "cold", "mirror1", "mirror2")


@dataclass(frozen=True)
class Peer:
    """A loader users would pick instead, run in .venv-peers on the same bucket."""

    key: str  # its results, its steps (``<key>-write``, ``<key>-read``), its prefix
    name: str  # in the tables
    module: str  # what it imports as (its version)
    package: str  # what it is installed as


PEERS = (
    Peer("mds", "MDS", "streaming", "mosaicml-streaming"),
    Peer("litdata", "LitData", "litdata", "litdata"),
)


@dataclass
class Epoch:
    """One epoch of one system: seconds to the first record and to the end."""

    first: float
    seconds: float
    rows: int
    nbytes: int
    info: float = 0.0  # ours: seconds of the get_flight_info call, in ``first``
    requests: int = 0  # radosgw requests answered meanwhile
    fetched: int = 0  # bytes radosgw sent meanwhile
    store_cpu: float = 0.0  # CPU seconds of radosgw and the OSD meanwhile
    reader_cpu: float = 0.0  # CPU seconds of the replica's server process, or MDS's process

    @property
    def mib_s(self) -> float:
        return self.nbytes / MIB / self.seconds

    @property
    def requests_per_gib(self) -> float:
        return self.requests / (self.nbytes / GIB)

    @property
    def fetched_per_served(self) -> float:
        return self.fetched / self.nbytes

    def cpu_per_gib(self, seconds: float) -> float:
        return seconds / (self.nbytes / GIB)


# -- the store's counters -----------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rgw_counters(ceph: CephS3) -> tuple[int, int, float]:
    """Requests radosgw has answered and bytes it has sent (``rgw.req``, ``rgw.get_b``),
    and the CPU seconds of the store's daemons but the monitor (radosgw, the OSD)."""
    out = subprocess.run(
        ["ceph", "-c", str(ceph.root / "ceph.conf"), "daemon", "client.rgw", "perf", "dump"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    rgw = json.loads(out)["rgw"]
    daemons = [p.pid for p in ceph.processes if Path(str(p.args[0])).name != "ceph-mon"]
    return int(rgw["req"]), int(rgw["get_b"]), sum(cpu_seconds(pid) for pid in daemons)


def count_store(
    epoch: Epoch, before: tuple[int, int, float], after: tuple[int, int, float]
) -> Epoch:
    epoch.requests, epoch.fetched = after[0] - before[0], after[1] - before[1]
    epoch.store_cpu = after[2] - before[2]
    return epoch


# -- ours: plain pyarrow.flight against flight_server processes ---------------------


def flight_epoch(location: str, number: int, expect: tuple[int, int], who: str) -> Epoch:
    """One shuffled epoch, timed from the first ``get_flight_info``; checked against
    the expected ``(rows, payload bytes)``."""
    import pyarrow.compute as pc
    import pyarrow.flight as flight

    command = {"dataset": DATASET, "seed": 1, "epoch": number, "shuffle": True}
    options = flight.FlightCallOptions(timeout=STREAM_TIMEOUT)
    with flight.connect(location) as client:
        started = time.perf_counter()
        descriptor = flight.FlightDescriptor.for_command(json.dumps(command))
        info = client.get_flight_info(descriptor, options)
        info_s = time.perf_counter() - started
        reader = client.do_get(info.endpoints[0].ticket, options)
        first = None
        rows = nbytes = 0
        for chunk in reader:
            if first is None:
                first = time.perf_counter() - started
            payload = chunk.data.column("payload")
            rows += chunk.data.num_rows
            nbytes += int(pc.sum(pc.binary_length(payload)).as_py() or 0)
        seconds = time.perf_counter() - started
    if (rows, nbytes) != expect or first is None:
        raise common.BenchError(
            f"{who}: epoch {number} had {rows} rows / {nbytes} B, "
            f"expected {expect[0]} rows / {expect[1]} B"
        )
    return Epoch(first, seconds, rows, nbytes, info=info_s)


def served_epoch(server: Any, number: int, expect: tuple[int, int], who: str) -> Epoch:
    """`flight_epoch` from ``server``, with the CPU seconds its process spent."""
    before = cpu_seconds(server.proc.pid)
    epoch = flight_epoch(server.location, number, expect, who)
    epoch.reader_cpu = cpu_seconds(server.proc.pid) - before
    return epoch


def start_server(name: str, args: list[str], workdir: Path) -> tuple[Any, float]:
    """A ``flight_server`` process, once it prints its location; and the seconds that took."""
    command = [sys.executable, "-m", "flight_server", "--port", "0", "--log-level", "WARNING"]
    started = time.perf_counter()
    server = common.ServerProcess.start(name, [*command, *args], workdir)
    try:
        server.wait_location()
    except BaseException:
        server.stop()
        raise
    return server, time.perf_counter() - started


def stop_server(server: Any) -> None:
    """Stop it; a replica that exited on its own (a crash) fails the run."""
    code = server.proc.poll()
    server.stop()
    if code is not None:
        log = server.stderr.read_text(errors="replace")[-2000:]
        raise common.BenchError(f"{server.name} exited with code {code} before its stop:\n{log}")


# -- the peers: steps run by .venv-peers/bin/python (this file with --peer-step) ------


def uploaded(step: dict[str, Any], local: Path, write_s: float) -> dict[str, Any]:
    """Upload the files a peer wrote to ``local`` with boto3, one after another."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
    files = sorted(p for p in local.iterdir() if p.is_file())
    started = time.perf_counter()
    for path in files:
        s3.upload_file(str(path), step["bucket"], f"{step['prefix']}/{path.name}")
    return {
        "write_s": write_s,
        "upload_s": time.perf_counter() - started,
        "files": len(files),
        "bytes": sum(p.stat().st_size for p in files),
    }


def read_epoch(dataset: Any, started: float, cpu: float) -> dict[str, Any]:
    """Iterate a peer's dataset in this process; first sample and epoch from ``started``."""
    first = None
    rows = nbytes = 0
    for sample in dataset:
        if first is None:
            first = time.perf_counter() - started
        nbytes += len(sample["payload"])
        rows += 1
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu
    return {"first": first, "seconds": seconds, "rows": rows, "bytes": nbytes, "cpu": cpu}


def mds_write(step: dict[str, Any]) -> dict[str, Any]:
    """The same payloads as our cache as MDS shards in ``local``, uploaded with boto3."""
    from streaming import MDSWriter

    local, size = Path(step["local"]), step["size"]
    pool = memoryview(common.payload_pool())
    started = time.perf_counter()
    columns = {"payload": "bytes"}
    with MDSWriter(out=str(local), columns=columns, compression=None, progress_bar=False) as out:
        for offset in common.payload_offsets(step["count"], size):
            out.write({"payload": bytes(pool[offset : offset + size])})
    return uploaded(step, local, time.perf_counter() - started)


def mds_read(step: dict[str, Any]) -> dict[str, Any]:
    """One cold shuffled epoch of ``StreamingDataset`` in this process."""
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    cpu = time.process_time()
    started = time.perf_counter()
    dataset = StreamingDataset(
        remote=step["remote"],
        local=step["local"],
        shuffle=True,
        shuffle_seed=step["seed"],
        batch_size=step["batch_size"],
    )
    return read_epoch(dataset, started, cpu)


# What ``litdata_payload`` cuts from: set before ``optimize`` forks its worker.
_LITDATA_POOL = b""
_LITDATA_SIZE = 0


def litdata_payload(offset: int) -> dict[str, bytes]:
    return {"payload": _LITDATA_POOL[offset : offset + _LITDATA_SIZE]}


def litdata_write(step: dict[str, Any]) -> dict[str, Any]:
    """The same payloads as our cache as LitData chunks in ``local``, uploaded with boto3."""
    global _LITDATA_POOL, _LITDATA_SIZE
    from litdata import optimize

    local, _LITDATA_SIZE = Path(step["local"]), step["size"]
    _LITDATA_POOL = common.payload_pool()
    started = time.perf_counter()
    optimize(
        fn=litdata_payload,
        inputs=list(common.payload_offsets(step["count"], step["size"])),
        output_dir=str(local),
        chunk_bytes="64MB",
        num_workers=1,
        start_method="fork",
        verbose=False,
    )
    return uploaded(step, local, time.perf_counter() - started)


def litdata_read(step: dict[str, Any]) -> dict[str, Any]:
    """One cold shuffled epoch of LitData's ``StreamingDataset`` in this process."""
    from litdata import StreamingDataset
    from litdata.streaming import downloader
    from litdata.streaming.resolver import Dir

    # Plain HTTP to the loopback store: LitData fixes obstore's client options.
    downloader._OBSTORE_CLIENT_OPTIONS = {  # type: ignore[attr-defined]
        **downloader._OBSTORE_CLIENT_OPTIONS,  # type: ignore[attr-defined]
        "allow_http": "true",
    }
    options = {
        "endpoint_url": os.environ["S3_ENDPOINT_URL"],
        "aws_access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"],
    }
    cpu = time.process_time()
    started = time.perf_counter()
    dataset = StreamingDataset(
        Dir(path=step["local"], url=step["remote"]),
        shuffle=True,
        seed=step["seed"],
        storage_options=options,
    )
    return read_epoch(dataset, started, cpu)


PEER_STEPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "mds-write": mds_write,
    "mds-read": mds_read,
    "litdata-write": litdata_write,
    "litdata-read": litdata_read,
}


def run_peer_step(step: dict[str, Any], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run ``step`` in .venv-peers' interpreter; its last stdout line is its JSON answer."""
    command = [str(PEERS_PYTHON), __file__, "--peer-step", json.dumps(step)]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=env,
            cwd=common.PROJECT_ROOT, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as error:
        raise common.BenchError(f"{step['kind']} took more than {timeout:.0f} s") from error
    if done.returncode != 0:
        raise common.BenchError(
            f"{step['kind']} failed ({done.returncode}):\n{done.stderr[-3000:]}"
        )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def peer_problem(peer: Peer) -> str | None:
    """Why ``peer`` cannot run here, or None."""
    if not PEERS_PYTHON.exists():
        return (
            f"{PEERS_PYTHON.relative_to(common.PROJECT_ROOT)} does not exist (create it with "
            "`make bench-peers ARGS=--help`, or `UV_PROJECT_ENVIRONMENT=.venv-peers uv sync "
            "--locked --no-dev --group peers --no-install-project`)"
        )
    try:
        done = subprocess.run(
            [str(PEERS_PYTHON), "-c", f"import boto3, {peer.module}"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"importing {peer.module} in .venv-peers took more than 120 s"
    if done.returncode != 0:
        return f"{peer.module} does not import in .venv-peers: {done.stderr.strip()[-500:]}"
    return None


def peer_version(peer: Peer) -> str:
    done = subprocess.run(
        [str(PEERS_PYTHON), "-c", f"import {peer.module}; print({peer.module}.__version__)"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return done.stdout.strip()


# -- the run --------------------------------------------------------------------------


@dataclass
class Config:
    count: int
    size: int
    reps: int
    batch_rows: int  # our server's batch rows at this size; MDS's batch_size

    @property
    def total(self) -> int:
        return self.count * self.size

    @property
    def expect(self) -> tuple[int, int]:
        return self.count, self.total


def sizes(args: argparse.Namespace) -> Config:
    size = args.record_kib * 1024
    if args.records:
        count = args.records
    elif args.quick:
        count = min(QUICK_BYTES // size, QUICK_MAX_RECORDS)
    else:
        count = min(DEFAULT_BYTES // size, DEFAULT_MAX_RECORDS)
    rows = max(1, min(common.BATCH_ROWS, common.BATCH_BYTES // size))
    return Config(count, size, args.reps, rows)


def check_room(workdir: Path, config: Config, peers: int) -> None:
    """Enough free disk for the cache, each peer's shards, one mirror and one peer's
    local copy at a time; and the memstore for every copy in the bucket."""
    copies = 2 + peers + (1 if peers else 0)
    need = int(config.total * copies * 1.1) + GIB
    free = shutil.disk_usage(workdir).free
    if free < need:
        raise common.BenchError(
            f"{common.human_bytes(free)} free under {workdir}, {common.human_bytes(need)} needed"
        )
    stored = config.total * (1 + peers) * 1.1
    if stored > MEMSTORE_BYTES * 0.8:
        raise common.BenchError(
            f"{common.human_bytes(stored)} in the bucket: more than the memstore's "
            f"{common.human_bytes(MEMSTORE_BYTES)} allows (fewer --records)"
        )


class Bench:
    """The systems of one run, each measured once per repetition by `run_rep`."""

    def __init__(
        self, config: Config, ceph: CephS3, root: Path, cache: Path, url: str, cache_bytes: int
    ) -> None:
        self.config, self.ceph, self.root = config, ceph, root
        self.cache, self.url, self.cache_bytes = cache, url, cache_bytes
        self.mirror_max = cache_bytes // 10
        self.skipped: dict[str, str] = {}  # peer key: why it does not run
        self.setup_line = ""  # how long writing and uploading took
        self.peer_env: dict[str, str] = {}
        self.local: Any = None
        self.results: dict[str, list[Any]] = {
            key: [] for key in ("cold", "cold_start", "mirror1", "mirror2", "warm")
        } | {peer.key: [] for peer in PEERS}

    def log(self, message: str) -> None:
        print(f"[bench_streaming] {message}", file=sys.stderr, flush=True)

    def replica(self, name: str, extra: list[str]) -> tuple[Any, float, tuple[int, int]]:
        data_dir = self.root / name
        shutil.rmtree(data_dir, ignore_errors=True)
        args = ["--dataset", f"{DATASET}={self.url}", "--data-dir", str(data_dir), *extra]
        server, start_s = start_server(name, args, self.root)
        return server, start_s, rgw_counters(self.ceph)

    def cold(self, rep: int) -> None:
        server, start_s, before = self.replica(f"cold-{rep}", [])
        try:
            epoch = served_epoch(server, rep, self.config.expect, "cold replica")
        finally:
            stop_server(server)
        self.results["cold"].append(count_store(epoch, before, rgw_counters(self.ceph)))
        self.results["cold_start"].append(start_s)
        shutil.rmtree(self.root / f"cold-{rep}", ignore_errors=True)
        self.log(f"rep {rep} cold: {epoch.mib_s:.0f} MiB/s, first batch {epoch.first * 1e3:.0f} ms")

    def mirror(self, rep: int) -> None:
        extra = ["--mirror-max-bytes", str(self.mirror_max)]
        server, _, before = self.replica(f"mirror-{rep}", extra)
        expect = self.config.expect
        try:
            first = served_epoch(server, 2 * rep, expect, "10 % mirror replica")
            between = rgw_counters(self.ceph)
            second = served_epoch(server, 2 * rep + 1, expect, "10 % mirror replica")
        finally:
            stop_server(server)
        self.results["mirror1"].append(count_store(first, before, between))
        self.results["mirror2"].append(count_store(second, between, rgw_counters(self.ceph)))
        shutil.rmtree(self.root / f"mirror-{rep}", ignore_errors=True)
        self.log(f"rep {rep} 10 % mirror: {first.mib_s:.0f}, {second.mib_s:.0f} MiB/s")

    def warm(self, rep: int) -> None:
        epoch = served_epoch(self.local, rep, self.config.expect, "local server")
        self.results["warm"].append(epoch)
        self.log(f"rep {rep} warm local: {epoch.mib_s:.0f} MiB/s")

    def peer(self, peer: Peer, rep: int) -> None:
        if peer.key in self.skipped:
            return
        local = self.root / f"{peer.key}-local-{rep}"
        step = {
            "kind": f"{peer.key}-read",
            "remote": f"s3://{BUCKET}/{peer.key}",
            "local": str(local),
            "seed": rep,
            "batch_size": self.config.batch_rows,
        }
        before = rgw_counters(self.ceph)
        try:
            got = run_peer_step(step, self.peer_env, STREAM_TIMEOUT)
        finally:
            shutil.rmtree(local, ignore_errors=True)
        if (got["rows"], got["bytes"]) != self.config.expect or got["first"] is None:
            raise common.BenchError(
                f"{peer.name}: {got['rows']} samples / {got['bytes']} B, expected "
                f"{self.config.count} / {self.config.total} B"
            )
        epoch = Epoch(got["first"], got["seconds"], got["rows"], got["bytes"])
        epoch.reader_cpu = got["cpu"]
        self.results[peer.key].append(count_store(epoch, before, rgw_counters(self.ceph)))
        self.log(
            f"rep {rep} {peer.name}: {epoch.mib_s:.0f} MiB/s, first sample {epoch.first:.2f} s"
        )

    def run(self) -> None:
        peers = [functools.partial(self.peer, peer) for peer in PEERS]
        systems = [self.cold, self.mirror, self.warm, *peers]
        for rep in range(self.config.reps):
            shift = rep % len(systems)
            for system in systems[shift:] + systems[:shift]:
                system(rep)


# -- the report ---------------------------------------------------------------------


def spread(values: Sequence[float], fmt: str, unit: str = "") -> str:
    """``median (min-max)`` of ``values`` with ``fmt``, each followed by ``unit``."""
    if not values:
        return "-"
    text = lambda v: format(v, fmt) + unit  # noqa: E731
    middle = text(statistics.median(values))
    if len(values) == 1:
        return middle
    return f"{middle} ({text(min(values))}-{text(max(values))})"


def ratios(top: Sequence[Epoch], bottom: Sequence[Epoch], key: Callable[[Epoch], float]) -> str:
    """Per repetition ``key(top) / key(bottom)``: ``median (min-max)``."""
    if not top or not bottom:
        return "-"
    return spread([key(a) / key(b) for a, b in zip(top, bottom, strict=True)], ".2f", "x")


def report(bench: Bench) -> str:
    r = bench.results
    warm = r["warm"]
    rate = lambda e: e.mib_s  # noqa: E731
    first = lambda e: e.first  # noqa: E731
    rows = []
    for key, label, target in (
        ("warm", "ours, warm (local directory)", None),
        ("cold", "ours, cold replica", 0.8),
        ("mirror1", "ours, 10 % mirror, epoch 1", 0.5),
        ("mirror2", "ours, 10 % mirror, epoch 2", 0.5),
        *((peer.key, f"{peer.name} StreamingDataset, cold", None) for peer in PEERS),
    ):
        epochs = r[key]
        if not epochs:
            rows.append([label, "skipped", "-", "-", *["-"] * (2 * len(PEERS) + 2)])
            continue
        remote = key != "warm"
        vs_warm = ratios(epochs, warm, rate) if key != "warm" else "1.00x"
        if target is not None:
            median = statistics.median(e.mib_s / w.mib_s for e, w in zip(epochs, warm, strict=True))
            vs_warm += f" {'>=' if median >= target else '<'} {target}"
        against = []
        for peer in PEERS:
            theirs = r[peer.key]
            if key == peer.key:
                against += ["1.00x", "1.00x"]
            else:
                against += [ratios(epochs, theirs, rate), ratios(theirs, epochs, first)]
        rows.append(
            [
                label,
                spread([e.first * 1e3 for e in epochs], ".0f"),
                spread([e.mib_s for e in epochs], ".0f"),
                vs_warm,
                *against,
                spread([e.requests_per_gib for e in epochs], ".0f") if remote else "-",
                spread([e.fetched_per_served for e in epochs], ".2f") if remote else "-",
            ]
        )
    header = ["system", "first record ms", "MiB/s", "vs warm"]
    for peer in PEERS:
        header += [f"vs {peer.name} MiB/s", f"{peer.name} first / ours"]
    return common.render([*header, "store req / GiB", "fetched / served"], rows)


def cpu_report(bench: Bench) -> str:
    """Where the time goes: ours' get_flight_info, and CPU per GiB served."""
    rows = []
    for key, label in (
        ("warm", "ours, warm (local directory)"),
        ("cold", "ours, cold replica"),
        ("mirror1", "ours, 10 % mirror, epoch 1"),
        ("mirror2", "ours, 10 % mirror, epoch 2"),
        *((peer.key, f"{peer.name} StreamingDataset, cold") for peer in PEERS),
    ):
        epochs = bench.results[key]
        if not epochs:
            continue
        rows.append(
            [
                label,
                spread([e.info * 1e3 for e in epochs], ".0f") if key in OURS else "-",
                spread([e.cpu_per_gib(e.reader_cpu) for e in epochs], ".2f"),
                spread([e.cpu_per_gib(e.store_cpu) for e in epochs], ".2f")
                if key != "warm"
                else "-",
            ]
        )
    header = ["system", "get_flight_info ms", "reader CPU s / GiB", "store CPU s / GiB"]
    return common.render(header, rows)


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser(
        __doc__.split("\n\n")[0],
        f"{QUICK_BYTES // MIB} MiB (at most {QUICK_MAX_RECORDS:,} records)",
    )
    parser.add_argument("--record-kib", type=int, default=64, help="payload size (KiB)")
    parser.add_argument("--records", type=int, help="record count (default: 500 MiB of them, "
                        f"at most {DEFAULT_MAX_RECORDS:,})")  # fmt: skip
    parser.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    parser.add_argument("--no-peers", action="store_true", help="leave MDS and LitData out")
    parser.add_argument("--peer-step", help=argparse.SUPPRESS)  # run in .venv-peers
    args = parser.parse_args(argv)
    if args.peer_step:
        step = json.loads(args.peer_step)
        print(json.dumps(PEER_STEPS[step["kind"]](step)), flush=True)
        return 0
    config = sizes(args)
    if config.reps < 1 or config.count < 1:
        parser.error("--reps and --records must be positive")
    skipped = {
        peer.key: reason
        for peer in PEERS
        if (reason := "--no-peers" if args.no_peers else peer_problem(peer))
    }
    load_start = os.getloadavg()
    started = time.perf_counter()
    with common.scratch_dir(args.data_dir, "bench-streaming-") as root:
        check_room(root, config, len(PEERS) - len(skipped))
        with CephS3(root / "ceph") as ceph:
            bench = setup(config, ceph, root, skipped)
            try:
                bench.local, _ = start_server(
                    "local",
                    ["--dataset", f"{DATASET}={bench.cache}", "--data-dir", str(root / "local")],
                    root,
                )
                flight_epoch(bench.local.location, 1000, config.expect, "local (warm-up)")
                bench.run()
            finally:
                if bench.local is not None:
                    bench.local.stop()
    load_end = os.getloadavg()
    mib = config.total / MIB
    in_flight = os.environ.get("DATASET_RT_REQUESTS_IN_FLIGHT", "32 (default)")
    print(
        f"records: {config.count:,} x {config.size // 1024} KiB = {mib:.0f} MiB; our cache "
        f"{common.human_bytes(bench.cache_bytes)}, 10 % mirror --mirror-max-bytes "
        f"{bench.mirror_max}; DATASET_RT_REQUESTS_IN_FLIGHT {in_flight}; "
        f"{config.reps} repetitions, median (min-max)"
    )
    for peer in PEERS:
        if peer.key in bench.skipped:
            print(f"{peer.name} skipped: {bench.skipped[peer.key]}")
        else:
            print(f"{peer.name}: {peer.package} {peer_version(peer)}")
    print(f"MDS's batch_size: {config.batch_rows}, our batch rows")
    print(bench.setup_line)
    print(report(bench))
    print(cpu_report(bench))
    print(
        f"cold replica start (process to location): "
        f"{spread(bench.results['cold_start'], '.2f')} s, not in its first record"
    )
    print(
        "first record: ours from get_flight_info to the first batch; a peer's from "
        "StreamingDataset(...) to the first sample. vs <peer> MiB/s: ours / theirs; "
        "<peer> first / ours: above 1, ours is sooner. reader CPU: the replica's (or the "
        "local) server process, or the peer's whole process; store CPU: radosgw and the OSD"
    )
    print(
        common.load_line(
            (load_start, load_end),
            f"loopback radosgw on the same cores; run took {time.perf_counter() - started:.0f} s",
        )
    )
    if args.json:
        raw = {
            key: [asdict(v) if isinstance(v, Epoch) else v for v in values]
            for key, values in bench.results.items()
        }
        args.json.write_text(json.dumps({"config": asdict(config), "results": raw}, indent=1))
    return 0


def setup(config: Config, ceph: CephS3, root: Path, skipped: dict[str, str]) -> Bench:
    """The bucket with our cache and each peer's shards; the Bench over them."""
    import dataset_rt as drt

    os.environ.update(ceph.environment())
    ceph.create_bucket(BUCKET)
    # A fresh Ceph creates its data pools at the first write (a few seconds):
    # paid here by a throwaway upload of 20 MiB (one multipart shard), not by
    # whichever system uploads first.
    warmup, _ = common.write_cache("warmup", 320, 64 << 10, root / "warmup")
    drt._native.upload_cache(str(warmup), f"s3://{BUCKET}/warmup")
    cache, write_s = common.write_cache(DATASET, config.count, config.size, root / "caches")
    started = time.perf_counter()
    uploaded = drt._native.upload_cache(str(cache), f"s3://{BUCKET}/{OURS_PREFIX}")
    upload_s = time.perf_counter() - started
    bench = Bench(config, ceph, root, cache, uploaded.url, uploaded.bytes)
    line = (
        f"ours: written in {write_s:.1f} s, uploaded in {upload_s:.1f} s "
        f"({uploaded.bytes / MIB / upload_s:.0f} MiB/s)"
    )
    bench.skipped = dict(skipped)
    # TMPDIR: StreamingDataset leaves its file locks there (removed with ``root``).
    (root / "peers-tmp").mkdir()
    bench.peer_env = {
        **os.environ,
        "S3_ENDPOINT_URL": ceph.endpoint,
        "TMPDIR": str(root / "peers-tmp"),
    }
    for peer in PEERS:
        if peer.key in bench.skipped:
            continue
        step = {
            "kind": f"{peer.key}-write",
            "local": str(root / f"{peer.key}-out"),
            "count": config.count,
            "size": config.size,
            "bucket": BUCKET,
            "prefix": peer.key,
        }
        try:
            got = run_peer_step(step, bench.peer_env, SETUP_TIMEOUT)
        except common.BenchError as error:
            bench.skipped[peer.key] = f"writing its shards failed: {error}"
        else:
            line += (
                f"; {peer.name}: {got['files']} files written in {got['write_s']:.1f} s, "
                f"uploaded in {got['upload_s']:.1f} s "
                f"({got['bytes'] / MIB / got['upload_s']:.0f} MiB/s)"
            )
        finally:
            shutil.rmtree(root / f"{peer.key}-out", ignore_errors=True)
    bench.setup_line = line
    return bench


if __name__ == "__main__":
    sys.exit(main())
