"""The mixture report drawn: expected against observed share per group.

One row per group (the largest expected shares when there are many): a hollow
bar for the expected share, a filled bar for the observed one, coloured by how
far it deviates, and the deviation in sigma written beside it. A run that
switched populations gets a panel below: each group's observed share over the
run's positions, the expected share of each segment dashed and every switch
marked, so the switch shows rather than the blend of before and after.
Matplotlib with its non-interactive Agg backend, so it runs on servers without
a display.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import polars as pl


class MixtureReport(Protocol):
    """What a plot reads of a report (`dataset_rt.mixture.MixtureReport` has
    it): described here, so that the report's module, which imports this one
    when asked for a plot, is not imported back."""

    @property
    def dataset(self) -> str: ...
    @property
    def group(self) -> str: ...
    @property
    def draws(self) -> int: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def groups(self) -> pl.DataFrame: ...
    @property
    def timeline(self) -> pl.DataFrame | None: ...
    @property
    def switches(self) -> list[tuple[int, str]]: ...
    @property
    def segment_expected(self) -> pl.DataFrame | None: ...
    @property
    def max_abs_sigma(self) -> float: ...


#: Inches of figure per group row, and around the rows (title, axis, legend).
_ROW_INCHES = 0.42
_FRAME_INCHES = 2.2
_WIDTH_INCHES = 10.0
_DPI = 100

#: Deviation colours: within 2 sigma, within 5, beyond.
_CALM, _WARN, _ALARM = "#2f7d4f", "#d08a1e", "#c0392b"

_SIGMA = "\N{GREEK SMALL LETTER SIGMA}"


#: Inches of the timeline panel of a switching run, and the groups it draws.
_TIMELINE_INCHES = 3.4
_TIMELINE_GROUPS = 8


def figure_size(groups: int, *, timeline: bool = False) -> tuple[int, int]:
    """The PNG's (width, height) in pixels for ``groups`` drawn rows (and the
    timeline panel of a run that switched populations)."""
    height = _FRAME_INCHES + _ROW_INCHES * max(groups, 1)
    height += _TIMELINE_INCHES if timeline else 0.0
    return round(_WIDTH_INCHES * _DPI), round(height * _DPI)


def plot_report(report: MixtureReport, path: Path, *, max_groups: int = 40) -> tuple[int, int]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import PercentFormatter

    if max_groups < 1:
        raise ValueError(f"max_groups must be >= 1, got {max_groups}")
    shown = report.groups.sort("expected_share", descending=True).head(max_groups)
    hidden = report.groups.height - shown.height
    shown = shown.sort(report.group, nulls_last=True)
    labels = [_label(v) for v in shown[report.group].to_list()]
    expected = shown["expected_share"].to_list()
    observed = shown["observed_share"].to_list()
    sigmas = shown["sigma"].to_list()

    timeline = report.timeline is not None and not report.timeline.is_empty()
    width, height = figure_size(shown.height, timeline=timeline)
    bars_inches = height / _DPI - (_TIMELINE_INCHES if timeline else 0.0)
    fig = plt.figure(figsize=(width / _DPI, height / _DPI), dpi=_DPI)
    grid = fig.add_gridspec(
        2 if timeline else 1,
        2,
        width_ratios=[3, 1.15],
        height_ratios=[bars_inches - 0.95, _TIMELINE_INCHES - 0.35] if timeline else None,
        wspace=0.06,
        hspace=0.9 / bars_inches if timeline else None,
    )
    ax = fig.add_subplot(grid[0, 0])
    dev = fig.add_subplot(grid[0, 1], sharey=ax)
    dev.tick_params(labelleft=False)
    try:
        rows = list(range(shown.height))
        ax.barh(
            [r + 0.18 for r in rows],
            expected,
            height=0.34,
            facecolor="none",
            edgecolor="#555555",
            hatch="//",
        )
        ax.barh([r - 0.18 for r in rows], observed, height=0.34, color=[_colour(s) for s in sigmas])
        top = max([*expected, *observed, 1e-12])
        ax.set_yticks(rows, labels)
        ax.set_xlim(0, top * 1.08)
        ax.set_xlabel("share of draws")
        ax.set_ylabel(report.group)
        digits = 0 if top >= 0.2 else 1 if top >= 0.02 else 2
        ax.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=digits))
        ax.grid(axis="x", alpha=0.3)

        # The deviation panel: where each group lies in binomial sigma, with the
        # 2 and 5 sigma bands, so a deviation too small to see in the bars shows.
        shown_sigma = [_clip(s) for s in sigmas]
        reach = max(6.0, *(abs(s) for s in shown_sigma)) * 1.15
        dev.axvspan(-5, 5, color=_WARN, alpha=0.08)
        dev.axvspan(-2, 2, color=_CALM, alpha=0.12)
        dev.axvline(0, color="#555555", linewidth=0.8)
        dev.hlines(rows, 0, shown_sigma, colors=[_colour(s) for s in sigmas], linewidth=2)
        dev.scatter(shown_sigma, rows, c=[_colour(s) for s in sigmas], zorder=3, s=28)
        symlog = reach > 12  # large deviations: linear within 5 sigma, logarithmic beyond
        for r, sigma in enumerate(sigmas):
            # Text away from zero, unless that would run past the panel's edge.
            near = _visual(abs(shown_sigma[r]), symlog) < 0.5 * _visual(reach, symlog)
            rightward = (shown_sigma[r] >= 0) == near
            dev.annotate(
                _sigma_text(sigma),
                (shown_sigma[r], r),
                xytext=(6 if rightward else -6, 6),
                textcoords="offset points",
                ha="left" if rightward else "right",
                fontsize=8,
                color=_colour(sigma),
            )
        dev.set_xlim(-reach, reach)
        if symlog:
            dev.set_xscale("symlog", linthresh=5)
            ticks = [t for t in (-1000, -100, -10, 0, 10, 100, 1000) if abs(t) < reach]
            dev.set_xticks(ticks, [f"{t:g}" for t in ticks])
        dev.set_xlabel(f"deviation (binomial {_SIGMA})")
        dev.tick_params(axis="y", left=False)

        title = f"{report.dataset}: {report.draws:,} draws by {report.group!r}"
        if hidden:
            title += f" ({shown.height} largest of {report.groups.height} groups)"
        fig.suptitle(
            f"{title}\nfingerprint {report.fingerprint}   max |deviation| "
            f"{_sigma_text(report.max_abs_sigma)}",
            x=0.01,
            ha="left",
            fontsize=10,
        )
        fig.legend(
            handles=[
                Patch(facecolor="none", edgecolor="#555555", hatch="//", label="expected"),
                Patch(color=_CALM, label=f"observed, |dev| < 2{_SIGMA}"),
                Patch(color=_WARN, label=f"2{_SIGMA} ≤ |dev| < 5{_SIGMA}"),
                Patch(color=_ALARM, label=f"|dev| ≥ 5{_SIGMA}"),
            ],
            loc="upper right",
            ncols=2,
            fontsize=8,
            frameon=False,
        )
        ax.invert_yaxis()  # the first group on top
        if timeline:
            _draw_timeline(fig.add_subplot(grid[1, :]), report)
        fig.subplots_adjust(
            left=0.12,
            right=0.98,
            top=1 - 0.95 / (height / _DPI),
            bottom=0.65 / (height / _DPI),
        )
        fig.savefig(path, dpi=_DPI, format="png")
    finally:
        plt.close(fig)
    return width, height


def _draw_timeline(ax: Any, report: MixtureReport) -> None:
    """Each group's observed share per bin of positions (solid), each segment's
    expected share (dashed, same colour) and the switches (vertical lines)."""
    import polars as pl
    from matplotlib.ticker import PercentFormatter

    assert report.timeline is not None
    group = report.group
    top = report.groups.sort("observed", descending=True).head(_TIMELINE_GROUPS)[group].to_list()
    timeline = report.timeline
    positions = sorted(timeline["position"].unique().to_list())
    end = positions[-1] + (positions[1] - positions[0] if len(positions) > 1 else 1)
    colours = [f"C{i}" for i in range(len(top))]
    for value, colour in zip(top, colours, strict=True):
        mine = timeline.filter(pl.col(group).is_null() if value is None else pl.col(group) == value)
        share = dict(zip(mine["position"].to_list(), mine["share"].to_list(), strict=True))
        ax.step(
            positions,
            [share.get(p, 0.0) for p in positions],
            where="post",
            color=colour,
            linewidth=1.4,
            label=_label(value),
        )
        if report.segment_expected is not None:
            expected = report.segment_expected.filter(
                pl.col(group).is_null() if value is None else pl.col(group) == value
            ).sort("start")
            starts = sorted(report.segment_expected["start"].unique().to_list())
            for start, p in zip(
                expected["start"].to_list(), expected["expected_share"].to_list(), strict=True
            ):
                later = [s for s in starts if s > start]
                stop = later[0] if later else end
                ax.hlines(p, max(start, positions[0]), stop, colors=colour, linestyles="--")
    for start, population in report.switches:
        ax.axvline(start, color="#333333", linewidth=1.0)
        ax.annotate(
            f"switch to {population[:8]}",
            (start, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(4, -12),
            textcoords="offset points",
            fontsize=8,
        )
    ax.set_xlim(positions[0], end)
    ax.set_ylim(0, None)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.set_xlabel("stream position (observed share per bin solid, expected per segment dashed)")
    ax.set_ylabel("share of draws")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", ncols=4, fontsize=8, frameon=False)


def _colour(sigma: float) -> str:
    size = abs(sigma)
    return _CALM if size < 2 else _WARN if size < 5 else _ALARM


def _sigma_text(sigma: float) -> str:
    return (
        f"{sigma:+.1f}{_SIGMA}"
        if math.isfinite(sigma)
        else (f"+∞{_SIGMA}" if sigma > 0 else f"-∞{_SIGMA}")
    )


def _clip(sigma: float) -> float:
    """An infinite deviation (a group that cannot be drawn, drawn) at the panel's edge."""
    return sigma if math.isfinite(sigma) else math.copysign(99.0, sigma)


def _label(value: object) -> str:
    text = "(null)" if value is None else str(value)
    return text if len(text) <= 16 else text[:15] + "…"


def _visual(size: float, symlog: bool) -> float:
    """Where a deviation of ``size`` sits on the panel's axis (linear up to 5)."""
    return size if not symlog or size <= 5 else 5 * (1 + math.log10(size / 5))
