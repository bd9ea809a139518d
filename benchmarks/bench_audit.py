"""The audit's costs: ids-only streams against payload streams, the manifest and
mixture report rates, and the report step's time and memory against the
implementation before it streamed.

    uv run python benchmarks/bench_audit.py                    # full sizes
    uv run python benchmarks/bench_audit.py --quick            # a smoke run
    uv run python benchmarks/bench_audit.py --section report   # the report step only

``--section streams``: one cache of 1 KiB records. Side by side, in alternating
order, best of ``--repeat`` runs, samples per second of one epoch of
``--epoch-len`` positions:

- in process (``CachedDataset.stream``, Arrow batches): ``payload=True`` against
  ``payload=False``;
- over Flight (one ``flight_server`` process, one ``do_get`` of the epoch):
  the same pair.

Then the manifest (`write_manifest` to Parquet, ids-only streams in process)
and the mixture report over it, in rows per second, for ``--manifest-rows`` rows.

``--section report``: for each ``SAMPLES:DRAWS`` of ``--report-cases``, a cache
of SAMPLES 8-byte records in 13 labels (balanced by weight), a manifest of
about DRAWS draws (8 ranks x 256 per step), and the report step
(`mixture_report` over the manifest, grouped by label) in a fresh process each:
its seconds and the process's peak RSS (VmHWM: Python, the libraries, the
source's mapped files, the populations and the report), now against
``dataset_rt/mixture.py`` of ``--baseline`` (the Polars aggregation that held
every distinct draw), both reports compared value for value. A baseline process
above ``--baseline-limit-mib`` or ``--baseline-timeout`` seconds is stopped
and shown as such.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.flight as flight
from _flight_common import (
    PROJECT_ROOT,
    SEED,
    ServerProcess,
    human_bytes,
    human_count,
    render,
    write_cache,
)

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


def bench_streams(args: argparse.Namespace) -> None:
    """Payload against ids-only streams, then the manifest and report rates."""
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


# -- the report step, streamed against the baseline ---------------------------------

#: The report's cases by default: (population samples, draws).
REPORT_CASES = "3e3:1e8,1e6:1e6,1e6:1e7,1e6:1e8,1e7:9e6"
QUICK_CASES = "1e5:1e5,1e5:1e6"
BASELINE = "070b98cebcd815d9df1e97de1c72933698237a5f"  # mixture.py before it streamed
LABELS = 13


def _cases(text: str) -> list[tuple[int, int]]:
    pairs = [item.split(":") for item in text.split(",") if item]
    return [(int(float(samples)), int(float(draws))) for samples, draws in pairs]


def setup_child(root: str, samples: str, draws: str) -> None:
    """(In its own process.) A cache of ``samples`` records, a population
    balanced by label, and one manifest per draw count; prints what it made."""
    count = int(samples)
    base = Path(root)
    ids = np.arange(count, dtype=np.int64)
    table = pa.table(
        {
            "payload": pa.FixedSizeBinaryArray.from_buffers(
                pa.binary(8), count, [None, pa.py_buffer(ids.tobytes())]
            ),
            "label": pa.array(ids * 7919 % 100 % LABELS),
        }
    )
    runtime = drt.DatasetRuntime(num_workers=2)
    written = runtime.write_arrow(
        table,
        base / "caches",
        name="r",
        payload_column="payload",
        writer_config=drt.WriterConfig(show_progress=False),
    )
    if not isinstance(written, drt.CacheWriteSuccess):
        raise SystemExit(f"write_arrow failed: {written!r}")
    del table
    source = LocalSource([written.path], base / "state", name="r")
    population = source.put(
        source.metadata().with_columns((1.0 / pl.len().over("label")).alias("weight")),
        activate=False,
    )
    manifests = {}
    for d in (int(x) for x in draws.split(",")):
        run = RunDescription.new(
            source, "r", seed=SEED, batch_size=256, world_size=8, epoch_len=d,
            population=population,
        )  # fmt: skip
        path = base / f"manifest-{d}.parquet"
        started = time.perf_counter()
        rows = write_manifest(source, run, path)
        manifests[d] = {"path": str(path), "rows": rows, "s": time.perf_counter() - started}
    print(
        json.dumps({"cache": str(written.path), "population": population, "manifests": manifests})
    )


def _vm(key: str, pid: str = "self") -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith(key + ":"))
    return int(line.split()[1]) * 1024


def report_child(module: str, root: str, population: str, cache: str, draws: str) -> None:
    """(In its own process.) The report step with ``module`` (a path to a
    mixture.py, or ``current``): prints its seconds and this process's peak RSS;
    writes its table beside the manifest."""
    mixture: ModuleType
    if module == "current":
        import dataset_rt.mixture as mixture
    else:
        spec = importlib.util.spec_from_file_location("mixture_baseline", module)
        if spec is None or spec.loader is None:
            raise SystemExit(f"cannot load {module}")
        mixture = importlib.util.module_from_spec(spec)
        sys.modules["mixture_baseline"] = mixture  # dataclasses look their module up
        spec.loader.exec_module(mixture)
    base = Path(root)
    source = LocalSource([cache], base / "state", name="r")
    run = RunDescription.new(
        source, "r", seed=SEED, batch_size=256, world_size=8, epoch_len=int(draws),
        population=population,
    )  # fmt: skip
    before = _vm("VmHWM")
    started = time.perf_counter()
    report = mixture.mixture_report(
        source, run, "label", manifest=base / f"manifest-{draws}.parquet"
    )
    seconds = time.perf_counter() - started
    name = "current" if module == "current" else "baseline"
    report.groups.write_parquet(base / f"groups-{draws}-{name}.parquet")
    print(json.dumps({"s": seconds, "peak": _vm("VmHWM"), "before": before, "draws": report.draws}))


def _run_child(command: list[str], limit: int, timeout: float) -> dict[str, float] | str:
    """Run a child, stopping it above ``limit`` bytes of RSS or ``timeout``
    seconds; its JSON line, or why it was stopped."""
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=PROJECT_ROOT)
    started = time.perf_counter()
    stopped = ""
    while child.poll() is None:
        with contextlib.suppress(OSError, StopIteration):
            if _vm("VmRSS", str(child.pid)) > limit:
                stopped = f"stopped above {human_bytes(limit)}"
        if time.perf_counter() - started > timeout:
            stopped = f"stopped after {timeout:.0f} s"
        if stopped:
            child.kill()
            child.wait()
            return stopped
        time.sleep(0.05)
    out = child.stdout.read() if child.stdout else ""
    if child.returncode:
        raise SystemExit(f"{command[2:4]} failed ({child.returncode})")
    return dict(json.loads(out.strip().splitlines()[-1]))


def bench_report(args: argparse.Namespace) -> None:
    """The report step's seconds and peak RSS, streamed against the baseline."""
    cases = _cases(args.report_cases or (QUICK_CASES if args.quick else REPORT_CASES))
    me = [sys.executable, str(Path(__file__).resolve())]
    lines = []
    with tempfile.TemporaryDirectory(prefix="bench-audit-report-") as tmp:
        baseline: str | None = str(Path(tmp) / "mixture_baseline.py")
        shown = subprocess.run(
            ["git", "show", f"{args.baseline}:dataset_rt/mixture.py"],
            cwd=PROJECT_ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if shown.returncode:
            print(f"no baseline ({args.baseline}: {shown.stderr.strip()}): streamed only")
            baseline = None
        else:
            Path(baseline).write_text(shown.stdout)
        for samples in sorted({s for s, _ in cases}):
            root = Path(tmp) / f"s{samples}"
            counts = [d for s, d in cases if s == samples]
            made = json.loads(
                subprocess.run(
                    [*me, "_setup", str(root), str(samples), ",".join(map(str, counts))],
                    cwd=PROJECT_ROOT, capture_output=True, text=True, check=True,
                ).stdout.strip().splitlines()[-1]
            )  # fmt: skip
            for d in counts:
                manifest = made["manifests"][str(d)]
                print(
                    f"{human_count(samples)} samples: manifest of {human_count(manifest['rows'])}"
                    f" draws written in {manifest['s']:.1f} s",
                    flush=True,
                )
                child = [str(root), made["population"], made["cache"], str(d)]
                now = _run_child([*me, "_report", "current", *child], 1 << 40, 3600)
                before = (
                    _run_child(
                        [*me, "_report", baseline, *child],
                        args.baseline_limit_mib << 20,
                        args.baseline_timeout,
                    )
                    if baseline
                    else "not run"
                )
                assert isinstance(now, dict)
                if isinstance(before, dict):
                    same = pl.read_parquet(root / f"groups-{d}-baseline.parquet").equals(
                        pl.read_parquet(root / f"groups-{d}-current.parquet")
                    )
                    if not same:
                        raise SystemExit(f"the reports differ at {d} draws")
                lines.append(_report_line(samples, manifest["rows"], before, now))
                Path(manifest["path"]).unlink()
            shutil.rmtree(root, ignore_errors=True)
    print()
    print(
        f"Report step (mixture_report over a manifest, by label, {LABELS} labels): "
        f"baseline {args.baseline[:9]} against streamed; peak RSS is the whole process's"
    )
    print(
        render(
            ["samples", "draws", "baseline s", "baseline peak", "streamed s",
             "streamed peak", "time /", "peak /", "RSS before report"],
            lines,
        )
    )  # fmt: skip


def _report_line(
    samples: int, draws: int, before: dict[str, float] | str, now: dict[str, float]
) -> list[str]:
    line = [human_count(samples), human_count(draws)]
    if isinstance(before, dict):
        line += [f"{before['s']:.2f}", human_bytes(before["peak"])]
    else:
        line += [before, ""]
    line += [f"{now['s']:.2f}", human_bytes(now["peak"])]
    if isinstance(before, dict):
        line += [f"{before['s'] / now['s']:.1f}x", f"{before['peak'] / now['peak']:.1f}x"]
    else:
        line += ["", ""]
    return [*line, human_bytes(now["before"])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10x smaller, one run each")
    parser.add_argument("--section", choices=["all", "streams", "report"], default="all")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--epoch-len", type=int, default=1_000_000)
    parser.add_argument("--manifest-rows", type=int, default=20_000_000)
    parser.add_argument(
        "--report-cases",
        metavar="SAMPLES:DRAWS,...",
        help=f"the report step's cases (default {REPORT_CASES}; --quick {QUICK_CASES})",
    )
    parser.add_argument("--baseline", default=BASELINE, help="the commit to compare with")
    parser.add_argument("--baseline-limit-mib", type=int, default=3800)
    parser.add_argument("--baseline-timeout", type=float, default=300.0)
    args = parser.parse_args()
    if args.section in ("all", "streams"):
        bench_streams(args)
    if args.section in ("all", "report"):
        bench_report(args)


if __name__ == "__main__":
    if sys.argv[1:2] == ["_setup"]:
        setup_child(*sys.argv[2:])
    elif sys.argv[1:2] == ["_report"]:
        report_child(*sys.argv[2:])
    else:
        main()
