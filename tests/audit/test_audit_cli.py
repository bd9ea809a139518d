"""``python -m dataset_rt audit``: from a saved loader state or from keys, the
manifest, the report files, the plot, the --max-sigma gate and clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from terminal import on_a_terminal

from dataset_rt.audit import MANIFEST_COLUMNS, RunDescription
from dataset_rt.audit_cli import EXIT_BAD_INPUT, EXIT_DEVIATION
from dataset_rt.cli import main
from dataset_rt.loader import LocalSource

from .conftest import DATASET, SEED, balanced


def saved_state(source: LocalSource, population: str, path: Path, **keys: int) -> Path:
    run = RunDescription.new(
        source,
        DATASET,
        seed=SEED,
        batch_size=keys.get("batch_size", 32),
        world_size=keys.get("world_size", 2),
        epoch_len=keys.get("epoch_len", 30_000),
        population=population,
    )
    path.write_text(json.dumps(run.state.to_dict()))
    return path


def where(source: LocalSource) -> list[str]:
    return ["--cache", source.caches[0], "--state-dir", source.state_dir]


def test_help_explains_every_argument() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dataset_rt", "audit", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    for flag in (
        "--cache",
        "--state-dir",
        "--server",
        "--dataset",
        "--seed",
        "--batch-size",
        "--world-size",
        "--epochs",
        "--manifest",
        "--read-manifest",
        "--group",
        "--steps",
        "--report",
        "--plot",
        "--max-sigma",
        "--no-progress",
    ):
        assert flag in done.stdout
    assert "exit 3" in done.stdout.lower() or "exits 3" in done.stdout.lower()
    assert "examples:" in done.stdout


def test_a_state_file_gives_manifest_report_and_plot(
    source: LocalSource, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    population = source.put(balanced(source.metadata()), activate=False)
    state = saved_state(source, population, tmp_path / "state.json")
    manifest, report, plot = tmp_path / "m.parquet", tmp_path / "r.parquet", tmp_path / "p.png"
    code = main(
        [
            "audit",
            str(state),
            *where(source),
            "--epochs",
            "0-1",
            "--columns",
            "label,source",
            "--manifest",
            str(manifest),
            "--group",
            "label",
            "--report",
            str(report),
            "--plot",
            str(plot),
            "--max-sigma",
            "5",
        ]
    )
    assert code == 0
    out = capsys.readouterr()
    rows = pl.read_parquet(manifest)
    assert rows.columns == [*MANIFEST_COLUMNS, "label", "source"]
    assert sorted(set(rows["epoch"].to_list())) == [0, 1]
    assert rows.height == 2 * (30_000 // 64) * 64
    assert pl.read_parquet(report)["observed"].sum() == rows.height
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "fingerprint: drt1-" in out.out
    for label in ("0", "1", "2"):
        assert f"│ {label} " in out.out
    assert f"-> {manifest}" in out.err


def test_a_torch_checkpoint_is_a_state_file(source: LocalSource, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    population = source.put(balanced(source.metadata()), activate=False)
    state = json.loads(saved_state(source, population, tmp_path / "s.json").read_text())
    torch.save({"model": {}, "loader": state}, tmp_path / "ckpt.pt")
    code = main(["audit", str(tmp_path / "ckpt.pt"), *where(source), "--group", "label"])
    assert code == 0


def test_max_sigma_gates_a_wrong_expectation(
    source: LocalSource, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A manifest recorded while the unweighted population was served, checked
    against the balanced population the run claims: exit 3."""
    plain = source.put(source.metadata(), activate=False)
    fair = source.put(balanced(source.metadata()), activate=False)
    served = tmp_path / "served.parquet"
    assert main(["audit", str(saved_state(source, plain, tmp_path / "a.json")), *where(source),
                 "--manifest", str(served)]) == 0  # fmt: skip
    claimed = saved_state(source, fair, tmp_path / "b.json")
    gate = ["--group", "label", "--read-manifest", str(served), "--max-sigma", "5"]
    assert main(["audit", str(claimed), *where(source), *gate]) == EXIT_DEVIATION
    assert "FAIL: a group deviates" in capsys.readouterr().err
    honest = saved_state(source, plain, tmp_path / "c.json")
    assert main(["audit", str(honest), *where(source), *gate]) == 0


def test_steps_select_a_range(source: LocalSource, tmp_path: Path) -> None:
    population = source.put(balanced(source.metadata()), activate=False)
    state = saved_state(source, population, tmp_path / "s.json")
    report = tmp_path / "r.json"
    args = ["audit", str(state), *where(source), "--group", "label", "--steps", "10:20"]
    assert main([*args, "--report", str(report)]) == 0
    # 10 steps x 2 ranks x 32 samples.
    assert json.loads(report.read_text())["draws"] == 640


def test_a_run_from_keys(source: LocalSource, tmp_path: Path) -> None:
    population = source.put(balanced(source.metadata()), activate=True)
    report = tmp_path / "r.json"
    keys = ["--dataset", DATASET, "--seed", str(SEED), "--batch-size", "10", "--epoch-len", "500"]
    assert main(["audit", *where(source), *keys, "--group", "label", "--report", str(report)]) == 0
    written = json.loads(report.read_text())
    assert written["populations"] == [population]
    assert written["draws"] == 500


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "nothing to do"),
        (["--group", "label"], "name the run's dataset"),
        (["--dataset", DATASET, "--group", "label"], "give the streams' source"),
        (["--dataset", DATASET, "--group", "label", "--cache", "x"], "--cache needs --state-dir"),
        (["--plot", "p.png", "--dataset", DATASET], "need --group"),
        (["--read-manifest", "m.parquet", "--manifest", "n.parquet", "--group", "g"], "excludes"),
    ],
)
def test_bad_arguments_say_what_is_wrong(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", *args]) == EXIT_BAD_INPUT
    assert message in capsys.readouterr().err


def test_bad_inputs_are_named(
    source: LocalSource, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    population = source.put(balanced(source.metadata()), activate=False)
    state = saved_state(source, population, tmp_path / "s.json")
    assert main(["audit", str(state), *where(source), "--group", "colour"]) == EXIT_BAD_INPUT
    assert "'colour' is not a column" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert main(["audit", str(broken), *where(source), "--group", "label"]) == EXIT_BAD_INPUT
    assert "cannot read the loader state" in capsys.readouterr().err
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"version": 1, "dataset": DATASET}))
    assert main(["audit", str(wrong), *where(source), "--group", "label"]) == EXIT_BAD_INPUT
    assert "loader state keys: missing" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["audit", str(state), *where(source), "--group", "label", "--steps", "5:2"])
    assert "FIRST:STOP" in capsys.readouterr().err
    assert (
        main(["audit", str(state), *where(source), "--seed", "3", "--group", "label"])
        == EXIT_BAD_INPUT
    )
    assert "a state file fixes --seed" in capsys.readouterr().err


def test_a_reader_that_stops_early_ends_the_report_quietly(
    source: LocalSource, tmp_path: Path
) -> None:
    """``audit ... --group label | head``: the report's reader goes away; the
    command stops non-zero with nothing on stderr (no "error: [Errno 32] Broken
    pipe", no traceback)."""
    import os

    population = source.put(balanced(source.metadata()), activate=False)
    state = saved_state(source, population, tmp_path / "s.json")
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "dataset_rt", "audit", str(state), *where(source),
             "--group", "label"],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode == 1


def test_a_terminal_gets_a_progress_bar(source: LocalSource, tmp_path: Path) -> None:
    """On a terminal (a pseudo-terminal here) the manifest's progress is drawn
    on stderr; piped, nothing but the result lines."""
    population = source.put(balanced(source.metadata()), activate=False)
    state = saved_state(source, population, tmp_path / "s.json", epoch_len=2_000_000)
    command = [sys.executable, "-m", "dataset_rt", "audit", str(state), *where(source)]
    command += ["--manifest", str(tmp_path / "m.parquet")]
    text = on_a_terminal(command)
    assert "manifest" in text
    assert "━" in text  # rich's bar
    assert "2000000/2000000" in text  # rows written of the manifest's rows
    piped = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    assert "━" not in piped.stderr


def test_the_report_step_shows_its_progress_on_a_terminal_only(
    source: LocalSource, tmp_path: Path
) -> None:
    """The report draws its own bar (draws counted, of those --steps selects)
    after the manifest's; with --quiet, or when stderr is not a terminal, no bar."""
    population = source.put(balanced(source.metadata()), activate=False)
    state = saved_state(source, population, tmp_path / "s.json", epoch_len=400_000)
    command = [sys.executable, "-m", "dataset_rt", "audit", str(state), *where(source)]
    command += ["--group", "label", "--steps", "0:5000"]  # 5,000 steps x 2 ranks x 32
    drawn = on_a_terminal(command)
    assert "━" in drawn
    assert "400000/400000" in drawn  # the manifest's rows (of a temporary manifest)
    assert "report" in drawn
    assert "320000/320000" in drawn  # the draws the report counted
    quiet = on_a_terminal([*command, "--quiet"])
    assert "━" not in quiet
    assert "/320000" not in quiet
    piped = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    assert "━" not in piped.stderr
    assert "/320000" not in piped.stderr
    assert "320,000 draws by 'label'" in piped.stdout
