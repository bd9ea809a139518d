"""A new training loader's first batch: seconds from ``iter(loader)`` to it.

    uv run --no-sync python benchmarks/bench_loader_start.py             # 5 runs each
    uv run --no-sync python benchmarks/bench_loader_start.py --runs 9 \\
        --pythonpath ../old-checkout                                     # old and new, alternated

Each run is a fresh Python process (a trainer's start: nothing imported,
no forkserver running) that imports ``dataset_rt.torch``, builds a
``DatasetLoader`` over a ``LocalSource`` and times ``next(iter(loader))``.
Three settings:

- **0 workers**: the batch is read in the trainer;
- **2 workers**: ``iter()`` right after the loader is built;
- **2 workers, trainer works first**: ``--work`` seconds (3) of simulated trainer
  work between building the loader and ``iter()``, a busy loop on one core by
  default (``--work-kind sleep`` for an idle trainer): what a training script
  does there (build the model, load a checkpoint) while the workers' forkserver
  imports torch.

The cache (``--records`` records of 1 KiB with an integer, a float and a boolean
column, all three read) is written once by this process. With ``--pythonpath
DIR`` each setting also runs with ``DIR`` (another checkout, with its built
``dataset_rt/_native.abi3.so``) first on ``PYTHONPATH``, alternating with this
checkout run by run, the first of each pair alternating too; ``--python`` names
that build's interpreter (default: this one). Each child reports which
``dataset_rt`` it imported, and the run stops if it is not the one asked for.
Prints a markdown table: the median of ``--runs`` runs, their range, and the
ratio to the baseline when there is one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DATASET = "start"
BATCH = 256
RECORD_BYTES = 1024
TIMEOUT = 300.0

#: (name, workers, simulated trainer work before ``iter()``)
SETTINGS = [
    ("0 workers", 0, False),
    ("2 workers", 2, False),
    ("2 workers, trainer works first", 2, True),
]

#: One run, in a fresh interpreter. Run with ``-c`` from a scratch directory, so
#: that ``PYTHONPATH`` alone decides which ``dataset_rt`` it imports, and the
#: workers import no script.
CHILD = textwrap.dedent(
    """
    import json, sys, time
    started = time.perf_counter()
    cache, state, dataset, batch_size, workers, work, kind = sys.argv[1:8]
    batch_size, workers, work = int(batch_size), int(workers), float(work)
    import dataset_rt
    from dataset_rt.loader import LocalSource
    from dataset_rt.torch import DatasetLoader

    imported = time.perf_counter()
    source = LocalSource([cache], state, name=dataset)
    loader = DatasetLoader(
        source, dataset, batch_size=batch_size, seed=1, columns=["label", "score", "flag"],
        num_workers=workers,
    )
    built = time.perf_counter()
    if kind == "busy":
        while time.perf_counter() - built < work:
            pass
    else:
        time.sleep(work)
    asked = time.perf_counter()
    batch = next(iter(loader))
    first = time.perf_counter()
    assert len(batch["position"]) == batch_size and len(batch["flag"]) == batch_size
    print(json.dumps({
        "module": dataset_rt.__file__,
        "pandas": "pandas" in sys.modules,
        "import": imported - started,
        "build": built - imported,
        "first": first - asked,
    }))
    """
)


class Build:
    """A ``dataset_rt`` to run: an interpreter and what goes first on ``PYTHONPATH``."""

    def __init__(self, name: str, python: str, path: Path) -> None:
        self.name, self.python, self.path = name, python, path.resolve()

    def run(
        self, scratch: Path, cache: Path, workers: int, work: float, kind: str
    ) -> dict[str, float]:
        """One fresh process's seconds: ``import`` of ``dataset_rt.torch``,
        ``build`` of the loader, ``first``: ``iter()`` to the first batch."""
        state = Path(tempfile.mkdtemp(prefix="state-", dir=scratch))
        inherited = os.environ.get("PYTHONPATH", "")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(self.path), inherited])),
        }
        arguments = [cache, state, DATASET, BATCH, workers, work, kind]
        done = subprocess.run(
            [self.python, "-c", CHILD, *map(str, arguments)],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{self.name}: the run failed:\n{done.stderr[-3000:]}")
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        if not Path(answer["module"]).resolve().is_relative_to(self.path):
            raise RuntimeError(
                f"{self.name}: imported {answer['module']}, not the dataset_rt under {self.path}"
            )
        return {key: float(answer[key]) for key in ("import", "build", "first")}


def write_cache(root: Path, records: int) -> Path:
    """``records`` records of 1 KiB, with an integer, a float and a boolean column."""
    import dataset_rt as drt

    class Records:
        name = DATASET

        def __iter__(self):  # type: ignore[no-untyped-def]
            for i in range(records):
                yield drt.CacheInput(
                    data=i.to_bytes(8, "little") * (RECORD_BYTES // 8),
                    metadata={"label": i % 10, "score": i / 7, "flag": i % 3 == 0},
                )

    runtime = drt.DatasetRuntime(num_workers=2)
    config = drt.WriterConfig(show_progress=False)
    [result] = runtime.write_cache(Records(), root, writer_config=config)
    if not isinstance(result, drt.CacheWriteSuccess):
        raise RuntimeError(f"write_cache failed: {result!r}")
    return Path(result.path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per setting and build (5)")
    parser.add_argument("--work", type=float, default=3.0, help="seconds of trainer work (3)")
    parser.add_argument(
        "--work-kind",
        choices=["busy", "sleep"],
        default="busy",
        help="the trainer's work: a busy loop on one core (default) or time.sleep",
    )
    parser.add_argument("--records", type=int, default=20_000, help="records in the cache")
    parser.add_argument(
        "--pythonpath",
        type=Path,
        metavar="DIR",
        help="a baseline checkout, run first on PYTHONPATH, alternating with this one",
    )
    parser.add_argument(
        "--python", default=sys.executable, help="the baseline's interpreter (this one)"
    )
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")

    builds = [Build("this checkout", sys.executable, PROJECT_ROOT)]
    if args.pythonpath is not None:
        if not (args.pythonpath / "dataset_rt" / "__init__.py").exists():
            parser.error(f"{args.pythonpath} holds no dataset_rt package")
        builds.insert(0, Build(f"baseline ({args.pythonpath})", args.python, args.pythonpath))

    load_start = os.getloadavg()
    began = time.perf_counter()
    seconds: dict[tuple[str, str], list[float]] = {}
    imports: dict[str, list[float]] = {build.name: [] for build in builds}
    with tempfile.TemporaryDirectory(prefix="bench-loader-start-") as scratch_name:
        scratch = Path(scratch_name)
        cache = write_cache(scratch / "caches", args.records)
        for round_ in range(args.runs):
            for setting, workers, works in SETTINGS:
                order = builds if round_ % 2 == 0 else builds[::-1]
                for build in order:
                    work = args.work if works else 0.0
                    took = build.run(scratch, cache, workers, work, args.work_kind)
                    seconds.setdefault((setting, build.name), []).append(took["first"])
                    imports[build.name].append(took["import"])
                    print(
                        f"round {round_ + 1}/{args.runs}, {setting}, {build.name}: "
                        f"{took['first'] * 1000:.0f} ms (import {took['import']:.2f} s, "
                        f"build {took['build'] * 1000:.0f} ms)",
                        file=sys.stderr,
                    )
    load_end = os.getloadavg()

    baseline = builds[0] if len(builds) > 1 else None
    print(
        f"\n`iter(loader)` -> first batch, median of {args.runs} fresh processes (range); "
        f"{args.records:,} records of {RECORD_BYTES} B, batches of {BATCH}, 3 columns read; "
        f"trainer work: {args.work:g} s of {'a busy loop' if args.work_kind == 'busy' else 'sleep'}"
    )
    print(
        f"load average {load_start[0]:.2f} at start, {load_end[0]:.2f} at end, "
        f"{os.cpu_count()} CPUs; {time.perf_counter() - began:.0f} s in all; "
        "`import dataset_rt.torch` in the trainer (what a forkserver imports too), median: "
        + ", ".join(f"{name} {statistics.median(v):.2f} s" for name, v in imports.items())
        + "\n"
    )
    header = ["setting", *(build.name for build in builds)]
    if baseline is not None:
        header.append("new / baseline")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for setting, _, _ in SETTINGS:
        cells = [setting]
        medians = []
        for build in builds:
            values = seconds[(setting, build.name)]
            medians.append(statistics.median(values))
            cells.append(
                f"{medians[-1] * 1000:.0f} ms ({min(values) * 1000:.0f}-{max(values) * 1000:.0f})"
            )
        if baseline is not None:
            cells.append(f"{medians[-1] / medians[0]:.2g}x")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
