"""The audit's costs: ids-only streams against payload streams, and the manifest
and mixture report rates.

    uv run python benchmarks/bench_audit.py           # full sizes
    uv run python benchmarks/bench_audit.py --quick   # a smoke run

One cache of 1 KiB records. Side by side, in alternating order, best of
``--repeat`` runs, samples per second of one epoch of ``--epoch-len`` positions:

- in process (``CachedDataset.stream``, Arrow batches): ``payload=True`` against
  ``payload=False``;
- over Flight (one ``flight_server`` process, one ``do_get`` of the epoch):
  the same pair.

Then the manifest (`write_manifest` to Parquet, ids-only streams in process)
and the mixture report over it, in rows per second, for ``--manifest-rows`` rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyarrow.flight as flight
from _flight_common import SEED, ServerProcess, human_count, render, write_cache

import dataset_rt as drt
from dataset_rt.audit import RunDescription, write_manifest
from dataset_rt.loader import LocalSource
from dataset_rt.mixture import mixture_report


def best(repeat: int, runs: dict[str, Callable[[], int]]) -> dict[str, float]:
    """Samples per second of each run, the best of ``repeat``, runs interleaved."""
    rates: dict[str, float] = {label: 0.0 for label in runs}
    for _ in range(repeat):
        for label, run in runs.items():
            started = time.perf_counter()
            samples = run()
            rates[label] = max(rates[label], samples / (time.perf_counter() - started))
    return rates


def in_process(dataset: drt.CachedDataset, epoch_len: int, payload: bool) -> int:
    reader = dataset.stream(count=epoch_len, payload=payload)
    return sum(batch.num_rows for batch in reader)


def over_flight(location: str, name: str, epoch_len: int, payload: bool) -> int:
    ticket = {"dataset": name, "seed": SEED, "epoch": 0, "epoch_len": epoch_len}
    client = flight.connect(location)
    try:
        reader = client.do_get(flight.Ticket(json.dumps(ticket | {"payload": payload}).encode()))
        return sum(chunk.data.num_rows for chunk in reader)
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10x smaller, one run each")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--epoch-len", type=int, default=1_000_000)
    parser.add_argument("--manifest-rows", type=int, default=20_000_000)
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    repeat = 1 if args.quick else args.repeat
    records, epoch_len = args.records // scale, args.epoch_len // scale
    manifest_rows = args.manifest_rows // scale

    with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:
        root = Path(tmp)
        cache, seconds = write_cache("c1KiB", records, 1024, root / "caches")
        print(f"wrote {human_count(records)} records of 1 KiB in {seconds:.1f} s", flush=True)
        runtime = drt.DatasetRuntime(num_workers=2)
        dataset = runtime.cached_dataset([cache], reader_config=drt.ReaderConfig(seed=SEED))
        dataset.set_epoch_len(epoch_len)
        command = [sys.executable, "-m", "flight_server", "--port", "0"]
        command += ["--dataset", f"d={cache}", "--state-dir", str(root / "state")]
        command += ["--data-dir", str(root / "data")]
        server = ServerProcess.start("ours", command, root)
        try:
            location = server.wait_location()
            rates = best(
                repeat,
                {
                    "in process, payload": lambda: in_process(dataset, epoch_len, True),
                    "in process, ids only": lambda: in_process(dataset, epoch_len, False),
                    "Flight, payload": lambda: over_flight(location, "d", epoch_len, True),
                    "Flight, ids only": lambda: over_flight(location, "d", epoch_len, False),
                },
            )
        finally:
            server.stop()

        rows = []
        for face in ("in process", "Flight"):
            with_payload = rates[f"{face}, payload"]
            ids_only = rates[f"{face}, ids only"]
            rows.append(
                [
                    face,
                    f"{human_count(with_payload)}/s",
                    f"{human_count(ids_only)}/s",
                    f"{ids_only / with_payload:.1f}x",
                ]
            )
        print()
        print(f"Epoch of {human_count(epoch_len)} draws over 1 KiB records (best of {repeat})")
        print(render(["face", "payload stream", "ids-only stream", "ids-only / payload"], rows))

        source = LocalSource([cache], root / "state-local", name="d")
        run = RunDescription.new(
            source, "d", seed=SEED, batch_size=256, world_size=8, epoch_len=manifest_rows
        )
        path = root / "manifest.parquet"
        started = time.perf_counter()
        written = write_manifest(source, run, path)
        write_s = time.perf_counter() - started
        started = time.perf_counter()
        report = mixture_report(source, run, "label", manifest=path)
        report_s = time.perf_counter() - started
        print()
        print(
            render(
                ["step", "rows", "seconds", "rows/s"],
                [
                    [
                        "manifest to Parquet",
                        human_count(written),
                        f"{write_s:.1f}",
                        f"{human_count(written / write_s)}/s",
                    ],
                    [
                        "mixture report",
                        human_count(report.draws),
                        f"{report_s:.1f}",
                        f"{human_count(report.draws / report_s)}/s",
                    ],
                ],
            )
        )
        size = path.stat().st_size / 2**20
        print(f"manifest file: {size:.0f} MiB for {human_count(written)} rows")


if __name__ == "__main__":
    main()
