"""Throughput-vs-x lines per system, shared by the scaling and split figures: one colour per system,
measured = solid line with filled markers, simulated = dashed line with hollow markers."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from matplotlib.lines import Line2D

from paper_figures.logs import ResultRow
from paper_figures.style import SYSTEM_COLORS, color_map, ordered_systems


def draw_system_lines(
    axes: Any, rows: Sequence[ResultRow], metric: str, x_of: Callable[[ResultRow], float]
) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """Plot every (system, source) series of ``rows`` over ``x_of(row)``; returns the sorted points drawn.

    Two rows of one series at the same x are ambiguous, so that is an error naming both rows."""
    series: dict[tuple[str, str], dict[float, ResultRow]] = defaultdict(dict)
    for row in rows:
        points = series[(row.system, row.source)]
        x = x_of(row)
        if x in points:
            raise ValueError(
                f"two rows for system={row.system!r} source={row.source!r} at x={x:g}: "
                f"{points[x].origin} and {row.origin}"
            )
        points[x] = row
    colors = color_map(ordered_systems(r.system for r in rows), SYSTEM_COLORS)
    drawn = {}
    for system in ordered_systems(r.system for r in rows):
        for source in ("measured", "simulated"):
            points = series.get((system, source))
            if not points:
                continue
            xs = sorted(points)
            ys = [points[x].throughput[metric] for x in xs]
            errors = [points[x].std.get(metric, 0.0) for x in xs]
            simulated = source == "simulated"
            axes.errorbar(
                xs, ys, yerr=errors if any(errors) else None, color=colors[system],
                linestyle="--" if simulated else "-", marker="o", markersize=5, capsize=3,
                markerfacecolor="white" if simulated else colors[system], linewidth=1.4,
            )  # fmt: skip
            drawn[(system, source)] = list(zip(xs, ys, strict=True))
    return drawn


def legend_handles(rows: Sequence[ResultRow]) -> list[Line2D]:
    """One entry per system (its colour) plus two explaining solid/measured and dashed/simulated."""
    systems = ordered_systems(r.system for r in rows)
    colors = color_map(systems, SYSTEM_COLORS)
    handles = [Line2D([], [], color=colors[s], marker="o", label=s) for s in systems]
    handles.append(Line2D([], [], color="black", linestyle="-", marker="o", label="measured"))
    handles.append(
        Line2D([], [], color="black", linestyle="--", marker="o", markerfacecolor="white", label="simulated")
    )
    return handles
