"""The training loader's cost: per-step overhead over the raw client stream, and
the time from ``load_state_dict`` to the first batch of a resumed run.

    uv run --group torch python benchmarks/bench_loader.py           # full sizes
    uv run --group torch python benchmarks/bench_loader.py --quick   # a smoke run

One ``flight_server`` process serves caches of 1 KiB and 64 KiB records. Side by
side, the readers alternating epoch by epoch (a warm-up round first), median of
``--repeat`` rounds:

- **raw**: ``DatasetClient.epoch(..., batches=True)``, Arrow record batches as the
  server sends them (the ceiling a loader can reach);
- **loader**: ``FlightLoader`` batches of ``--batch-size`` samples (collated dicts:
  payloads as a list of bytes, ids as tensors) with 0 and 2 DataLoader workers,
  one loader each, its workers kept across epochs (``persistent_workers``, the
  default), so an epoch is what a training run's second and later epochs cost.

Then the time from ``iter()`` to the first batch: with warm workers (a new epoch
of a loader whose workers are running) and cold (a new loader: starting its
workers from the forkserver).

Then, for an epoch of 2 * 10**9 positions, the time from ``load_state_dict`` of a
state at position P (P = 0, 10**6, 10**9) to the first batch, on a server and in
process (``LocalSource``): it must not grow with P.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _flight_common import (
    SEED,
    ServerProcess,
    human_count,
    render,
    write_cache,
)

from dataset_rt.loader import LocalSource
from dataset_rt.torch import DatasetLoader
from flight_client import DatasetClient
from flight_client.torch import FlightLoader

HUGE_EPOCH = 2 * 10**9


def median(values: list[float]) -> float:
    return statistics.median(values)


def raw_epoch(location: str, dataset: str, epoch: int) -> int:
    with DatasetClient(location) as client:
        return sum(b.num_rows for b in client.epoch(dataset, SEED, epoch, batches=True))


def loader_epoch(loader: DatasetLoader, epoch: int) -> int:
    loader.set_epoch(epoch)
    return sum(len(b["payload"]) for b in loader)


def first_batch(loader: DatasetLoader, epoch: int) -> float:
    """Seconds from ``iter()`` to the first batch of ``epoch`` (the rest of the
    epoch is read, untimed, so that the next epoch starts clean)."""
    loader.set_epoch(epoch)
    started = time.perf_counter()
    batches = iter(loader)
    next(batches)
    elapsed = time.perf_counter() - started
    for _ in batches:
        pass
    return elapsed


def first_batch_after_resume(make: Callable[[], DatasetLoader], position: int) -> float:
    loader = make()
    # A checkpoint at ``position`` without reading up to it: a version 1 state
    # (no resumes recorded) still loads, as one span at its world and batch size.
    version_2 = ("run", "generation", "workers", "resumes")
    state = {k: v for k, v in loader.state_dict().items() if k not in version_2}
    state |= {"version": 1, "position": position}
    started = time.perf_counter()
    loader.load_state_dict(state)
    batch = next(iter(loader))
    elapsed = time.perf_counter() - started
    first = int(batch["position"][0])
    if first != position + loader.rank * loader.batch_size:
        raise RuntimeError(f"resumed at {first}, expected {position}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10x fewer records, one run each")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    repeat = 1 if args.quick else args.repeat
    sizes = [("1KiB", 1024, 200_000 // scale), ("64KiB", 64 * 1024, 8_000 // scale)]

    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        root = Path(tmp)
        caches = {}
        for name, size, count in sizes:
            caches[name], seconds = write_cache(f"c{name}", count, size, root / "caches")
            print(f"wrote {human_count(count)} records of {name} in {seconds:.1f} s", flush=True)
        command = [sys.executable, "-m", "flight_server", "--port", "0"]
        for name, path in caches.items():
            command += ["--dataset", f"d{name}={path}"]
        command += ["--state-dir", str(root / "state"), "--data-dir", str(root / "data")]
        server = ServerProcess.start("ours", command, root)
        try:
            location = server.wait_location()
            rows: list[list[str]] = []
            latency_rows: list[list[str]] = []
            for name, _, _ in sizes:
                dataset = f"d{name}"
                loaders = {
                    workers: FlightLoader(
                        location,
                        dataset,
                        batch_size=args.batch_size,
                        seed=SEED,
                        num_workers=workers,
                    )
                    for workers in (0, 2)
                }
                runs: dict[str, Callable[[int], int]] = {
                    "raw": lambda e, d=dataset: raw_epoch(location, d, e),
                    "loader, 0 workers": lambda e, lo=loaders[0]: loader_epoch(lo, e),
                    "loader, 2 workers": lambda e, lo=loaders[2]: loader_epoch(lo, e),
                }
                timings: dict[str, list[float]] = {label: [] for label in runs}
                samples: dict[str, int] = {}
                for round_ in range(repeat + 1):  # round 0 warms up (and starts workers)
                    for label, run in runs.items():
                        started = time.perf_counter()
                        samples[label] = run(round_)
                        if round_:
                            timings[label].append(time.perf_counter() - started)
                rates = {label: samples[label] / median(t) for label, t in timings.items()}
                for label, rate in rates.items():
                    rows.append(
                        [
                            name,
                            label,
                            f"{human_count(rate)}/s",
                            f"{rate / rates['raw']:.2f}x",
                            f"{1e6 * (1 / rate - 1 / rates['raw']) * args.batch_size:.0f} us",
                        ]
                    )
                    print(f"{name} {label}: {human_count(rate)} samples/s", flush=True)
                epoch = repeat + 1
                for workers, loader in loaders.items():
                    warm = []
                    for _ in range(repeat):
                        warm.append(first_batch(loader, epoch))
                        epoch += 1
                    cold = []
                    for _ in range(repeat):
                        fresh = FlightLoader(
                            location,
                            dataset,
                            batch_size=args.batch_size,
                            seed=SEED,
                            num_workers=workers,
                        )
                        cold.append(first_batch(fresh, 0))
                        del fresh
                    latency_rows.append(
                        [
                            name,
                            f"{workers} workers",
                            f"{median(warm) * 1e3:.1f} ms",
                            f"{median(cold) * 1e3:.1f} ms",
                        ]
                    )
            print()
            print(
                f"Per-step overhead, batch_size {args.batch_size} "
                f"(median of {repeat} alternated rounds after a warm-up)"
            )
            print(
                render(
                    ["payload", "reader", "samples/s", "vs raw", "extra per batch"],
                    rows,
                )
            )
            print()
            print("iter() -> first batch of an epoch (median)")
            print(render(["payload", "loader", "warm workers", "new loader"], latency_rows))

            resume_rows: list[list[str]] = []
            local = LocalSource([caches["1KiB"]], root / "local-state", name="d1KiB")
            makers: dict[str, Callable[[], DatasetLoader]] = {
                "server": lambda: FlightLoader(
                    location, "d1KiB", batch_size=args.batch_size, seed=SEED, epoch_len=HUGE_EPOCH
                ),
                "in-process": lambda: DatasetLoader(
                    local, "d1KiB", batch_size=args.batch_size, seed=SEED, epoch_len=HUGE_EPOCH
                ),
            }
            for face, make in makers.items():
                cells = [face]
                for position in (0, 10**6, 10**9):
                    seconds = median(
                        [first_batch_after_resume(make, position) for _ in range(repeat)]
                    )
                    cells.append(f"{seconds * 1e3:.1f} ms")
                resume_rows.append(cells)
            print()
            print(f"load_state_dict -> first batch, epoch of {HUGE_EPOCH:,} positions")
            print(render(["face", "position 0", "position 10^6", "position 10^9"], resume_rows))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
