"""The mixture report (`dataset_rt.mixture`): expected shares from the weights,
observed counts from the manifest, deviations, repeats and the fingerprint."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import polars as pl
import pytest

import dataset_rt as drt
from dataset_rt.audit import RunDescription, write_manifest
from dataset_rt.loader import LocalSource, RunOptions, RunState
from dataset_rt.mixture import REPORT_COLUMNS, fingerprint, mixture_report, read_report
from dataset_rt.mixture_plot import figure_size

from .conftest import DATASET, RECORDS, SEED, balanced, label_of


def run_over(
    source: LocalSource, population: str, *, epoch_len: int, batch_size: int = 100, world: int = 1
) -> RunDescription:
    return RunDescription.new(
        source,
        DATASET,
        seed=SEED,
        batch_size=batch_size,
        world_size=world,
        epoch_len=epoch_len,
        population=population,
    )


def test_expected_shares_are_the_weights_shares(source: LocalSource) -> None:
    weights = {0: 1.0, 1: 3.0, 2: 11.0}
    table = source.metadata().with_columns(
        pl.col("label").replace_strict(weights, return_dtype=pl.Float64).alias("weight")
    )
    population = source.put(table, activate=False)
    report = mixture_report(source, run_over(source, population, epoch_len=5000), "label")
    mass = {label: weights[label] * count for label, count in _label_counts().items()}
    total = sum(mass.values())
    assert report.groups.columns == ["label", *REPORT_COLUMNS]
    assert report.groups["label"].to_list() == [0, 1, 2]
    for row in report.groups.iter_rows(named=True):
        assert row["expected_share"] == pytest.approx(mass[row["label"]] / total, rel=1e-12)
    assert report.draws == 5000
    assert report.groups["observed"].sum() == 5000


def test_a_balanced_population_is_served_balanced(source: LocalSource) -> None:
    """10^6 draws of a population reweighted to balance 80/15/5 classes: every
    class within 5 sigma of a third, and the per-sample counts add up."""
    population = source.put(balanced(source.metadata()), activate=False)
    run = run_over(source, population, epoch_len=1_000_000, batch_size=1000, world=4)
    report = mixture_report(source, run, "label")
    groups = report.groups
    print(groups)
    assert report.draws == 1_000_000
    assert groups["expected_share"].to_list() == pytest.approx([1 / 3] * 3, rel=1e-9)
    assert groups["sigma"].abs().max() < 5  # type: ignore[operator]
    assert report.max_abs_sigma < 5
    counts = _label_counts()
    assert groups["samples"].to_list() == [counts[0], counts[1], counts[2]]
    # 333k draws over 150 samples of label 2: every one seen, most many times.
    assert groups.filter(pl.col("label") == 2)["never_drawn"].item() == 0
    assert (groups["distinct"] + groups["repeats"] == groups["observed"]).all()
    assert (groups["distinct"] + groups["never_drawn"] == groups["samples"]).all()


def test_distinct_repeats_and_never_drawn_match_the_manifest(
    source: LocalSource, tmp_path: Path
) -> None:
    population = source.put(balanced(source.metadata()), activate=False)
    run = run_over(source, population, epoch_len=2000, batch_size=50, world=2)
    path = tmp_path / "m.parquet"
    write_manifest(source, run, path, columns=["label"])
    report = mixture_report(source, run, "label", manifest=path)
    rows = pl.read_parquet(path)
    for row in report.groups.iter_rows(named=True):
        mine = rows.filter(pl.col("label") == row["label"])
        distinct = mine.select("cache_id", "sample_id").n_unique()
        assert row["observed"] == mine.height
        assert row["distinct"] == distinct
        assert row["repeats"] == mine.height - distinct
        assert row["never_drawn"] == _label_counts()[row["label"]] - distinct


def test_a_range_of_the_manifest_and_a_switch(source: LocalSource, tmp_path: Path) -> None:
    """Steps 0..9 only; from position 600 the run draws label 2 only, so the
    expected shares mix both populations by their draws."""
    everything = source.put(source.metadata(), activate=False)
    twos = source.put(source.metadata().filter(pl.col("label") == 2), activate=False)
    options = RunOptions(
        dataset=DATASET,
        seed=SEED,
        epoch_len=1000,
        population=everything,
        batch_size=20,
        world_size=2,
    )
    state = RunState.start(options, source.resolve(options.request()))
    state.switch(600, twos)
    run = RunDescription.from_state(state.to_dict())
    path = tmp_path / "m.parquet"
    write_manifest(source, run, path, columns=["label"])
    report = mixture_report(source, run, "label", manifest=path, where=pl.col("step") < 20)
    rows = pl.read_parquet(path).filter(pl.col("step") < 20)
    before = rows.filter(pl.col("position") < 600).height
    after = rows.filter(pl.col("position") >= 600).height
    assert report.draws == rows.height == before + after
    assert before
    assert after
    shares = {0: 0.8, 1: 0.15, 2: 0.05}
    for row in report.groups.iter_rows(named=True):
        label = row["label"]
        expected = before * shares[label] + after * (1.0 if label == 2 else 0.0)
        assert row["expected"] == pytest.approx(expected, rel=1e-9)
        assert row["observed"] == rows.filter(pl.col("label") == label).height
    assert report.populations == sorted([everything, twos])

    # The switch is drawn, not blended: the timeline has label 2 alone after it.
    assert report.switches == [(600, twos)]
    assert report.timeline is not None
    late = report.timeline.filter(pl.col("position") >= 600)
    assert set(late.filter(pl.col("share") > 0)["label"].to_list()) == {2}
    early = report.timeline.filter(pl.col("position") < 600)
    assert len(set(early["label"].to_list())) == 3
    assert report.segment_expected is not None
    after_switch = report.segment_expected.filter(pl.col("start") == 600)
    assert after_switch.filter(pl.col("label") == 2)["expected_share"].to_list() == [1.0]
    png = tmp_path / "switch.png"
    assert report.plot(png) == figure_size(3, timeline=True)
    data = png.read_bytes()
    assert struct.unpack(">II", data[16:24]) == figure_size(3, timeline=True)


def test_ordered_runs_expect_row_shares(source: LocalSource) -> None:
    run = RunDescription.new(
        source, DATASET, seed=SEED, batch_size=RECORDS, epoch_len=RECORDS, shuffle=False
    )
    report = mixture_report(source, run, "label")
    # One pass over the table in order: every sample exactly once, no deviation.
    assert report.groups["never_drawn"].to_list() == [0, 0, 0]
    assert report.groups["repeats"].to_list() == [0, 0, 0]
    assert report.max_abs_sigma == pytest.approx(0.0, abs=1e-9)


def test_a_wrong_expectation_shows_as_deviation(source: LocalSource, tmp_path: Path) -> None:
    """A manifest recorded under the unweighted population, checked against the
    balanced one: label 0 is served far above its expected third."""
    plain = source.put(source.metadata(), activate=False)
    fair = source.put(balanced(source.metadata()), activate=False)
    path = tmp_path / "served.parquet"
    write_manifest(source, run_over(source, plain, epoch_len=20_000), path)
    report = mixture_report(
        source, run_over(source, fair, epoch_len=20_000), "label", manifest=path
    )
    assert report.groups.filter(pl.col("label") == 0)["sigma"].item() > 50
    assert report.max_abs_sigma > 50


def test_fingerprint_names_the_populations_and_caches(source: LocalSource) -> None:
    population = source.put(balanced(source.metadata()), activate=False)
    report = mixture_report(source, run_over(source, population, epoch_len=100), "label")
    cache_ids = sorted(set(source.metadata()["cache_id"].to_list()))
    assert report.cache_ids == cache_ids
    assert report.populations == [population]
    assert report.fingerprint == fingerprint([population], cache_ids)
    assert report.fingerprint.startswith("drt1-")
    assert len(report.fingerprint) == 21
    other = source.put(source.metadata(), activate=False)
    assert fingerprint([other], cache_ids) != report.fingerprint
    assert fingerprint([population], [*cache_ids, 1]) != report.fingerprint


def test_the_report_is_written_as_json_parquet_and_png(source: LocalSource, tmp_path: Path) -> None:
    population = source.put(balanced(source.metadata()), activate=False)
    report = mixture_report(source, run_over(source, population, epoch_len=3000), "source")
    report.write(tmp_path / "r.json")
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["fingerprint"] == report.fingerprint
    assert [g["source"] for g in written["groups"]] == [f"s{i}" for i in range(7)]
    assert sum(g["observed"] for g in written["groups"]) == 3000
    report.write(tmp_path / "r.parquet")
    header, table = read_report(tmp_path / "r.parquet")
    assert header["draws"] == 3000
    assert table.num_rows == 7
    with pytest.raises(drt.InvalidArgumentError, match=r"\.json or \.parquet"):
        report.write(tmp_path / "r.csv")

    png = tmp_path / "r.png"
    assert report.plot(png) == figure_size(7)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    assert struct.unpack(">II", data[16:24]) == figure_size(7)
    assert len(data) > 10_000  # bars, labels and text, not an empty canvas


def test_a_missing_or_ambiguous_group_column_is_refused(source: LocalSource) -> None:
    run = run_over(source, source.put(source.metadata(), activate=False), epoch_len=10)
    with pytest.raises(drt.InvalidArgumentError, match=r"'colour' is not a column.*label"):
        mixture_report(source, run, "colour")
    table = source.metadata()
    doubled = pl.concat(
        [table, table.head(1).with_columns(pl.lit("x").alias("tag"))], how="diagonal"
    )
    doubled = doubled.with_columns(pl.col("tag").fill_null("y"))
    run = run_over(source, source.put(doubled, activate=False), epoch_len=10)
    with pytest.raises(drt.InvalidArgumentError, match="two values of 'tag'"):
        mixture_report(source, run, "tag")


def _label_counts() -> dict[int, int]:
    counts = {0: 0, 1: 0, 2: 0}
    for index in range(RECORDS):
        counts[label_of(index)] += 1
    return counts


def test_a_permutation_run_draws_every_sample_once_per_cycle(source: LocalSource) -> None:
    """Permutation mode ignores the weights: expected shares are row shares, and
    two whole cycles draw every sample exactly twice (no deviation at all)."""
    population = source.put(balanced(source.metadata()), activate=False)
    run = RunDescription.new(
        source,
        DATASET,
        seed=SEED,
        batch_size=RECORDS,
        epoch_len=2 * RECORDS,
        population=population,
        shuffle="permutation",
    )
    report = mixture_report(source, run, "label")
    counts = _label_counts()
    assert report.shuffle == "permutation"
    assert report.groups["expected_share"].to_list() == pytest.approx(
        [counts[label] / RECORDS for label in (0, 1, 2)], rel=1e-12
    )
    assert report.groups["observed"].to_list() == [2 * counts[label] for label in (0, 1, 2)]
    assert report.groups["repeats"].to_list() == [counts[label] for label in (0, 1, 2)]
    assert report.groups["never_drawn"].to_list() == [0, 0, 0]
    assert report.max_abs_sigma == pytest.approx(0.0, abs=1e-9)
