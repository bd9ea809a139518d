"""A manifest of 10^8 rows is written, and reported on, in bounded memory.

The rows alone would take 4.8 GB as uint64 columns; the child process that
writes and reports them must stay far below that (its peak RSS is printed)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dataset_rt.loader import LocalSource

from .conftest import DATASET, SEED, balanced

ROWS = 100_000_000
#: Bytes the manifest's six uint64 columns would take in memory.
ROW_BYTES = ROWS * 6 * 8
PEAK_LIMIT = 512 << 20

CHILD = textwrap.dedent(
    """
    import json, sys, time
    from dataset_rt.audit import RunDescription, write_manifest
    from dataset_rt.loader import LocalSource
    from dataset_rt.mixture import mixture_report

    def peak_rss():
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so it would
        # include the forking pytest process's own size.
        with open("/proc/self/status") as status:
            line = next(l for l in status if l.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024

    cache, state_dir, population, path, rows, DATASET, SEED = sys.argv[1:]
    SEED = int(SEED)
    source = LocalSource([cache], state_dir, name=DATASET)
    run = RunDescription.new(
        source, DATASET, seed=SEED, batch_size=250, world_size=8, epoch_len=int(rows),
        population=population,
    )
    began = time.perf_counter()
    written = write_manifest(source, run, path)
    middle = time.perf_counter()
    report = mixture_report(source, run, "label", manifest=path)
    ended = time.perf_counter()
    print(json.dumps({
        "rows": written,
        "draws": report.draws,
        "max_abs_sigma": report.max_abs_sigma,
        "write_s": middle - began,
        "report_s": ended - middle,
        "peak_rss": peak_rss(),
    }))
    """
)


@pytest.mark.timeout(600)
def test_a_manifest_of_10_8_rows_in_bounded_memory(
    source: LocalSource, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    population = source.put(balanced(source.metadata()), activate=False)
    path = tmp_path / "manifest.parquet"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            source.caches[0],
            source.state_dir,
            population,
            str(path),
            str(ROWS),
            DATASET,
            str(SEED),
        ],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    peak = figures["peak_rss"]
    with capsys.disabled():  # the figures belong in the test output
        print(
            f"\n10^8-row manifest: written in {figures['write_s']:.1f} s "
            f"({figures['rows'] / figures['write_s'] / 1e6:.1f} M rows/s), reported in "
            f"{figures['report_s']:.1f} s; peak RSS {peak / 2**20:.0f} MiB "
            f"(the rows in memory: {ROW_BYTES / 2**30:.1f} GiB); file "
            f"{path.stat().st_size / 2**20:.0f} MiB"
        )
    assert figures["rows"] == figures["draws"] == ROWS  # 10^8 = 8 ranks x 50,000 steps x 250
    assert figures["max_abs_sigma"] < 6
    assert peak < PEAK_LIMIT
