"""Datasets of many caches (issue 48, "Figures"): a parallel write on Ray against
one process, the commit and the open at 10^2-10^4 caches.

Run from the project root (needs Ray: ``uv sync --group ray``)::

    uv run --no-sync python benchmarks/bench_distributed.py    # 10^6 x 1 KiB; 10^2-10^4 parts
    uv run --no-sync python benchmarks/bench_distributed.py --records 200000 --commit-parts 100,1000
    uv run --no-sync python benchmarks/bench_distributed.py --skip-write   # commit and open only

It prints three tables; nothing is asserted on a timing.

1. **Write.** The same rows (``--records`` records of ``--payload-bytes`` bytes of
   pseudo-random payload, each a function of its row id, and an int64 ``label``),
   in the same ``--blocks`` partitions, written three ways:

   - (a) one process: ``DatasetWrite.begin`` + ``write_part`` of each partition in
     turn + ``commit``, in a fresh subprocess whose peak RSS (``VmHWM``) is the
     driver's;
   - (b) Ray Data, ``ray.data.range(N, override_num_blocks=B).map_batches(make_rows)
     .write_datasink(CacheDatasink(...))``, on a local Ray cluster of one node of
     1 CPU (``ray.cluster_utils.Cluster`` on loopback, as ``tests/on_ray/``);
   - (c) the same on two nodes of 1 CPU each.

   The rows are made by the same function in both places (inside the Ray tasks
   for b and c); ``--batch`` is capped at a block's rows, so each Ray write task
   gets one block and the parts are the partitions of (a). The cluster's start and
   one no-op task per node (so a worker process exists on each) are outside the
   timed part; Ray Data's planning, its task scheduling and the commit are inside
   it. Each cluster runs ``--ray-runs`` writes (the first also pays Ray Data's
   start on the cluster and each worker's first import of ``dataset_rt``), then
   the same pipeline ending in ``count()`` instead of the sink: Ray's own share.
   Figures: records/s, MB/s of payload, ratio to (a), the peak RSS of each Ray
   worker process (``VmHWM``, sampled every 0.2 s, of the processes below this
   one whose command line names ``ray::`` or ``default_worker.py``) and whether
   every write's descriptor lists the same ``cache_id`` values, part for part.

2. **Commit.** For each ``--commit-parts`` count, that many parts of one row each
   (``write_part`` of a 1-row table, about 3 ms each) at a local directory, then
   ``write.commit(parts, name=...)`` timed alone (median of ``--repeats``; the
   descriptor is removed between repeats), and the descriptor's size.

3. **Open.** Each of those datasets opened in a fresh subprocess, RSS (``VmRSS``)
   read before and after: ``DatasetRuntime(num_workers=2).open_dataset(loc,
   reader_config=ReaderConfig(seed=0))``, and as the server opens it,
   ``DatasetService(runtime.native, "d", [loc], state_dir)`` over a fresh state
   directory; with the file descriptors and memory maps of the dataset's files
   held after it (against ``ulimit -n`` and ``vm.max_map_count``), and
   ``open_dataset`` again under ``ulimit -n`` ``--low-nofile`` (1024, a common
   default; 0 skips it). An open that fails is reported with its error.

All data goes under one temporary directory (``--tmp-dir``, the system's by
default), removed at the end; the script refuses to start with less than 20 GB
free there.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Before Ray is imported (tests/on_ray/conftest.py): every node, worker and driver
# takes the loopback address as its own.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np
import pyarrow as pa

import dataset_rt as drt
from dataset_rt.parts import DatasetWrite, Part, read_descriptor

QUIET = drt.WriterConfig(show_progress=False)
MIN_FREE_BYTES = 20 * 10**9
PAYLOAD = "payload"


# ---- the rows -------------------------------------------------------------------------


def make_rows(batch: dict[str, np.ndarray], payload_bytes: int) -> pa.Table:
    """The rows of the ids in ``batch["id"]``: each a function of its id alone, so any
    batching of the same ids gives the same rows (pseudo-random payload, no repeats)."""
    ids = np.asarray(batch["id"], dtype=np.uint64)
    with np.errstate(over="ignore"):
        # splitmix64 of the id, then one multiply-add per word: cheap and not compressible.
        z = ids + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
        words = -(-payload_bytes // 8)
        steps = np.arange(1, 2 * words + 1, 2, dtype=np.uint64) * np.uint64(0xD6E8FEB86659FD93)
        block = z[:, None] * steps[None, :] + (z >> np.uint64(17))[:, None]
    data = np.ascontiguousarray(block.view(np.uint8)[:, :payload_bytes])
    n = len(ids)
    offsets = np.arange(0, (n + 1) * payload_bytes, payload_bytes, dtype=np.int64)
    payload = pa.Array.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    label = pa.array((ids % np.uint64(1000)).astype(np.int64))
    return pa.table({PAYLOAD: payload, "label": label})


def ray_blocks(records: int, blocks: int) -> list[tuple[int, int]]:
    """(start, count) of each block of ``ray.data.range(records, override_num_blocks=blocks)``
    (Ray's RangeDatasource: blocks of ``records // blocks`` ids, a last one of the rest)."""
    size = max(1, records // blocks)
    return [(start, min(size, records - start)) for start in range(0, records, size)]


def part_reader(start: int, count: int, payload_bytes: int, batch: int) -> pa.RecordBatchReader:
    """The rows of ids ``start .. start+count`` as a stream of batches of ``batch`` rows."""

    def batches() -> Iterator[pa.RecordBatch]:
        for lo in range(start, start + count, batch):
            ids = np.arange(lo, min(lo + batch, start + count), dtype=np.int64)
            yield from make_rows({"id": ids}, payload_bytes).to_batches()

    schema = make_rows({"id": np.arange(1, dtype=np.int64)}, payload_bytes).schema
    return pa.RecordBatchReader.from_batches(schema, batches())


# ---- /proc ------------------------------------------------------------------------------


def proc_status(pid: int | str = "self") -> dict[str, int]:
    """The kB fields of /proc/<pid>/status (VmRSS, VmHWM, RssAnon, ...), in bytes."""
    out = {}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB":
            out[key] = int(parts[0]) * 1024
    return out


def descendants(root: int) -> list[int]:
    """The processes below ``root`` (children, their children, ...)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    below, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        children = [p for p, pp in parent.items() if pp == pid]
        below.extend(children)
        frontier.extend(children)
    return below


def ray_workers() -> list[int]:
    """Ray worker processes below this one (``ray::...`` or ``default_worker.py``)."""
    workers = []
    for pid in descendants(os.getpid()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"ray::" in cmdline or b"default_worker.py" in cmdline:
            workers.append(pid)
    return workers


class PeakSampler:
    """Every 0.2 s, the VmHWM of each Ray worker process: its peak survives its exit."""

    def __init__(self) -> None:
        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        for pid in ray_workers():
            hwm = proc_status(pid).get("VmHWM", 0)
            self.peaks[pid] = max(self.peaks.get(pid, 0), hwm)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._sample()

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f}"


# ---- 1. the write -----------------------------------------------------------------------


def engine_workers() -> int:
    """As `dataset_rt.ray` sizes each Ray worker's runtime."""
    return max(1, min(4, os.cpu_count() or 1))


def single_process_write(
    location: str, records: int, payload_bytes: int, blocks: int, batch: int
) -> dict[str, Any]:
    """(a), run in a fresh subprocess (``--_single``): its VmHWM is the driver's peak."""
    from dataset_rt.ray import part_name

    runtime = drt.DatasetRuntime(num_workers=engine_workers())
    before = proc_status()
    start = time.perf_counter()
    write = DatasetWrite.begin(location)
    parts = [
        write.write_part(
            part_name(i),
            part_reader(lo, count, payload_bytes, batch),
            payload_column=PAYLOAD,
            runtime=runtime,
            writer_config=QUIET,
        )
        for i, (lo, count) in enumerate(ray_blocks(records, blocks))
    ]
    committed = write.commit(parts, name="bench")
    seconds = time.perf_counter() - start
    after = proc_status()
    return {
        "seconds": seconds,
        "records": committed.records,
        "rss_before": before["VmRSS"],
        "peak_rss": after["VmHWM"],
        "peak_anon_end": after.get("RssAnon", 0),
    }


def run_single(location: Path, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--_single", str(location)]
    command += ["--records", str(args.records), "--payload-bytes", str(args.payload_bytes)]
    command += ["--blocks", str(args.blocks), "--batch", str(args.batch)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"the single-process write failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def cache_ids(location: Path) -> list[str]:
    descriptor = read_descriptor(location)
    assert descriptor is not None, location
    return [c["cache_id"] for c in descriptor["caches"]]


def run_ray(scratch: Path, nodes: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """(b) and (c): a fresh local cluster of ``nodes`` nodes of 1 CPU; ``--ray-runs``
    writes on it, each to a new location, then the same pipeline without the sink."""
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from dataset_rt.ray import CacheDatasink

    # Ray's session directory (logs, sockets, spilled objects) in the scratch too.
    node = {
        "num_cpus": 1,
        "object_store_memory": args.object_store_mib << 20,
        "temp_dir": str(scratch / "ray"),
    }
    began = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        for _ in range(nodes - 1):
            cluster.add_node(**node)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING)
        for logger in ("ray", "ray.data"):
            logging.getLogger(logger).setLevel(logging.ERROR)
        alive = [n for n in ray.nodes() if n["Alive"]]  # type: ignore[no-untyped-call]
        assert len(alive) == nodes, alive

        @ray.remote(num_cpus=1)
        def ready() -> int:
            return os.getpid()

        # A worker process on every node before the clock starts.
        ray.get(
            [
                ready.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
                ).remote()
                for n in alive
            ]
        )
        startup = time.perf_counter() - began
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.execution_options.preserve_order = True

        def rows() -> Any:
            return ray.data.range(args.records, override_num_blocks=args.blocks).map_batches(
                functools.partial(make_rows, payload_bytes=args.payload_bytes),
                batch_size=args.batch,
                batch_format="numpy",
            )

        results: list[dict[str, Any]] = []
        with PeakSampler() as peaks:
            for run in range(args.ray_runs):
                location = scratch / f"ray-{nodes}-{run}"
                start = time.perf_counter()
                sink = CacheDatasink(
                    location, name="bench", payload_column=PAYLOAD, writer_config=QUIET
                )
                rows().write_datasink(sink)
                seconds = time.perf_counter() - start
                assert sink.committed is not None
                results.append(
                    {
                        "seconds": seconds,
                        "records": sink.committed.records,
                        "ids": cache_ids(location),
                    }
                )
                shutil.rmtree(location, ignore_errors=True)
            # The same pipeline, its rows counted instead of written: Ray's share.
            start = time.perf_counter()
            counted = rows().count()
            results.append({"seconds": time.perf_counter() - start, "records": counted})
        for r in results:
            r["startup"] = startup
            r["worker_peaks"] = sorted(peaks.peaks.values(), reverse=True)
        return results
    finally:
        ray.shutdown()
        cluster.shutdown()  # type: ignore[no-untyped-call]


def bench_write(scratch: Path, args: argparse.Namespace) -> None:
    payload_mb = args.records * args.payload_bytes / 1e6
    # map_batches bundles input blocks until a task has batch_size rows: a batch no
    # larger than a block keeps one block a task, so the parts are the blocks.
    args.batch = min(args.batch, max(1, args.records // args.blocks))
    print(
        f"\n## write: {args.records:,} records x {args.payload_bytes} B + int64 label, "
        f"{args.blocks} partitions ({payload_mb:,.0f} MB of payload), load {load()}"
    )
    location = scratch / "single"
    single = run_single(location, args)
    single["ids"] = cache_ids(location)
    shutil.rmtree(location, ignore_errors=True)
    print(f"  (a) one process: {single['seconds']:.2f} s (load {load()})", flush=True)
    rows: list[tuple[str, dict[str, Any]]] = [("(a) one process, write_part x B in turn", single)]
    for nodes, letter in ((1, "b"), (2, "c")):
        shape = f"{nodes} node{'s' if nodes > 1 else ''} x 1 CPU"
        results = run_ray(scratch, nodes, args)
        for run, r in enumerate(results):
            if "ids" not in r:
                label = f"({letter}) Ray Data, {shape}: the pipeline counted, not written"
            elif run == 0:
                label = f"({letter}) Ray Data, {shape}: first job on the cluster"
            else:
                label = f"({letter}) Ray Data, {shape}: job {run + 1} on the same cluster"
            rows.append((label, r))
        timings = ", ".join(f"{r['seconds']:.2f}" for r in results)
        print(
            f"  ({letter}) {shape}: {timings} s, cluster start {results[0]['startup']:.1f} s "
            f"(load {load()})",
            flush=True,
        )

    base = single["seconds"]
    print()
    print("| write | seconds | records/s | MB/s | ratio to (a) | peak RSS per process (MiB) |")
    print("|---|---|---|---|---|---|")
    for label, r in rows:
        assert r["records"] == args.records, (label, r)
        if "worker_peaks" in r:
            peaks = r["worker_peaks"]
            memory = f"Ray workers: max {mib(peaks[0])} (all {len(peaks)}: "
            memory += ", ".join(mib(p) for p in peaks) + ")"
        else:
            memory = f"driver {mib(r['peak_rss'])} (after imports: {mib(r['rss_before'])})"
        s = r["seconds"]
        print(
            f"| {label} | {s:.2f} | {args.records / s:,.0f} | {payload_mb / s:,.0f} "
            f"| {base / s:.2f}x | {memory} |"
        )
    ids = [r["ids"] for _, r in rows if "ids" in r]
    same = all(i == ids[0] for i in ids)
    print(
        f"\nthe same cache_ids, part for part ({len(ids[0])} parts), in all "
        f"{len(ids)} writes: {same}"
    )
    if not same:
        for label, r in rows:
            if "ids" in r:
                print(f"  {label}: {r['ids']}")


# ---- 2. commit, 3. open -----------------------------------------------------------------


def tiny_parts(
    location: Path, count: int, runtime: drt.DatasetRuntime
) -> tuple[DatasetWrite, list[Part]]:
    write = DatasetWrite.begin(location)
    parts = []
    for i in range(count):
        table = pa.table(
            {
                PAYLOAD: pa.array([i.to_bytes(8, "little")], pa.binary()),
                "label": pa.array([i], pa.int64()),
            }
        )
        parts.append(
            write.write_part(
                f"part-{i:05d}",
                table,
                payload_column=PAYLOAD,
                runtime=runtime,
                writer_config=QUIET,
            )
        )
    return write, parts


def open_in_subprocess(kind: str, location: Path, state: Path, nofile: int = 0) -> dict[str, Any]:
    """One open in a fresh interpreter; ``nofile`` lowers its soft ``ulimit -n``."""
    command = [sys.executable, __file__, "--_open", kind, str(location), str(state), str(nofile)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit status {done.returncode}"}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def open_once(kind: str, location: str, state: str, nofile: str) -> dict[str, Any]:
    """Run in a fresh subprocess (``--_open``): one open, RSS before and after."""
    if int(nofile):
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (int(nofile), hard))
    from dataset_rt.service import DatasetService

    runtime = drt.DatasetRuntime(num_workers=2)
    before = proc_status()["VmRSS"]
    start = time.perf_counter()
    if kind == "runtime":
        opened: Any = runtime.open_dataset(location, reader_config=drt.ReaderConfig(seed=0))
        rows = opened.num_rows
    else:
        opened = DatasetService(runtime.native, "d", [location], state)
        rows = len(opened.cache_ids)
    seconds = time.perf_counter() - start
    status = proc_status()
    # What the open holds per cache: file descriptors and memory maps of its files.
    fds = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            fds += os.readlink(f"/proc/self/fd/{fd}").startswith(location)
    maps = sum(location in line for line in Path("/proc/self/maps").read_text().splitlines())
    return {
        "seconds": seconds,
        "rss_growth": status["VmRSS"] - before,
        "rows": rows,
        "fds": fds,
        "maps": maps,
    }


def bench_commit_and_open(scratch: Path, args: argparse.Namespace) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        max_maps = Path("/proc/sys/vm/max_map_count").read_text().strip()
    except OSError:
        max_maps = "?"
    print(
        f"\n## commit and open, ulimit -n {soft} (hard {hard}), vm.max_map_count {max_maps}, "
        f"load {load()}"
    )
    runtime = drt.DatasetRuntime(num_workers=2)
    commits = []
    opens = []
    low: list[tuple[int, dict[str, Any]]] = []
    for count in args.commit_parts:
        location = scratch / f"commit-{count}"
        began = time.perf_counter()
        write, parts = tiny_parts(location, count, runtime)
        made = time.perf_counter() - began
        times = []
        for repeat in range(args.repeats):
            if repeat:
                (location / "descriptor.json").unlink()
            start = time.perf_counter()
            committed = write.commit(parts, name="bench")
            times.append(time.perf_counter() - start)
            assert committed.created, committed
            assert committed.caches == count, committed
        size = (location / "descriptor.json").stat().st_size
        commits.append((count, statistics.median(times), min(times), size, made))
        print(
            f"  {count} parts: written in {made:.1f} s ({made / count * 1e3:.1f} ms a part), "
            f"commit {statistics.median(times) * 1e3:.1f} ms (load {load()})",
            flush=True,
        )
        for kind in ("runtime", "service"):
            state = scratch / f"state-{count}-{kind}"
            result = open_in_subprocess(kind, location, state)
            shutil.rmtree(state, ignore_errors=True)
            opens.append((count, kind, result))
            print(f"  {count} caches, open ({kind}): {result}", flush=True)
        if args.low_nofile:
            state = scratch / f"state-{count}-low"
            result = open_in_subprocess("runtime", location, state, args.low_nofile)
            shutil.rmtree(state, ignore_errors=True)
            low.append((count, result))

    print()
    print(f"| parts | commit, ms (median of {args.repeats}) | ms a part | descriptor bytes |")
    print("|---|---|---|---|")
    for count, median, _, size, _ in commits:
        print(f"| {count:,} | {median * 1e3:.1f} | {median * 1e3 / count:.4f} | {size:,} |")
    print()
    print(
        "| caches | open as | seconds | ms a cache | RSS growth (MiB) | RSS KiB a cache "
        "| marginal ms / RSS KiB a cache | fds / maps of its files held |"
    )
    print("|---|---|---|---|---|---|---|---|")
    names = {"runtime": "`open_dataset`", "service": "`DatasetService`"}
    previous: dict[str, tuple[int, dict[str, Any]]] = {}
    for count, kind, r in opens:
        if "error" in r:
            print(f"| {count:,} | {names[kind]} | failed: {r['error']} | | | | | |")
            continue
        # Between this size and the one before: the cost of one more cache, without
        # what any open costs once (the engine's first allocations).
        marginal = ""
        if kind in previous:
            n0, r0 = previous[kind]
            ms = (r["seconds"] - r0["seconds"]) * 1e3 / (count - n0)
            kib = (r["rss_growth"] - r0["rss_growth"]) / 1024 / (count - n0)
            marginal = f"{ms:.3f} / {kib:.1f}"
        previous[kind] = (count, r)
        print(
            f"| {count:,} | {names[kind]} | {r['seconds']:.3f} | {r['seconds'] * 1e3 / count:.3f} "
            f"| {r['rss_growth'] / 2**20:,.1f} | {r['rss_growth'] / 1024 / count:.1f} "
            f"| {marginal} | {r['fds']:,} / {r['maps']:,} |"
        )
    if low:
        print(f"\n`open_dataset` with `ulimit -n {args.low_nofile}` (a common default):")
        for count, r in low:
            print(f"- {count:,} caches: " + r.get("error", "opened"))


# ---- main -------------------------------------------------------------------------------


def counts(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("a comma-separated list of counts >= 1")
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10**6)
    parser.add_argument("--payload-bytes", type=int, default=1024)
    parser.add_argument("--blocks", type=int, default=8, help="partitions (Ray blocks, parts)")
    parser.add_argument("--batch", type=int, default=8192, help="rows a map_batches batch")
    parser.add_argument("--object-store-mib", type=int, default=512)
    parser.add_argument("--ray-runs", type=int, default=2, help="writes on each cluster")
    parser.add_argument("--commit-parts", type=counts, default=[100, 1000, 10000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--low-nofile", type=int, default=1024, help="also open under this ulimit -n (0: no)"
    )
    parser.add_argument("--skip-write", action="store_true")
    parser.add_argument("--skip-commit", action="store_true")
    parser.add_argument("--tmp-dir", default=None)
    parser.add_argument("--_single", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_open", nargs=4, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args._single is not None:
        result = single_process_write(
            args._single, args.records, args.payload_bytes, args.blocks, args.batch
        )
        print(json.dumps(result))
        return 0
    if args._open is not None:
        print(json.dumps(open_once(*args._open)))
        return 0
    sizes = (args.records, args.payload_bytes, args.blocks, args.batch, args.repeats, args.ray_runs)
    if min(sizes) < 1:
        parser.error("--records, --payload-bytes, --blocks, --batch, --repeats, --ray-runs >= 1")

    root = args.tmp_dir or tempfile.gettempdir()
    free = shutil.disk_usage(root).free
    if free < MIN_FREE_BYTES:
        print(
            f"Only {free / 1e9:.1f} GB free under {root}; this benchmark needs 20 GB there. "
            "Free some space or pass --tmp-dir on a larger disk."
        )
        return 1
    print(f"{os.cpu_count()} cores, load {load()}, {free / 1e9:.0f} GB free under {root}")
    scratch = Path(tempfile.mkdtemp(prefix="drt-dist-", dir=root))
    try:
        if not args.skip_write:
            bench_write(scratch, args)
        if not args.skip_commit:
            bench_commit_and_open(scratch, args)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\nload at the end {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
