"""One panel of labelled bars, shared by the throughput and ablation figures so both read the same way:
solid bars are measured, hatched bars simulated, optional error bars (a std, or the run-to-run min–max with
each run as a dot), an optional upper bound drawn as a dashed outline, and a ``×`` ratio over each bar
relative to a reference bar of the panel."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from paper_figures.style import SIMULATED_HATCH

BOUND_EDGE = "#333333"


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    color: str
    simulated: bool = False
    err: tuple[float, float] | None = None  # (below, above) the value: ± a std, or to the runs' min and max
    ratio: float | None = None  # value / reference value; None = no label
    points: tuple[float, ...] = ()  # individual runs, drawn as dots on the bar
    bound: float | None = None  # an upper bound of the value (bubble-free), a dashed outline from 0
    note: str | None = None  # short text written up the bar's foot (e.g. "40% stale")

    @property
    def top(self) -> float:
        """The highest thing drawn for this bar, so labels above it never overlap it."""
        return max(self.value + (self.err[1] if self.err else 0.0), self.bound or 0.0, *self.points, 0.0)


def spread_err(value: float, runs: Sequence[float]) -> tuple[float, float] | None:
    """Error-bar extents from ``value`` down to the smallest and up to the largest run (None for < 2 runs)."""
    if len(runs) < 2:
        return None
    return max(value - min(runs), 0.0), max(max(runs) - value, 0.0)


def draw_bars(
    axes: Any,
    bars: Sequence[Bar],
    *,
    ylabel: str | None,
    title: str,
    positions: Sequence[float] | None = None,
    width: float = 0.8,
    ticks: tuple[Sequence[float], Sequence[str]] | None = None,
    tick_labels: bool = True,
    fontsize: float = 8,
) -> None:
    """Bars at ``positions`` (default 0..n-1), ratio labels above, y from 0 with head-room for the labels.

    ``ticks`` (positions, labels) replaces the default of one tick per bar labelled with its label (several
    bars may share a slot); ``tick_labels=False`` leaves them unlabelled (a grid panel whose neighbour below
    labels them)."""
    if not bars:
        raise ValueError(f"panel '{title}' has no bars")
    xs = list(positions) if positions is not None else list(range(len(bars)))
    if len(xs) != len(bars):
        raise ValueError(f"panel '{title}': {len(xs)} positions for {len(bars)} bars")
    bounds = [(x, b.bound) for x, b in zip(xs, bars, strict=True) if b.bound is not None]
    if bounds:  # behind the bars: the outline shows the head-room a perfect schedule would have
        axes.bar([x for x, _ in bounds], [v for _, v in bounds], width=width, fill=False,
                 edgecolor=BOUND_EDGE, linestyle="--", linewidth=0.9, zorder=1)  # fmt: skip
    axes.bar(
        xs,
        [b.value for b in bars],
        width=width,
        color=[b.color for b in bars],
        edgecolor="black",
        linewidth=0.6,
        hatch=[SIMULATED_HATCH if b.simulated else None for b in bars],
        zorder=2,
    )
    spread = [(x, b) for x, b in zip(xs, bars, strict=True) if b.err is not None]
    if spread:  # only bars that have an error bar (a zero-length one would still draw its caps)
        axes.errorbar(
            [x for x, _ in spread], [b.value for _, b in spread], fmt="none", ecolor="black", elinewidth=1.0,
            yerr=[[b.err[0] for _, b in spread], [b.err[1] for _, b in spread]], capsize=3, zorder=3,
        )  # fmt: skip
    for x, bar in zip(xs, bars, strict=True):
        if bar.points:
            axes.plot([x] * len(bar.points), bar.points, linestyle="none", marker="o", markersize=2.5,
                      color="black", zorder=3)  # fmt: skip
    top = max(b.top for b in bars)
    for x, bar in zip(xs, bars, strict=True):
        if bar.ratio is not None:
            axes.text(
                x, bar.top + 0.02 * max(top, 1e-12), f"{bar.ratio:.2f}×",
                ha="center", va="bottom", fontsize=fontsize - 1, zorder=4,
            )  # fmt: skip
        if bar.note and bar.value > 0.3 * top:
            axes.text(x, 0.03 * top, bar.note, rotation=90, ha="center", va="bottom", fontsize=fontsize - 1,
                      color="white", zorder=4)  # fmt: skip
    tick_xs, labels = ticks if ticks is not None else (xs, [b.label for b in bars])
    axes.set_xticks(list(tick_xs), list(labels) if tick_labels else [""] * len(tick_xs))
    if tick_labels:
        axes.tick_params(axis="x", labelsize=fontsize, labelrotation=30)
        for label in axes.get_xticklabels():
            label.set_horizontalalignment("right")
            label.set_rotation_mode("anchor")
    axes.tick_params(axis="y", labelsize=fontsize)
    # no tick at the very top: in a grid its label would meet the bottom label of the panel above
    axes.yaxis.set_major_locator(MaxNLocator(nbins="auto", prune="upper"))
    axes.set_xlim(min(*xs, *tick_xs) - 0.6, max(*xs, *tick_xs) + 0.6)
    upper = top * 1.16 if top > 0 else 1.0
    axes.set_ylim(0, upper)
    # no tick label at the very top edge: in a grid it would touch the bottom label of the panel above
    axes.set_yticks([t for t in axes.get_yticks() if 0 <= t <= 0.97 * upper])
    if ylabel:
        axes.set_ylabel(ylabel, fontsize=fontsize + 1)
    axes.set_title(title, fontsize=fontsize + 1)
    axes.grid(axis="y", color="#eeeeee", linewidth=0.6)
    axes.set_axisbelow(True)


def bound_legend_handle(label: str = "bubble-free bound") -> Patch:
    return Patch(facecolor="none", edgecolor=BOUND_EDGE, linestyle="--", label=label)


def metric_label(metric: str) -> str:
    return {"samples_per_s": "trained samples / s", "images_per_gpu_s": "images / GPU / s"}.get(
        metric, metric
    )
