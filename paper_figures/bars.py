"""One panel of labelled bars, shared by the throughput and ablation figures so both read the same way:
solid bars are measured, hatched bars simulated, optional error bars, and a ``×`` ratio over each bar
relative to a reference bar of the panel."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from paper_figures.style import SIMULATED_HATCH


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    color: str
    simulated: bool = False
    std: float | None = None
    ratio: float | None = None  # value / reference value; None = no label


def draw_bars(axes: Any, bars: Sequence[Bar], *, ylabel: str, title: str) -> None:
    """Bars at x = 0..n-1 with their tick labels, ratio labels above, y from 0 with head-room."""
    if not bars:
        raise ValueError(f"panel '{title}' has no bars")
    xs = list(range(len(bars)))
    axes.bar(
        xs,
        [b.value for b in bars],
        color=[b.color for b in bars],
        edgecolor="black",
        linewidth=0.6,
        hatch=[SIMULATED_HATCH if b.simulated else None for b in bars],
        yerr=[b.std or 0.0 for b in bars] if any(b.std for b in bars) else None,
        capsize=3,
    )
    top = max(b.value + (b.std or 0.0) for b in bars)
    for x, bar in zip(xs, bars, strict=True):
        if bar.ratio is not None:
            axes.text(
                x, bar.value + (bar.std or 0.0) + 0.02 * max(top, 1e-12), f"{bar.ratio:.2f}×",
                ha="center", va="bottom", fontsize=8,
            )  # fmt: skip
    axes.set_xticks(xs, [b.label for b in bars], rotation=25, ha="right", fontsize=8)
    axes.set_ylim(0, top * 1.15 if top > 0 else 1.0)
    axes.set_ylabel(ylabel, fontsize=9)
    axes.set_title(title, fontsize=10)
    axes.grid(axis="y", color="#eeeeee", linewidth=0.6)
    axes.set_axisbelow(True)


def metric_label(metric: str) -> str:
    return {"samples_per_s": "trained samples / s", "images_per_gpu_s": "images / GPU / s"}.get(
        metric, metric
    )
