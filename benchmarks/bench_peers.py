"""Our writer, reader and Flight server against the loaders users pick instead.

    make bench-peers                   # full sizes (its own environment, .venv-peers)
    make bench-peers ARGS="--quick"    # a few MiB per measurement, one run

The same records (1 KiB, 64 KiB and 1 MiB payloads, each with an integer
``label``; 16, 128 and 256 MiB of them by default, ``--mib`` for one amount at
every size) through:

- **write**: ``dataset_rt``'s ``write_cache`` from a Python iterable (its fsyncs
  included), TFRecord (``tf.io.TFRecordWriter``, ``tf.train.Example`` records, 8
  files), MosaicML Streaming (``MDSWriter``), ArrayRecord (``ArrayRecordWriter``,
  8 files, what Grain reads) and WebDataset (``TarWriter``, 8 tar shards). The
  peers do not fsync; each is also timed with an fsync of its files at the end
  (``+fsync``), so both sides of the comparison are shown.
- **read**: one shuffled epoch in-process, every payload touched (``len``):
  ours per sample (``for sample in dataset``, weighted draws, every payload
  verified), ``tf.data`` over the TFRecords (shuffle buffer, parallel reads and
  parse), Streaming's ``StreamingDataset`` (shuffle), Grain's ``MapDataset``
  over the ArrayRecords (global shuffle), WebDataset (shard shuffle and a
  sample buffer).
- **service**: ``python -m flight_server`` with one plain ``pyarrow.flight``
  client against the tf.data service (a dispatcher and a worker on loopback,
  the TFRecord pipeline distributed through it, one client); throughput and
  the server side's CPU seconds per GiB (``/proc/<pid>/stat``).

Each measurement runs in a fresh process, ours and the peers alternate in each
round, a warm-up round comes first (the first heavy work of a process on this
VM is slow, see benchmarks/README.md), and the table shows the median of
``--runs`` rounds. Every measurement checks its record and byte counts.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = BENCH_DIR.parent
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
SIZES = (KIB, 64 * KIB, MIB)
FILES = 8
SHUFFLE_BUFFER = 10_000
PEERS = ("tfrecord", "mds", "arrayrecord", "webdataset")
FORMATS = ("ours", *PEERS)
SERVERS = ("ours", "tfdata-service")
STEP_TIMEOUT = 900.0
DEFAULT_MIB = {KIB: 16, 64 * KIB: 128, MIB: 256}
QUICK_MIB = {KIB: 8, 64 * KIB: 16, MIB: 32}
SERVER_START_TIMEOUT = 120.0


# -- the records -------------------------------------------------------------------


def records(count: int, size: int) -> Iterator[tuple[bytes, int]]:
    """``count`` distinct payloads of ``size`` bytes (slices of one random block) and labels."""
    block = os.urandom(size + 4096)
    for i in range(count):
        start = (i * 613) % 4096
        yield block[start : start + size], i % 10


def fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- writers: each writes ``count`` records of ``size`` into the empty dir ``out`` ----


def write_ours(out: Path, count: int, size: int) -> None:
    import dataset_rt as drt

    class Source:
        name = "peers"

        def __iter__(self) -> Iterator[Any]:
            for data, label in records(count, size):
                yield drt.CacheInput(data=data, metadata={"label": label})

    runtime = drt.DatasetRuntime(num_workers=2)
    config = drt.WriterConfig(show_progress=False)
    [result] = runtime.write_cache(Source(), out, writer_config=config)
    if not isinstance(result, drt.CacheWriteSuccess):
        raise SystemExit(f"write_cache failed: {result!r}")


def write_tfrecord(out: Path, count: int, size: int) -> None:
    import tensorflow as tf

    writers = [tf.io.TFRecordWriter(str(out / f"part-{i}.tfrecord")) for i in range(FILES)]
    for i, (data, label) in enumerate(records(count, size)):
        example = tf.train.Example(
            features=tf.train.Features(
                feature={
                    "data": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                }
            )
        )
        writers[i % FILES].write(example.SerializeToString())
    for writer in writers:
        writer.close()


def write_mds(out: Path, count: int, size: int) -> None:
    from streaming import MDSWriter

    columns = {"data": "bytes", "label": "int"}
    with MDSWriter(out=str(out), columns=columns, compression=None, progress_bar=False) as writer:
        for data, label in records(count, size):
            writer.write({"data": data, "label": label})


def write_arrayrecord(out: Path, count: int, size: int) -> None:
    from array_record.python.array_record_module import ArrayRecordWriter

    # The label in 8 bytes before the payload: ArrayRecord stores opaque records.
    writers = [
        ArrayRecordWriter(str(out / f"part-{i}.array_record"), "group_size:1") for i in range(FILES)
    ]
    for i, (data, label) in enumerate(records(count, size)):
        writers[i % FILES].write(label.to_bytes(8, "little") + data)
    for writer in writers:
        writer.close()


def write_webdataset(out: Path, count: int, size: int) -> None:
    import webdataset as wds

    writers = [wds.TarWriter(str(out / f"shard-{i:02d}.tar")) for i in range(FILES)]
    for i, (data, label) in enumerate(records(count, size)):
        writers[i % FILES].write({"__key__": f"{i:010d}", "bin": data, "cls": label})
    for writer in writers:
        writer.close()


WRITERS: dict[str, Callable[[Path, int, int], None]] = {
    "ours": write_ours,
    "tfrecord": write_tfrecord,
    "mds": write_mds,
    "arrayrecord": write_arrayrecord,
    "webdataset": write_webdataset,
}


# -- readers: one shuffled epoch over what the writer wrote; (records, payload bytes) --


def read_ours(data: Path, seed: int) -> tuple[int, int]:
    import dataset_rt as drt

    runtime = drt.DatasetRuntime(num_workers=2)
    config = drt.ReaderConfig(seed=seed, shuffle=True)
    dataset = runtime.cached_dataset([data / "peers"], reader_config=config)
    count = nbytes = 0
    for sample in dataset:
        nbytes += len(sample.data)
        count += 1
    return count, nbytes


def tfrecord_dataset(data: Path, seed: int) -> Any:
    import tensorflow as tf

    spec = {
        "data": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }
    files = sorted(str(p) for p in data.glob("*.tfrecord"))
    return (
        tf.data.Dataset.from_tensor_slices(files)
        .shuffle(len(files), seed=seed)
        .interleave(
            tf.data.TFRecordDataset, cycle_length=FILES, num_parallel_calls=tf.data.AUTOTUNE
        )
        .shuffle(SHUFFLE_BUFFER, seed=seed)
        .map(
            lambda record: tf.io.parse_single_example(record, spec),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        .prefetch(tf.data.AUTOTUNE)
    )


def read_tfrecord(data: Path, seed: int) -> tuple[int, int]:
    count = nbytes = 0
    for example in tfrecord_dataset(data, seed).as_numpy_iterator():
        nbytes += len(example["data"])
        count += 1
    return count, nbytes


def read_mds(data: Path, seed: int) -> tuple[int, int]:
    from streaming import StreamingDataset

    dataset = StreamingDataset(local=str(data), shuffle=True, shuffle_seed=seed, batch_size=1)
    count = nbytes = 0
    for sample in dataset:
        nbytes += len(sample["data"])
        count += 1
    return count, nbytes


def read_arrayrecord(data: Path, seed: int) -> tuple[int, int]:
    import grain

    files = sorted(str(p) for p in data.glob("*.array_record"))
    source = grain.sources.ArrayRecordDataSource(files)
    dataset = grain.MapDataset.source(source).shuffle(seed=seed)
    count = nbytes = 0
    for record in dataset:
        nbytes += len(record) - 8
        count += 1
    return count, nbytes


def read_webdataset(data: Path, seed: int) -> tuple[int, int]:
    import webdataset as wds

    urls = sorted(str(p) for p in data.glob("*.tar"))
    dataset = wds.WebDataset(urls, shardshuffle=len(urls), seed=seed, empty_check=False).shuffle(
        SHUFFLE_BUFFER
    )
    count = nbytes = 0
    for sample in dataset:
        nbytes += len(sample["bin"])
        count += 1
    return count, nbytes


READERS: dict[str, Callable[[Path, int], tuple[int, int]]] = {
    "ours": read_ours,
    "tfrecord": read_tfrecord,
    "mds": read_mds,
    "arrayrecord": read_arrayrecord,
    "webdataset": read_webdataset,
}


# -- services ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def serve_tfdata(port: int) -> None:
    """A tf.data service dispatcher and one worker in this process, until killed."""
    import tensorflow as tf

    service = tf.data.experimental.service
    dispatcher = service.DispatchServer(service.DispatcherConfig(port=port))
    worker = service.WorkerServer(
        service.WorkerConfig(dispatcher_address=f"localhost:{port}", port=free_port())
    )
    print("ready", flush=True)
    worker.join()
    dispatcher.join()


def consume_tfdata_service(data: Path, port: int, seed: int, size: int) -> tuple[int, int]:
    import tensorflow as tf

    # Batched on the worker, as users of the service do (and as our server
    # sends batches): the same rows per batch as ours.
    rows = max(1, min(1024, 4 * MIB // size))
    dataset = (
        tfrecord_dataset(data, seed)
        .batch(rows)
        .apply(
            tf.data.experimental.service.distribute(
                processing_mode="parallel_epochs", service=f"grpc://localhost:{port}"
            )
        )
    )
    count = nbytes = 0
    for batch in dataset.as_numpy_iterator():
        nbytes += sum(map(len, batch["data"]))
        count += len(batch["data"])
    return count, nbytes


def consume_flight(location: str, seed: int) -> tuple[int, int]:
    import pyarrow.compute as pc
    import pyarrow.flight as flight

    ticket = json.dumps({"dataset": "peers", "seed": seed, "epoch": 0, "shuffle": True})
    client = flight.connect(location)
    count = nbytes = 0
    for chunk in client.do_get(flight.Ticket(ticket.encode())):
        batch = chunk.data
        count += batch.num_rows
        if batch.num_rows:
            nbytes += pc.sum(pc.binary_length(batch.column("payload"))).as_py()
    client.close()
    return count, nbytes


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def server(kind: str, data: Path, workdir: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """Our Flight server over the cache in ``data``, or the tf.data service."""
    port = free_port()
    out = workdir / f"{kind}.out"
    if kind == "ours":
        command = [sys.executable, "-m", "flight_server", "--port", str(port)]
        command += ["--dataset", f"peers={data / 'peers'}", "--state-dir", str(workdir / "state")]
        ready = "grpc://"
    else:
        command = [sys.executable, __file__, "--serve-tfdata", str(port)]
        ready = "ready"
    with out.open("wb") as sink:
        proc = subprocess.Popen(command, cwd=PROJECT_ROOT, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while ready not in out.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{kind} server did not start:\n{out.read_text()[-2000:]}")
            time.sleep(0.05)
        yield proc, f"grpc://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


# -- one measurement, in its own process -------------------------------------------


#: What each step imports before its clock starts (TensorFlow takes seconds).
IMPORTS = {
    "ours": ["dataset_rt", "pyarrow.flight", "pyarrow.compute"],
    "tfrecord": ["tensorflow"],
    "tfdata-service": ["tensorflow"],
    "mds": ["streaming"],
    "arrayrecord": ["array_record.python.array_record_module", "grain"],
    "webdataset": ["webdataset"],
}


def measure(step: dict[str, Any]) -> dict[str, float]:
    """Run one step (in a fresh process); seconds, own CPU seconds and what was moved."""
    kind, fmt, count, size = step["kind"], step["format"], step["count"], step["size"]
    target = Path(step["dir"])
    before = os.times()
    began = time.perf_counter()
    if kind == "write":
        WRITERS[fmt](target, count, size)
        moved = (count, count * size)
        if step.get("fsync"):
            fsync_tree(target)
    else:
        moved = READERS[fmt](target, step["seed"])
    seconds = time.perf_counter() - began
    after = os.times()
    cpu = (after.user - before.user) + (after.system - before.system)
    return {"seconds": seconds, "cpu": cpu, "records": moved[0], "bytes": moved[1]}


def measure_service(step: dict[str, Any], workdir: Path) -> dict[str, float]:
    data, seed = Path(step["dir"]), step["seed"]
    with server(step["format"], data, workdir) as (proc, location):
        cpu_before = cpu_seconds(proc.pid)
        began = time.perf_counter()
        if step["format"] == "ours":
            moved = consume_flight(location, seed)
        else:
            port = int(location.rsplit(":", 1)[1])
            moved = consume_tfdata_service(data, port, seed, step["size"])
        seconds = time.perf_counter() - began
        cpu = cpu_seconds(proc.pid) - cpu_before
    return {"seconds": seconds, "cpu": cpu, "records": moved[0], "bytes": moved[1]}


def run_step(step: dict[str, Any], workdir: Path) -> dict[str, float]:
    """Run ``step`` in a fresh interpreter and check what it moved."""
    command = [sys.executable, __file__, "--step", json.dumps(step), "--workdir", str(workdir)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=STEP_TIMEOUT, env=env
    )
    if done.returncode != 0:
        raise SystemExit(f"step {step} failed:\n{done.stderr[-3000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    expected = (step["count"], step["count"] * step["size"])
    if (result["records"], result["bytes"]) != expected:
        raise SystemExit(
            f"step {step}: moved {result['records']} records / {result['bytes']} bytes, "
            f"expected {expected[0]} / {expected[1]}"
        )
    return result


# -- the driver --------------------------------------------------------------------


def check_disk(root: Path, needed: int) -> None:
    free = shutil.disk_usage(root).free
    if free < needed:
        raise SystemExit(
            f"{root} has {free / GIB:.1f} GiB free; this run needs {needed / GIB:.1f} GiB "
            "(use --mib to write less, or --data-dir elsewhere)"
        )


def mib_s(result: dict[str, float]) -> float:
    return result["bytes"] / MIB / result["seconds"]


def cpu_per_gib(result: dict[str, float]) -> float:
    return result["cpu"] / (result["bytes"] / GIB)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 MiB per measurement, one run")
    parser.add_argument(
        "--mib",
        type=int,
        help="MiB of payload per measurement (default: 16 at 1 KiB, where the peers read "
        "a few MiB/s, 128 at 64 KiB, 256 at 1 MiB; --quick: 8, 16, 32)",
    )
    parser.add_argument("--runs", type=int, default=3, help="rounds after the warm-up")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also dump raw results here")
    parser.add_argument("--only", default="write,read,service", help="sections, comma-separated")
    parser.add_argument("--peers", default=",".join(PEERS), help="peers, comma-separated")
    parser.add_argument("--data-dir", type=Path, default=BENCH_DIR / ".bench-data")
    parser.add_argument("--step", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--serve-tfdata", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_tfdata:
        serve_tfdata(args.serve_tfdata)
        return
    if args.step:
        step = json.loads(args.step)
        for module in IMPORTS[step["format"]]:
            importlib.import_module(module)
        if step["kind"] == "service":
            print(json.dumps(measure_service(step, args.workdir)))
        else:
            print(json.dumps(measure(step)))
        return

    runs = 1 if args.quick else args.runs
    sections = [s for s in args.only.split(",") if s]
    peers = [p for p in args.peers.split(",") if p]
    unknown = set(peers) - set(PEERS) | set(sections) - {"write", "read", "service"}
    if unknown:
        raise SystemExit(f"unknown peers or sections {sorted(unknown)}; peers: {PEERS}")
    formats = ["ours", *peers]
    args.data_dir.mkdir(parents=True, exist_ok=True)
    mibs = {size: args.mib or (QUICK_MIB if args.quick else DEFAULT_MIB)[size] for size in SIZES}
    check_disk(args.data_dir, 3 * len(formats) * max(mibs.values()) * MIB)
    load_start = os.getloadavg()
    results: list[dict[str, Any]] = []
    began = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="bench-peers-", dir=args.data_dir))
    try:
        for size in SIZES:
            count = max(1, mibs[size] * MIB // size)
            results += bench_size(workdir, sections, formats, count, size, runs)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report(results, sections, mibs, runs, time.perf_counter() - began, load_start)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def bench_size(
    workdir: Path, sections: list[str], formats: list[str], count: int, size: int, runs: int
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    label = size_label(size)
    base = {"count": count, "size": size}
    if "write" in sections:
        variants = [(fmt, fmt != "ours") for fmt in formats] + [(fmt, False) for fmt in formats[1:]]
        samples: dict[tuple[str, bool], list[dict[str, float]]] = {v: [] for v in variants}
        for round_ in range(runs + 1):  # round 0 is the warm-up
            for fmt, fsync in variants:
                target = workdir / f"w-{fmt}"
                target.mkdir()
                step = base | {"kind": "write", "format": fmt, "dir": str(target), "fsync": fsync}
                result = run_step(step, workdir)
                shutil.rmtree(target)
                if round_:
                    samples[fmt, fsync].append(result)
                name = fmt + (" +fsync" if fsync else "")
                print(f"[peers] write {label} {name}: {mib_s(result):,.0f} MiB/s", flush=True)
        for (fmt, fsync), got in samples.items():
            out.append(summary("write", label, fmt + (" +fsync" if fsync else ""), got))
    data = {fmt: workdir / f"r-{fmt}" for fmt in formats}
    if "read" in sections or "service" in sections:
        for fmt in formats if "read" in sections else ["ours", "tfrecord"]:
            data[fmt].mkdir()
            run_step(base | {"kind": "write", "format": fmt, "dir": str(data[fmt])}, workdir)
    if "read" in sections:
        reads: dict[str, list[dict[str, float]]] = {fmt: [] for fmt in formats}
        for round_ in range(runs + 1):
            for fmt in formats:
                step = base | {"kind": "read", "format": fmt, "dir": str(data[fmt]), "seed": round_}
                result = run_step(step, workdir)
                if round_:
                    reads[fmt].append(result)
                print(f"[peers] read {label} {fmt}: {mib_s(result):,.0f} MiB/s", flush=True)
        out += [summary("read", label, fmt, got) for fmt, got in reads.items()]
    if "service" in sections:
        served: dict[str, list[dict[str, float]]] = {kind: [] for kind in SERVERS}
        for round_ in range(runs + 1):
            for kind in SERVERS:
                fmt_dir = data["ours" if kind == "ours" else "tfrecord"]
                step = base | {
                    "kind": "service",
                    "format": kind,
                    "dir": str(fmt_dir),
                    "seed": round_,
                }
                result = run_step(step, workdir)
                if round_:
                    served[kind].append(result)
                print(f"[peers] service {label} {kind}: {mib_s(result):,.0f} MiB/s", flush=True)
        out += [summary("service", label, kind, got) for kind, got in served.items()]
    for path in data.values():
        shutil.rmtree(path, ignore_errors=True)
    return out


def size_label(size: int) -> str:
    return f"{size // KIB} KiB" if size < MIB else f"{size // MIB} MiB"


def summary(section: str, size: str, name: str, got: list[dict[str, float]]) -> dict[str, Any]:
    return {
        "section": section,
        "size": size,
        "name": name,
        "mib_s": statistics.median(mib_s(r) for r in got),
        "cpu_s_per_gib": statistics.median(cpu_per_gib(r) for r in got),
        "runs": got,
    }


SETTINGS = {
    "write": (
        "ours: write_cache from a Python iterable (records verified by xxh3, shards, index, "
        "metadata table, fsync of every file and directory; no compression). Peers: no "
        "compression, 8 files where the format has files (MDS: its default shard size); "
        "TFRecord stores tf.train.Example protos, ArrayRecord the label in 8 bytes before "
        "the payload (group_size 1). '+fsync': the peer's files fsynced at the end, in the time."
    ),
    "read": (
        "one epoch, every payload's length taken in Python. Shuffles differ: ours draws "
        "with replacement by weight (weights 1: uniform) over the whole dataset; Grain "
        "shuffles the global index; MDS shuffles shards and samples within spans of shards "
        "(its default algorithm); tf.data and WebDataset shuffle the file order and then "
        f"a {SHUFFLE_BUFFER:,}-sample buffer, not the whole dataset."
    ),
    "service": (
        "ours: python -m flight_server (defaults), one pyarrow.flight client, a ticket with "
        "shuffle: true. tf.data service: a dispatcher and one worker in one process on "
        "loopback, the TFRecord pipeline above distributed with parallel_epochs, one client. "
        "Server CPU: the server process (ours) or the dispatcher+worker process, per GiB."
    ),
}


def report(
    results: list[dict[str, Any]],
    sections: list[str],
    mibs: dict[int, int],
    runs: int,
    elapsed: float,
    load_start: tuple[float, float, float],
) -> None:
    per_size = ", ".join(f"{mibs[size]} MiB of {size_label(size)}" for size in SIZES)
    print(f"\nbench_peers: {per_size}; median of {runs} run(s) after a warm-up; {elapsed:.0f} s\n")
    for section in sections:
        rows = [r for r in results if r["section"] == section]
        ours = {r["size"]: r for r in rows if r["name"] == "ours"}
        print(f"{section}: MiB/s (ours / it), CPU s/GiB")
        header = f"{'size':7} | {'':22} | {'MiB/s':>7} | {'ours / it':>9} | {'CPU s/GiB':>9}"
        print(header)
        print("-" * len(header))
        for r in rows:
            ratio = ours[r["size"]]["mib_s"] / r["mib_s"]
            name = "ours" if r["name"] == "ours" else r["name"]
            print(
                f"{r['size']:7} | {name:22} | {r['mib_s']:7,.0f} | {ratio:8.2f}x | "
                f"{r['cpu_s_per_gib']:9.2f}"
            )
        print(f"  {SETTINGS[section]}\n")
    end = os.getloadavg()
    print(
        f"load average at start {load_start[0]:.2f} / end {end[0]:.2f} on {os.cpu_count()} "
        "CPUs: with other work on the machine the figures move by tens of percent."
    )


if __name__ == "__main__":
    main()
