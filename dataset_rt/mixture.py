"""The mixture report: the mixture a run was served, against the one its weights ask for.

For a grouping column of the population (``label``, ``source``, ...) and a
range of a run's manifest, per group: the expected share (from the weights of
the population each position drew from; from the row counts when the stream is
ordered or a permutation), the observed count and share, the deviation in standard deviations of
the binomial, the distinct samples seen, the repeats and the samples never
drawn. At the top, one short fingerprint of the data (the populations' ids and
their caches' ids) to put in training logs.

The counts are Polars aggregations over the manifest's Parquet file with the
streaming engine: memory grows with the number of distinct samples seen (at
most the population's size), not with the number of rows.
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

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from dataset_rt.audit import RunDescription, write_manifest
from dataset_rt.config import ShuffleMode
from dataset_rt.errors import InvalidArgumentError
from dataset_rt.loader import StreamSource

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
    """
    if manifest is None:
        with tempfile.TemporaryDirectory(prefix="dataset-rt-audit-") as scratch:
            path = Path(scratch) / "manifest.parquet"
            write_manifest(source, run, path, progress=progress)
            return mixture_report(source, run, group, manifest=path, where=where)
    state = run.state
    populations = {
        population: source.population(state.dataset, population) for _, population in state.segments
    }
    for population, table in populations.items():
        if group not in table.columns:
            raise InvalidArgumentError(
                f"the grouping column {group!r} is not a column of population {population}; "
                f"its columns are {table.columns}"
            )

    rows = pl.scan_parquet(manifest)
    if where is not None:
        rows = rows.filter(where)
    # The segment (population) of each row, from its absolute position.
    starts = [start for start, _ in state.segments]
    segment = pl.sum_horizontal(
        [pl.lit(0, pl.UInt32), *[(pl.col("position") >= s).cast(pl.UInt32) for s in starts[1:]]]
    )
    per_segment = rows.group_by(segment.alias("segment"), *_IDS).agg(pl.len().alias("n"))
    seen = per_segment.collect(engine="streaming")

    # Each sample's group, per segment (its population's value of the column).
    lookup = pl.concat(
        [
            _sample_groups(populations[population], group, population).with_columns(
                pl.lit(i, pl.UInt32).alias("segment")
            )
            for i, (_, population) in enumerate(state.segments)
        ],
        how="vertical_relaxed",
    )
    seen = seen.join(lookup, on=["segment", *_IDS], how="left")
    draws_per_segment = dict(seen.group_by("segment").agg(pl.col("n").sum()).iter_rows())
    used = sorted({state.segments[i][1] for i in draws_per_segment})

    observed = seen.group_by(group).agg(
        pl.col("n").sum().alias("observed"),
        pl.struct(_IDS).n_unique().alias("distinct"),
    )
    expected = _expected(
        [
            (draws_per_segment[i], populations[population])
            for i, (_, population) in enumerate(state.segments)
            if i in draws_per_segment
        ],
        group,
        weighted=state.shuffle is True,
    )
    samples = (
        lookup.filter(pl.col("segment").is_in(list(draws_per_segment)))
        .select(group, *_IDS)
        .unique()
        .group_by(group)
        .agg(pl.len().alias("samples"))
    )
    draws = int(sum(draws_per_segment.values()))
    table = (
        expected.join(observed, on=group, how="full", coalesce=True, nulls_equal=True)
        .join(samples, on=group, how="full", coalesce=True, nulls_equal=True)
        .with_columns(
            pl.col("expected", "variance").fill_null(0.0),
            pl.col("observed", "distinct", "samples").fill_null(0).cast(pl.UInt64),
        )
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
    cache_ids = sorted(
        {int(c) for p in used for c in populations[p]["cache_id"].unique().to_list()}
    )
    timeline = switches = expected_by_segment = None
    if len(draws_per_segment) > 1:
        # A switch is a change of mixture: draw it over the positions, so a
        # person sees before and after, not the blend the table shows.
        timeline = _timeline(rows, segment, lookup, group)
        first, last = timeline.select(pl.min("position"), pl.max("position").alias("b")).row(0)
        reach = int(last) + _bin_width(rows)
        switches = [
            (start, population)
            for i, (start, population) in enumerate(state.segments)
            if i and i in draws_per_segment and int(first) <= start <= reach
        ]
        expected_by_segment = pl.concat(
            [
                _expected([(1, populations[population])], group, weighted=state.shuffle is True)
                .select(group, pl.col("expected").alias("expected_share"))
                .with_columns(pl.lit(start, pl.UInt64).alias("start"))
                for i, (start, population) in enumerate(state.segments)
                if i in draws_per_segment
            ],
            how="vertical_relaxed",
        )
    return MixtureReport(
        fingerprint=fingerprint(used, cache_ids),
        dataset=state.dataset,
        group=group,
        draws=draws,
        populations=used,
        cache_ids=cache_ids,
        seed=state.seed,
        shuffle=state.shuffle,
        groups=table,
        timeline=timeline,
        switches=switches or [],
        segment_expected=expected_by_segment,
    )


#: Bins of positions the timeline of a switching run is drawn in.
TIMELINE_BINS = 60


def _bin_width(rows: pl.LazyFrame) -> int:
    bounds = rows.select(pl.col("position").min().alias("a"), pl.col("position").max().alias("b"))
    low, high = bounds.collect().row(0)
    return max(1, math.ceil((int(high) - int(low) + 1) / TIMELINE_BINS))


def _timeline(
    rows: pl.LazyFrame, segment: pl.Expr, lookup: pl.DataFrame, group: str
) -> pl.DataFrame:
    """Each group's share of the draws per bin of positions (streamed: one
    pass over the manifest, the population's groups joined on the way)."""
    width = _bin_width(rows)
    low = rows.select(pl.col("position").min()).collect().item()
    binned = (
        rows.with_columns(segment.alias("segment"))
        .join(lookup.lazy(), on=["segment", *_IDS], how="left")
        .group_by(((pl.col("position") - low) // width * width + low).alias("position"), group)
        .agg(pl.len().alias("n"))
        .collect(engine="streaming")
    )
    return binned.with_columns(
        (pl.col("n") / pl.col("n").sum().over("position")).alias("share")
    ).sort("position", group, nulls_last=True)


def fingerprint(populations: list[str], cache_ids: list[int]) -> str:
    """One short string for the data a run drew from: a hash of its populations'
    ids (which address their rows and weights) and its caches' ids (which address
    the caches' content)."""
    canonical = json.dumps({"populations": sorted(populations), "caches": sorted(cache_ids)})
    return "drt1-" + hashlib.blake2b(canonical.encode(), digest_size=8).hexdigest()


def _sample_groups(table: pl.DataFrame, group: str, population: str) -> pl.DataFrame:
    """(cache_id, sample_id) -> group of one population; a sample listed twice
    with two values of the column has no single group and is refused."""
    pairs = table.select(*_IDS, group).unique()
    if pairs.height != pairs.select(_IDS).n_unique():
        clash = pairs.filter(pl.struct(_IDS).is_duplicated()).head(1).to_dicts()[0]
        raise InvalidArgumentError(
            f"population {population} lists sample (cache_id={clash['cache_id']}, "
            f"sample_id={clash['sample_id']}) with two values of {group!r}; "
            "a grouping column needs one value per sample"
        )
    return pairs


def _expected(
    segments: list[tuple[int, pl.DataFrame]], group: str, *, weighted: bool
) -> pl.DataFrame:
    """Per group: the expected draws and the variance of the observed count, summed
    over the segments (``d`` draws each, share ``p`` of the segment's population:
    weights for weighted draws, rows in table order and permutation mode).

    Sums are `math.fsum` (correctly rounded): a report is the same number for
    number however the population's rows are ordered or chunked."""
    expected: dict[Any, list[float]] = {}
    variance: dict[Any, list[float]] = {}
    dtype: pl.DataType = pl.Null()
    for draws, table in segments:
        dtype = table.schema[group]
        if weighted:
            lists = table.group_by(group).agg(pl.col("weight")).iter_rows()
            masses = {key: math.fsum(weights) for key, weights in lists}
        else:
            masses = {key: float(n) for key, n in table.group_by(group).len().iter_rows()}
        total = math.fsum(masses.values())
        for key, mass in masses.items():
            p = mass / total
            expected.setdefault(key, []).append(p * draws)
            variance.setdefault(key, []).append(p * (1 - p) * draws)
    return pl.DataFrame(
        {
            group: list(expected),
            "expected": [math.fsum(v) for v in expected.values()],
            "variance": [math.fsum(v) for v in variance.values()],
        },
        schema={group: dtype, "expected": pl.Float64, "variance": pl.Float64},
    )


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
