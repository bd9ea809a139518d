"""Draws per second of the stream modes, and the cost of a far position.

    uv run python benchmarks/bench_draws.py           # full sizes
    uv run python benchmarks/bench_draws.py --quick   # a smoke run

One cache of ``--rows`` records (8 bytes each: no payload is read). For each mode
(weighted draws with replacement, permutation, table order), side by side in
alternating order, best of ``--repeat``: ``CachedDataset.draw_rows`` of
``--count`` positions starting at 0 and at 10^12 (the runtime's 2 worker
threads), and the median latency of drawing one position there.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _flight_common import human_count, render

import dataset_rt as drt

MODES: dict[str, drt.ShuffleMode] = {
    "weighted": True,
    "permutation": "permutation",
    "table order": False,
}
FAR = 10**12


class Records:
    name = "draws"

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Any:
        for i in range(self.count):
            yield drt.CacheInput(data=i.to_bytes(8, "little"), metadata={"label": i % 10})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10x smaller, one run each")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--count", type=int, default=10_000_000)
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    repeat = 1 if args.quick else args.repeat
    rows, count = args.rows // scale, args.count // scale

    with tempfile.TemporaryDirectory(prefix="bench-draws-") as tmp:
        runtime = drt.DatasetRuntime(num_workers=2)
        started = time.perf_counter()
        config = drt.WriterConfig(show_progress=False)
        [written] = runtime.write_cache(Records(rows), tmp, writer_config=config)
        assert isinstance(written, drt.CacheWriteSuccess), written
        print(f"wrote {human_count(rows)} records in {time.perf_counter() - started:.1f} s")
        datasets = {
            mode: runtime.cached_dataset(
                [written.path], reader_config=drt.ReaderConfig(seed=1, shuffle=shuffle)
            )
            for mode, shuffle in MODES.items()
        }
        rates: dict[tuple[str, int], float] = {}
        for _ in range(repeat):
            for mode, dataset in datasets.items():
                for start in (0, FAR):
                    began = time.perf_counter()
                    drawn = len(dataset.draw_rows(start=start, count=count))
                    rate = drawn / (time.perf_counter() - began)
                    rates[mode, start] = max(rates.get((mode, start), 0.0), rate)
        latency: dict[tuple[str, int], float] = {}
        for mode, dataset in datasets.items():
            for start in (0, FAR):
                times = []
                for i in range(1000):
                    began = time.perf_counter()
                    dataset.draw_rows(start=start + i * 7919, count=1)
                    times.append(time.perf_counter() - began)
                latency[mode, start] = statistics.median(times)

    weighted = rates["weighted", 0]
    lines = [
        [
            mode,
            f"{human_count(rates[mode, 0])}/s",
            f"{rates[mode, 0] / weighted:.2f}x",
            f"{human_count(rates[mode, FAR])}/s",
            f"{latency[mode, 0] * 1e6:.1f} us",
            f"{latency[mode, FAR] * 1e6:.1f} us",
        ]
        for mode in MODES
    ]
    print()
    print(f"{human_count(count)} positions over {human_count(rows)} rows (best of {repeat})")
    print(
        render(
            ["mode", "draws at 0", "vs weighted", "draws at 10^12", "one at 0", "one at 10^12"],
            lines,
        )
    )


if __name__ == "__main__":
    main()
