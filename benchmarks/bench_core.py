"""Compare this project's dataset_rt with the PyPI baseline ``dataset-rt==0.4.8``.

Run from the project root::

    uv run python benchmarks/bench_core.py            # full sizes (~5-15 minutes)
    uv run python benchmarks/bench_core.py --quick    # 10x smaller, smoke test
    uv run python benchmarks/bench_core.py --json results.json

Both libraries import as ``dataset_rt``, so each runs the same workloads
(`_workloads.py`) in its own interpreter: ours under ``sys.executable``, the baseline
in a virtualenv that this script creates on first use under
``benchmarks/.venv-baseline/``. The table's ratio is ours / baseline throughput, so
a ratio above 1 means ours is faster.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _workloads import LIBS, Sizes

BENCH_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = BENCH_DIR.parent
WORKER = BENCH_DIR / "_workloads.py"
BASELINE_VENV = BENCH_DIR / ".venv-baseline"
BASELINE_DIST = "dataset-rt"
BASELINE_VERSION = "0.4.8"
BASELINE_PACKAGES = (f"{BASELINE_DIST}=={BASELINE_VERSION}", "polars", "pyarrow", "numpy")
BASELINE_PYTHON_VERSION = "3.11"
ISOLATION_ENV_VARS = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX")


@dataclass(frozen=True)
class Row:
    """One line of the results table."""

    key: str
    label: str
    unit: str
    target: float | None = None
    timed: bool = False


@dataclass(frozen=True)
class Cell:
    """One library's figure for one row, or why it is missing."""

    seconds: float | None
    items: int = 0
    nbytes: int = 0
    note: str = ""

    @property
    def rate(self) -> float | None:
        """Items per second, when measured."""
        if self.seconds is None or self.seconds <= 0:
            return None
        return self.items / self.seconds


def human_bytes(size: int) -> str:
    """``1024`` -> ``1 KiB``."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def human_count(value: float) -> str:
    """``200000`` -> ``200k``; ``1.5e6`` -> ``1.5M``."""
    for suffix, scale in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def table_rows(sizes: Sizes) -> list[Row]:
    """The table layout, labelled with this run's sizes."""
    small = f"{human_count(sizes.small_count)} x {human_bytes(sizes.small_size)}"
    large = f"{human_count(sizes.large_count)} x {human_bytes(sizes.large_size)}"
    tiny = f"{human_count(sizes.tiny_count)} rows"
    rows = [
        Row("write.1k", f"write {small}", "samples", 1.5),
        Row("write.1m", f"write {large}", "samples", 1.5),
    ]
    for mode, label, target_1k, target_1m in (
        ("iter", "per-sample epoch", 2.0, 2.0),
        ("batch", "batch epoch", 10.0, None),
    ):
        for tag, what, target in (("1k", small, target_1k), ("1m", large, target_1m)):
            for order in ("shuffle", "ordered"):
                key, text = f"{mode}.{tag}.{order}", f"{label} {what} {order}"
                rows.append(Row(key, text, "samples", target))
    rows += [
        Row("write.tiny", f"write {tiny} x {human_bytes(sizes.tiny_size)} (setup)", "samples"),
        Row("meta.get", f"get_metadata {tiny}", "rows", timed=True),
        Row("meta.reweight", f"polars reweight {tiny}", "rows", timed=True),
        Row("meta.update", f"update_metadata {tiny}", "rows", 1.0, timed=True),
        Row("meta.total", f"get + reweight + update {tiny}", "rows", timed=True),
        Row("draws", f"weighted draws {human_count(sizes.draws)} over {tiny}", "draws", 30.0),
    ]
    return rows


def cell(report: dict[str, Any] | None, key: str) -> Cell:
    """Extract one measurement from a worker report."""
    if report is None:
        return Cell(None, note="not run")
    found = report["results"].get(key)
    if found is None:
        return Cell(None, note="failed")
    return Cell(found["seconds"], found["items"], found["nbytes"], found["note"])


def format_cell(row: Row, value: Cell) -> str:
    """Throughput (or time, for timed rows) of one library on one row."""
    if value.seconds is None or value.rate is None:
        return value.note
    if row.timed:
        return f"{value.seconds * 1e3:,.1f} ms"
    text = f"{human_count(value.rate)} {row.unit}/s"
    if value.nbytes:
        text += f", {value.nbytes / value.seconds / (1 << 20):,.0f} MiB/s"
    return text


def ratio(ours: Cell, baseline: Cell) -> float | None:
    """Ours / baseline throughput (= baseline time / ours time for equal work)."""
    if ours.rate is None or baseline.rate is None:
        return None
    return ours.rate / baseline.rate


def verdict(row: Row, value: float | None) -> str:
    """Whether the ratio meets the row's target."""
    if row.target is None or value is None:
        return ""
    return "ok" if value >= row.target else "BELOW"


def build_table(
    rows: Sequence[Row], reports: dict[str, dict[str, Any] | None]
) -> list[dict[str, Any]]:
    """One dict per row with both figures, the ratio and the verdict."""
    table = []
    for row in rows:
        ours, baseline = cell(reports.get("ours"), row.key), cell(reports.get("baseline"), row.key)
        value = ratio(ours, baseline)
        table.append(
            {
                "key": row.key,
                "workload": row.label,
                "ours": format_cell(row, ours),
                "baseline": format_cell(row, baseline),
                "ours_seconds": ours.seconds,
                "baseline_seconds": baseline.seconds,
                "ratio": value,
                "target": row.target,
                "verdict": verdict(row, value),
            }
        )
    return table


def render_table(table: Sequence[dict[str, Any]]) -> str:
    """Fixed-width text rendering of `build_table`'s output."""
    header = ["workload", "ours", "baseline", "ratio", "target", ""]
    lines = [
        [
            entry["workload"],
            entry["ours"],
            entry["baseline"],
            "" if entry["ratio"] is None else f"{entry['ratio']:.2f}x",
            "" if entry["target"] is None else f">= {entry['target']:g}x",
            entry["verdict"],
        ]
        for entry in table
    ]
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]

    def fmt(line: Sequence[str]) -> str:
        first = line[0].ljust(widths[0])
        rest = [text.rjust(width) for text, width in zip(line[1:-1], widths[1:-1], strict=True)]
        return " | ".join([first, *rest, line[-1]]).rstrip()

    rule = "-+-".join("-" * width for width in widths[:-1]) + "-+-" + "-" * 5
    return "\n".join([fmt(header), rule, *(fmt(line) for line in lines)])


def notes(reports: dict[str, dict[str, Any] | None]) -> list[str]:
    """Library identities, how each workload was measured, and any failures."""
    out = [
        "ratio = ours / baseline throughput (timed rows: baseline time / ours time); "
        "> 1 means ours is faster. Best of N runs; reads hit the OS page cache.",
    ]
    for lib in LIBS:
        report = reports.get(lib)
        if report is None:
            out.append(f"{lib}: not run")
            continue
        out.append(
            f"{lib}: {report['version']} on Python {report['python']} ({report['module_file']})"
        )
        seen: set[tuple[str, str]] = set()
        for key, found in report["results"].items():
            family = key.split(".")[0]
            if found["note"] and (family, found["note"]) not in seen:
                seen.add((family, found["note"]))
                out.append(f"  {family} ({lib}): {found['note']}")
        for group, message in report["errors"].items():
            out.append(f"  ERROR {group} ({lib}): {message}")
    return out


def isolated_env() -> dict[str, str]:
    """The environment without variables that could leak another environment's packages."""
    return {k: v for k, v in os.environ.items() if k not in ISOLATION_ENV_VARS}


def baseline_ready(python: Path) -> bool:
    """Whether ``python`` imports the pinned baseline and its dependencies."""
    probe = (
        "import importlib.metadata as m, dataset_rt, polars, pyarrow, numpy; "
        f"raise SystemExit(m.version({BASELINE_DIST!r}) != {BASELINE_VERSION!r})"
    )
    if not python.exists():
        return False
    completed = subprocess.run(
        [str(python), "-I", "-c", probe], env=isolated_env(), capture_output=True, check=False
    )
    return completed.returncode == 0


def ensure_baseline_venv(venv: Path) -> Path:
    """Create (once) a virtualenv holding the baseline; return its interpreter."""
    python = venv / "bin" / "python"
    if baseline_ready(python):
        return python
    uv = shutil.which("uv")
    if uv is None:
        raise SystemExit("uv is required to create the baseline virtualenv")
    print(f"creating the baseline virtualenv in {venv} ...", file=sys.stderr, flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    env = isolated_env()
    subprocess.run([uv, "venv", str(venv), "-p", BASELINE_PYTHON_VERSION], env=env, check=True)
    install = [uv, "pip", "install", "--python", str(python), *BASELINE_PACKAGES]
    subprocess.run(install, env=env, check=True)
    if not baseline_ready(python):
        raise SystemExit(f"{python} does not import {BASELINE_DIST}=={BASELINE_VERSION}")
    return python


@dataclass(frozen=True)
class WorkerSpec:
    """How to launch the worker for one library."""

    lib: str
    python: str
    flags: tuple[str, ...]
    cwd: Path
    env: dict[str, str]


def worker_specs(args: argparse.Namespace, data_dir: Path) -> list[WorkerSpec]:
    """Ours under this interpreter; the baseline isolated (``-I``) in its own venv."""
    specs = []
    if args.only in (None, "ours"):
        specs.append(WorkerSpec("ours", sys.executable, (), PROJECT_ROOT, dict(os.environ)))
    if args.only in (None, "baseline"):
        python = args.baseline_python or ensure_baseline_venv(BASELINE_VENV)
        specs.append(WorkerSpec("baseline", str(python), ("-I",), data_dir, isolated_env()))
    return specs


def failed_report(spec: WorkerSpec, sizes: Sizes, message: str) -> dict[str, Any]:
    """A report standing in for a worker that produced none."""
    return {
        "lib": spec.lib,
        "version": "unknown",
        "module_file": "",
        "python": "",
        "sizes": asdict(sizes),
        "results": {},
        "errors": {"worker": message},
    }


def run_worker(
    spec: WorkerSpec, scale: str, sizes: Sizes, data_dir: Path, timeout: float
) -> dict[str, Any]:
    """Run the worker for one library and load its JSON report."""
    out = data_dir / f"{spec.lib}.json"
    command = [spec.python, *spec.flags, str(WORKER), "--lib", spec.lib, "--scale", scale]
    command += ["--data-dir", str(data_dir), "--out", str(out)]
    print(f"== {spec.lib}: {' '.join(command)}", file=sys.stderr, flush=True)
    try:
        completed = subprocess.run(
            command, cwd=spec.cwd, env=spec.env, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return failed_report(spec, sizes, f"worker timed out after {timeout:.0f} s")
    if not out.exists():
        return failed_report(spec, sizes, f"worker exited with code {completed.returncode}")
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line interface."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10x smaller sizes (smoke test)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also dump raw results here")
    parser.add_argument("--only", choices=LIBS, help="run a single library")
    parser.add_argument(
        "--baseline-python",
        type=Path,
        metavar="PATH",
        help="use this interpreter for the baseline instead of benchmarks/.venv-baseline",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=BENCH_DIR / ".bench-data",
        help="where temporary caches are written (default: benchmarks/.bench-data)",
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per library")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run both workers, print the comparison table, optionally dump JSON."""
    args = parse_args(argv)
    started = time.perf_counter()
    scale = "quick" if args.quick else "full"
    sizes = Sizes.for_scale(scale)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="run-", dir=args.data_dir))
    reports: dict[str, dict[str, Any] | None] = dict.fromkeys(LIBS)
    try:
        for spec in worker_specs(args, data_dir):
            reports[spec.lib] = run_worker(spec, scale, sizes, data_dir, args.timeout)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            args.data_dir.rmdir()  # only when empty
    table = build_table(table_rows(sizes), reports)
    elapsed = time.perf_counter() - started
    print(f"\ndataset_rt core benchmark ({scale} sizes, {elapsed:.0f} s)\n")
    print(render_table(table))
    print()
    print("\n".join(notes(reports)))
    if args.json:
        dump = {"scale": scale, "sizes": asdict(sizes), "elapsed_seconds": elapsed}
        dump |= {"table": table, "reports": reports}
        args.json.write_text(json.dumps(dump, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
