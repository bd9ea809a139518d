"""Per-sample epochs of the three stream modes over one cache of payloads.

    uv run python benchmarks/bench_modes.py            # 512 MiB of 64 KiB records
    uv run python benchmarks/bench_modes.py --quick    # 64 MiB, one round

Weighted draws with replacement (``shuffle=True``), a permutation and table
order, each read as ``for sample in dataset`` (every payload verified and
copied into its ``bytes``). Every round runs each mode in a fresh process and
rotates which mode goes first, so the figures separate two things: the first
epoch of a process, and the median of the epochs after it in that process
(``--epochs`` per process). The first epoch of a process is slow whatever its
mode on this VM (see benchmarks/README.md: the hypervisor's first touch of
memory freed by earlier processes), so a comparison of modes that runs one of
them first measures that, not the mode.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _flight_common import render

import dataset_rt as drt

MODES: dict[str, drt.ShuffleMode] = {
    "weighted": True,
    "permutation": "permutation",
    "table order": False,
}


class Payloads:
    name = "modes"

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Any:
        block = os.urandom(self.size + 4096)
        for i in range(self.count):
            start = (i * 4093) % 4096  # distinct payloads without urandom per record
            yield drt.CacheInput(data=block[start : start + self.size], metadata={"label": i % 10})


def epochs(path: str, mode: str, count: int, seed: int) -> list[float]:
    """In this process: ``count`` epochs of ``mode``; MiB/s of each."""
    runtime = drt.DatasetRuntime(num_workers=2)
    config = drt.ReaderConfig(seed=seed, shuffle=MODES[mode])
    dataset = runtime.cached_dataset([path], reader_config=config)
    expected = len(dataset)
    rates = []
    for _ in range(count):
        began = time.perf_counter()
        samples = nbytes = 0
        for sample in dataset:
            nbytes += len(sample.data)
            samples += 1
        elapsed = time.perf_counter() - began
        if samples != expected:
            raise SystemExit(f"{mode}: read {samples} samples, expected {expected}")
        rates.append(nbytes / 2**20 / elapsed)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="64 MiB, one round")
    parser.add_argument("--size", type=int, default=64 << 10, help="payload bytes")
    parser.add_argument("--mib", type=int, default=512, help="MiB per epoch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4, help="epochs per process")
    parser.add_argument(
        "--worker", nargs=3, metavar=("PATH", "MODE", "SEED"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.worker:
        path, mode, seed = args.worker
        print(json.dumps(epochs(path, mode, args.epochs, int(seed))))
        return
    mib, rounds = (64, 1) if args.quick else (args.mib, args.rounds)
    count = max(1, (mib << 20) // args.size)

    first: dict[str, list[float]] = {mode: [] for mode in MODES}
    warm: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="bench-modes-") as tmp:
        runtime = drt.DatasetRuntime(num_workers=2)
        config = drt.WriterConfig(show_progress=False)
        [written] = runtime.write_cache(Payloads(count, args.size), tmp, writer_config=config)
        assert isinstance(written, drt.CacheWriteSuccess), written
        names = list(MODES)
        for r in range(rounds):
            for mode in names[r % 3 :] + names[: r % 3]:
                command = [sys.executable, __file__, "--epochs", str(args.epochs)]
                command += ["--worker", str(written.path), mode, str(r)]
                out = subprocess.run(command, check=True, capture_output=True, text=True)
                rates = json.loads(out.stdout)
                first[mode].append(rates[0])
                warm[mode].extend(rates[1:])

    weighted = statistics.median(warm["weighted"])
    lines = [
        [
            mode,
            f"{statistics.median(first[mode]):.0f}",
            f"{statistics.median(warm[mode]):.0f}",
            f"{min(warm[mode]):.0f}-{max(warm[mode]):.0f}",
            f"{statistics.median(warm[mode]) / weighted:.2f}x",
        ]
        for mode in MODES
    ]
    print(
        f"{count} x {args.size // 1024} KiB records ({count * args.size >> 20} MiB), "
        f"{rounds} round(s) of one process per mode, {args.epochs} epochs each"
    )
    print(
        render(
            ["mode", "first epoch MiB/s", "later epochs MiB/s (median)", "range", "vs weighted"],
            lines,
        )
    )


if __name__ == "__main__":
    main()
