"""The mixture report drawn: expected against observed share per group.

One row per group (the largest expected shares when there are many): a hollow
bar for the expected share, a filled bar for the observed one, coloured by how
far it deviates, and the deviation in sigma written beside it. Matplotlib with
its non-interactive Agg backend, so it runs on servers without a display.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dataset_rt.mixture import MixtureReport

#: Inches of figure per group row, and around the rows (title, axis, legend).
_ROW_INCHES = 0.42
_FRAME_INCHES = 2.2
_WIDTH_INCHES = 10.0
_DPI = 100

#: Deviation colours: within 2 sigma, within 5, beyond.
_CALM, _WARN, _ALARM = "#2f7d4f", "#d08a1e", "#c0392b"

_SIGMA = "\N{GREEK SMALL LETTER SIGMA}"


def figure_size(groups: int) -> tuple[int, int]:
    """The PNG's (width, height) in pixels for ``groups`` drawn rows."""
    height = _FRAME_INCHES + _ROW_INCHES * max(groups, 1)
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

    width, height = figure_size(shown.height)
    fig, (ax, dev) = plt.subplots(
        1,
        2,
        figsize=(width / _DPI, height / _DPI),
        dpi=_DPI,
        sharey=True,
        gridspec_kw={"width_ratios": [3, 1.15], "wspace": 0.06},
    )
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
