"""The activation log at length (issue 46): a replica's start, and a read of the
active pointer, with 10^5 entries in the log.

Run from the project root::

    uv run --no-sync python benchmarks/bench_activation_log.py               # 10^5 entries
    uv run --no-sync python benchmarks/bench_activation_log.py --entries 10000

It opens a dataset over a small cache with its population store in a scratch
directory (a state directory: the log is files, written and read by the same code
as a bucket's objects), then writes ``--entries`` more log entries beside the ones
the engine wrote (each names the active population, with its own epoch length;
written directly, because an activation through the engine costs an fsync). It then
times, median of ``--repeats``:

- the start of a new replica (``DatasetService`` opened over the same store) with
  the checkpoint (``active-checkpoint.json``) pointing at the newest entry;
- the same start with the checkpoint removed: the log listed from its beginning,
  the baseline;
- a read of the active pointer on a running replica (``active()``; on a directory
  every read lists the entries after the newest it knows).

Ratios: checkpointed start / start without a checkpoint.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import dataset_rt as drt
from dataset_rt.service import DatasetService


class Records:
    name = "log_bench"

    def __iter__(self):  # type: ignore[no-untyped-def]
        for i in range(1000):
            yield drt.CacheInput(data=i.to_bytes(8, "little"), metadata={"label": i % 10})


def timed(action) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=10**5)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.entries < 1 or args.repeats < 1:
        parser.error("--entries and --repeats must be >= 1")

    scratch = Path(tempfile.mkdtemp(prefix="drt-log-bench-"))
    try:
        runtime = drt.DatasetRuntime(num_workers=2)
        config = drt.WriterConfig(show_progress=False)
        (written,) = runtime.write_cache(Records(), scratch / "caches", writer_config=config)
        assert isinstance(written, drt.CacheWriteSuccess), written
        caches = [str(written.path)]
        state = scratch / "state"
        first = DatasetService(runtime.native, "bench", caches, str(state))
        population = first.active().population
        [log] = list(state.rglob("active"))
        existing = sorted(log.iterdir())
        start_seq = int(existing[-1].stem) + 1
        began = time.perf_counter()
        for seq in range(start_seq, start_seq + args.entries):
            entry = {"population": population, "epoch_len": 1000 + seq}
            (log / f"{seq:020}.json").write_text(json.dumps(entry))
        newest = start_seq + args.entries - 1
        checkpoint = log.parent / "active-checkpoint.json"
        checkpoint.write_text(json.dumps({"seq": newest}))
        print(
            f"{args.entries} entries written in {time.perf_counter() - began:.1f} s; "
            f"the newest is {newest}"
        )

        def start() -> None:
            replica = DatasetService(runtime.native, "bench", caches, str(state))
            assert replica.active().epoch_len == 1000 + newest

        with_checkpoint = [timed(start) for _ in range(args.repeats)]
        checkpoint.unlink()
        without = [timed(start) for _ in range(args.repeats)]
        checkpoint.write_text(json.dumps({"seq": newest}))
        running = DatasetService(runtime.native, "bench", caches, str(state))
        reads = [timed(running.active) for _ in range(20 * args.repeats)]

        fast, slow = statistics.median(with_checkpoint), statistics.median(without)
        print(f"| figure ({args.entries} entries, median of {args.repeats}) | seconds |")
        print("|---|---|")
        print(f"| replica start, checkpoint | {fast:.3f} |")
        print(f"| replica start, log listed from its beginning (baseline) | {slow:.3f} |")
        read = statistics.median(reads)
        print(f"| a read of the active pointer on a running replica | {read:.5f} |")
        print(f"ratio, checkpointed start / baseline: {fast / slow:.3f}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
