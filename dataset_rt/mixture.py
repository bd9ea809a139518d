"""The mixture report: the mixture a run was served, against the one its weights ask for.

For a grouping column of the population (``label``, ``source``, ...) and a
range of a run's manifest, per group: the expected share (from the weights of
the population each position drew from; from the row counts when the stream is
ordered or a permutation), the observed count and share, the deviation in standard deviations of
the binomial, the distinct samples seen, the repeats and the samples never
drawn. At the top, one short fingerprint of the data (the populations' ids and
their caches' ids) to put in training logs.

The manifest's draws are read in batches (Polars' streaming engine, ``where``
applied on the way) and counted into numpy arrays per population and group
(`dataset_rt.mixture_counts`): memory grows with the populations' sizes and the
number of groups, not with the number of draws.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from dataset_rt.audit import RunDescription, write_manifest
from dataset_rt.config import ShuffleMode
from dataset_rt.errors import InvalidArgumentError
from dataset_rt.loader import RunState, StreamSource
from dataset_rt.mixture_counts import MixtureCounts
from dataset_rt.mixture_index import SampleIndex, group_values

#: The report's columns, after the group column.
REPORT_COLUMNS = (
    "expected_share",
    "observed_share",
    "expected",
    "observed",
    "sigma",
    "distinct",
    "repeats",
    "samples",
    "never_drawn",
)

_IDS = ["cache_id", "sample_id"]


@dataclasses.dataclass(frozen=True)
class MixtureReport:
    """Per group of ``group``: expected and observed shares and what was seen.

    ``groups`` has the group column then `REPORT_COLUMNS`, sorted by group:
    ``expected`` and ``observed`` are draw counts (``expected`` a real number),
    ``sigma`` is ``(observed - expected) / sqrt(sum of d * p * (1 - p))`` over the
    population segments (``d`` draws at expected share ``p``), ``distinct`` the
    samples seen at least once, ``repeats = observed - distinct``, ``samples``
    the distinct samples of the group in the populations drawn from and
    ``never_drawn = samples - distinct``.
    """

    fingerprint: str
    dataset: str
    group: str
    draws: int
    populations: list[str]
    cache_ids: list[int]
    seed: int
    shuffle: ShuffleMode
    groups: pl.DataFrame
    #: With draws from more than one population segment: the observed share of
    #: each group over the run's positions (``position`` is the first of a bin of
    #: `TIMELINE_BINS`), and ``switches``, the positions where segments begin.
    timeline: pl.DataFrame | None = None
    switches: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    #: Per segment drawn from: its first position and each group's expected share.
    segment_expected: pl.DataFrame | None = None

    @property
    def max_abs_sigma(self) -> float:
        """The largest deviation of any group, in standard deviations (0 with no draw)."""
        if self.groups.is_empty():
            return 0.0
        return float(self.groups["sigma"].abs().max())  # type: ignore[arg-type]

    def header(self) -> dict[str, Any]:
        """Everything but the table, JSON-serialisable."""
        return {
            "fingerprint": self.fingerprint,
            "dataset": self.dataset,
            "group": self.group,
            "draws": self.draws,
            "populations": self.populations,
            "cache_ids": self.cache_ids,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "max_abs_sigma": _finite(self.max_abs_sigma),
        }

    def to_dict(self) -> dict[str, Any]:
        rows = [
            {k: _finite(v) if isinstance(v, float) else v for k, v in row.items()}
            for row in self.groups.with_columns(pl.col(self.group).cast(pl.String)).to_dicts()
        ]
        return self.header() | {"groups": rows}

    def write(self, path: str | Path) -> None:
        """Write the report as JSON (``.json``) or Parquet (``.parquet``, the
        header in the file's key-value metadata under ``dataset_rt.mixture``)."""
        target = Path(path)
        if target.suffix == ".json":
            target.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        elif target.suffix == ".parquet":
            table = self.groups.to_arrow()
            meta = {b"dataset_rt.mixture": json.dumps(self.header()).encode()}
            pq.write_table(table.replace_schema_metadata(meta), target)
        else:
            raise InvalidArgumentError(
                f"a report is written as .json or .parquet, got {target.name!r}"
            )

    def plot(self, path: str | Path, *, max_groups: int = 40) -> tuple[int, int]:
        """Draw expected against observed share per group to the PNG ``path``;
        returns its (width, height) in pixels."""
        from dataset_rt.mixture_plot import plot_report

        return plot_report(self, Path(path), max_groups=max_groups)


def mixture_report(
    source: StreamSource,
    run: RunDescription,
    group: str,
    *,
    manifest: str | Path | None = None,
    where: pl.Expr | None = None,
    progress: Callable[[int], None] | None = None,
) -> MixtureReport:
    """The mixture report of ``run`` grouped by the population column ``group``.

    ``manifest`` is the run's manifest file (`write_manifest`); without one it is
    computed into a temporary file first. ``where`` selects a range of it (any
    Polars predicate over the manifest's columns, e.g. ``pl.col("step") < 100``).
    ``progress`` is called with the rows of each batch: as the manifest is
    written (without ``manifest``), then as its draws are counted
    (`count_draws` says how many there are to count).
    """
    if manifest is None:
        with tempfile.TemporaryDirectory(prefix="dataset-rt-audit-") as scratch:
            path = Path(scratch) / "manifest.parquet"
            write_manifest(source, run, path, progress=progress)
            return mixture_report(source, run, group, manifest=path, where=where, progress=progress)
    state = run.state
    indexes = _index_populations(source, state, group)
    values, null_code = group_values(list(indexes.values()))
    rows = _selected(manifest, where)
    counts = MixtureCounts(
        [(start, indexes[population]) for start, population in state.segments],
        len(values),
        null_code,
        _bins(rows) if len(state.segments) > 1 else None,
    )
    batches = rows.select("position", *_IDS).collect_batches(
        chunk_size=_BATCH_ROWS, maintain_order=False
    )
    for batch in batches:
        counts.add(*(batch.get_column(name).to_numpy() for name in ("position", *_IDS)))
        if progress is not None:
            progress(batch.height)

    drawn = {i for i, draws in enumerate(counts.draws_per_segment.tolist()) if draws}
    used = sorted({state.segments[i][1] for i in drawn})
    cache_ids = sorted({int(c) for p in used for c in indexes[p].caches.tolist()})
    timeline = switches = expected_by_segment = None
    if len(drawn) > 1 and counts.bins is not None:
        # A switch is a change of mixture: draw it over the positions, so a
        # person sees before and after, not the blend the table shows.
        timeline = _timeline(counts.timeline, counts.bins, values, group)
        first, last = timeline.select(pl.min("position"), pl.max("position").alias("b")).row(0)
        reach = int(last) + counts.bins[1]
        switches = [
            (start, population)
            for i, (start, population) in enumerate(state.segments)
            if i and i in drawn and int(first) <= start <= reach
        ]
        expected_by_segment = pl.concat(
            [
                _shares(indexes[population], values, group).with_columns(
                    pl.lit(start, pl.UInt64).alias("start")
                )
                for i, (start, population) in enumerate(state.segments)
                if i in drawn
            ],
            how="vertical_relaxed",
        )
    return MixtureReport(
        fingerprint=fingerprint(used, cache_ids),
        dataset=state.dataset,
        group=group,
        draws=int(counts.draws_per_segment.sum()),
        populations=used,
        cache_ids=cache_ids,
        seed=state.seed,
        shuffle=state.shuffle,
        groups=_groups(counts, values, group),
        timeline=timeline,
        switches=switches or [],
        segment_expected=expected_by_segment,
    )


def _index_populations(source: StreamSource, state: RunState, group: str) -> dict[str, SampleIndex]:
    """A `SampleIndex` of each population the run draws from, one at a time (its
    table is let go once it is indexed)."""
    weighted = state.shuffle is True
    indexes: dict[str, SampleIndex] = {}
    for _, population in state.segments:
        if population in indexes:
            continue
        table = source.population(state.dataset, population)
        if group not in table.columns:
            raise InvalidArgumentError(
                f"the grouping column {group!r} is not a column of population {population}; "
                f"its columns are {table.columns}"
            )
        needed = dict.fromkeys([*_IDS, group, *(["weight"] if weighted else [])])
        indexes[population] = SampleIndex.of(
            table.select(list(needed)), group, population, weighted=weighted
        )
        del table
    return indexes


def _bins(rows: pl.LazyFrame) -> tuple[int, int, int] | None:
    """The timeline's bins over the selected positions: (first position, width,
    count), at most `TIMELINE_BINS`; None without a row."""
    bounds = rows.select(pl.min("position").alias("low"), pl.max("position").alias("high"))
    low, high = bounds.collect().row(0)
    if low is None:
        return None
    width = max(1, math.ceil((int(high) - int(low) + 1) / TIMELINE_BINS))
    return int(low), width, (int(high) - int(low)) // width + 1


def _groups(counts: MixtureCounts, values: pl.Series, group: str) -> pl.DataFrame:
    """The report's table: every group drawn or in a population drawn from."""
    observed, distinct, samples = counts.observed, counts.distinct(), counts.samples()
    shown = np.flatnonzero((observed > 0) | (samples > 0))
    drawn_from = [
        (draws, index)
        for (_, index), draws in zip(
            counts.segments, counts.draws_per_segment.tolist(), strict=True
        )
        if draws
    ]
    expected, variance = _expected(drawn_from, shown)
    draws = int(counts.draws_per_segment.sum())
    return (
        pl.DataFrame(
            {
                group: values.gather(shown),
                "expected": expected,
                "variance": variance,
                "observed": observed[shown],
                "distinct": distinct[shown],
                "samples": samples[shown],
            },
            schema_overrides={"expected": pl.Float64, "variance": pl.Float64},
        )
        .with_columns(pl.col("observed", "distinct", "samples").cast(pl.UInt64))
        .with_columns(
            (pl.col("expected") / draws if draws else pl.lit(0.0)).alias("expected_share"),
            (pl.col("observed") / draws if draws else pl.lit(0.0)).alias("observed_share"),
            _sigma().alias("sigma"),
            (pl.col("observed") - pl.col("distinct")).alias("repeats"),
            (pl.col("samples") - pl.col("distinct")).alias("never_drawn"),
        )
        .select(group, *REPORT_COLUMNS)
        .sort(group, nulls_last=True)
    )


def count_draws(manifest: str | Path, where: pl.Expr | None = None) -> int:
    """The draws a report on ``manifest`` (with ``where``) counts: the total of
    its ``progress``."""
    return int(_selected(manifest, where).select(pl.len()).collect().item())


def _selected(manifest: str | Path, where: pl.Expr | None) -> pl.LazyFrame:
    rows = pl.scan_parquet(manifest)
    return rows if where is None else rows.filter(where)


#: Bins of positions the timeline of a switching run is drawn in.
TIMELINE_BINS = 60

#: Manifest rows counted per batch: large enough that the per-batch Python work
#: is noise, small enough that a batch's arrays are a few MiB.
_BATCH_ROWS = 1 << 18


def _expected(
    segments: list[tuple[int, SampleIndex]], codes: np.ndarray[Any, Any]
) -> tuple[list[float], list[float]]:
    """Per group code of ``codes``: the expected draws and the variance of the
    observed count, summed over the segments (``d`` draws each, share ``p`` of
    the segment's population: weights for weighted draws, rows in table order
    and permutation mode).

    Sums are `math.fsum` (correctly rounded): a report is the same number for
    number however the population's rows are ordered or chunked."""
    expected: list[list[float]] = [[] for _ in codes]
    variance: list[list[float]] = [[] for _ in codes]
    for draws, index in segments:
        total = math.fsum(index.masses.tolist())
        for k, mass in enumerate(index.masses[codes].tolist()):
            if mass:
                p = mass / total
                expected[k].append(p * draws)
                variance[k].append(p * (1 - p) * draws)
    return [math.fsum(v) for v in expected], [math.fsum(v) for v in variance]


def _shares(index: SampleIndex, values: pl.Series, group: str) -> pl.DataFrame:
    """Each group's expected share of one draw from the population of ``index``."""
    codes = np.flatnonzero(index.masses)
    total = math.fsum(index.masses.tolist())
    return pl.DataFrame(
        {
            group: values.gather(codes),
            "expected_share": [mass / total for mass in index.masses[codes].tolist()],
        },
        schema_overrides={"expected_share": pl.Float64},
    )


def _timeline(
    counts: np.ndarray[Any, Any], bins: tuple[int, int, int], values: pl.Series, group: str
) -> pl.DataFrame:
    """Each group's share of the draws per bin of positions (``position`` is the
    bin's first)."""
    low, width, _ = bins
    cells = np.flatnonzero(counts)
    bin_, code = np.divmod(cells, len(values))
    return (
        pl.DataFrame(
            {
                "position": (bin_ * width + low).astype(np.uint64),
                group: values.gather(code),
                "n": counts[cells].astype(np.uint32),
            }
        )
        .with_columns((pl.col("n") / pl.col("n").sum().over("position")).alias("share"))
        .sort("position", group, nulls_last=True)
    )


def fingerprint(populations: list[str], cache_ids: list[int]) -> str:
    """One short string for the data a run drew from: a hash of its populations'
    ids (which address their rows and weights) and its caches' ids (which address
    the caches' content)."""
    canonical = json.dumps({"populations": sorted(populations), "caches": sorted(cache_ids)})
    return "drt1-" + hashlib.blake2b(canonical.encode(), digest_size=8).hexdigest()


def _sigma() -> pl.Expr:
    """Deviation in binomial standard deviations; with no variance (a share of
    0 or 1) a match is 0 and any difference is infinite."""
    difference = pl.col("observed").cast(pl.Float64) - pl.col("expected")
    return (
        pl.when(pl.col("variance") > 0)
        .then(difference / pl.col("variance").sqrt())
        .when(difference.abs() < 1e-9)
        .then(0.0)
        .otherwise(pl.lit(math.inf) * difference.sign())
    )


def _finite(value: float) -> float | str:
    """JSON has no infinity: an infinite deviation is written as a string."""
    return value if math.isfinite(value) else ("inf" if value > 0 else "-inf")


def read_report(path: str | Path) -> tuple[dict[str, Any], pa.Table]:
    """A report written as Parquet: its header and its table."""
    table = pq.read_table(path)
    meta = (table.schema.metadata or {}).get(b"dataset_rt.mixture")
    if meta is None:
        raise InvalidArgumentError(f"{path} is not a mixture report (no dataset_rt.mixture key)")
    return json.loads(meta), table
