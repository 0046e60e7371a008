"""Per-rank Gantt chart of a run's profile spans (docs/design.md §5, "Figures": per-rank timelines).

One row per rank, labelled ``rank r (role)`` with its busy fraction; one colour per phase. Time on a rank
not covered by any *work* span is shaded as a bubble (hatched grey); explicit idle spans (``idle``,
``wait*``: ``digenrl.runtime.observe.span_phases.is_idle_phase``) are drawn in grey with their own legend
entry. Spans that overlap on one rank (e.g. a background scoring thread beside generation) are stacked in
sub-lanes rather than painted over each other. ``iteration`` marker spans are not drawn as bars; they
give the dotted iteration boundaries. Spans carrying a fragment index are labelled ``f<i>`` when wide
enough (optionally ``f<i> v<policy_version>``, which makes TCSS's one-version lag visible).

Usage: ``python paper_figures/timeline.py RUN_DIR --out timeline.png [--iterations 1:3] [--versions]``
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from matplotlib.colors import to_rgb
from matplotlib.patches import Patch

from digenrl.runtime.observe.event_summary import union_length
from digenrl.runtime.observe.span_phases import Phase, is_idle_phase, is_work_phase
from paper_figures.logs import RunLog, load_run
from paper_figures.style import (
    BUBBLE_COLOR,
    BUBBLE_HATCH,
    DEFAULT_DPI,
    HELPER_GENERATE,
    IDLE_COLOR,
    PHASE_COLORS,
    bottom_legend,
    color_map,
    new_figure,
    save_png,
)

_PHASE_PALETTE = (
    "#17becf", "#bcbd22", "#d62728", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#dbdb8d",
)  # fmt: skip


def parse_iteration_window(text: str) -> tuple[int, int]:
    """``"3"`` -> (3, 3); ``"1:4"`` -> (1, 4), both ends inclusive."""
    try:
        parts = [int(p) for p in text.split(":")]
    except ValueError:
        raise ValueError(f"iterations={text!r} must look like 'K' or 'A:B' (integers)") from None
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2 or parts[0] > parts[1] or parts[0] < 0:
        raise ValueError(f"iterations={text!r} must look like 'K' or 'A:B' with 0 <= A <= B")
    return parts[0], parts[1]


def time_window(spans: Sequence[dict[str, Any]], iterations: tuple[int, int] | None) -> tuple[float, float]:
    """Time extent of the chosen iterations (their ``iteration`` markers if present, else all their spans,
    as in ``digenrl.runtime.observe.event_summary``); the whole log when ``iterations`` is None."""
    if not spans:
        raise ValueError("the run has no spans to draw")
    chosen = list(spans)
    if iterations is not None:
        lo, hi = iterations
        chosen = [s for s in spans if s.get("iteration") is not None and lo <= int(s["iteration"]) <= hi]
        if not chosen:
            present = sorted({int(s["iteration"]) for s in spans if s.get("iteration") is not None})
            raise ValueError(f"iterations={lo}:{hi} match no spans; the log has iterations {present}")
        chosen = [s for s in chosen if s["phase"] == Phase.ITERATION] or chosen
    return min(float(s["t_start"]) for s in chosen), max(float(s["t_end"]) for s in chosen)


def assign_lanes(intervals: Sequence[tuple[float, float]]) -> tuple[list[int], int]:
    """Greedy interval partitioning: each interval gets the lowest lane free at its start.

    Returns (lane per interval in input order, number of lanes). Sorting by start makes the lane count
    equal to the maximum overlap depth (the classic interval-colouring argument)."""
    order = sorted(range(len(intervals)), key=lambda i: (intervals[i][0], intervals[i][1]))
    lane_end: list[float] = []
    lanes = [0] * len(intervals)
    for i in order:
        start, end = intervals[i]
        for lane, busy_until in enumerate(lane_end):
            if busy_until <= start:
                lanes[i] = lane
                lane_end[lane] = end
                break
        else:
            lanes[i] = len(lane_end)
            lane_end.append(end)
    return lanes, max(1, len(lane_end))


def idle_gaps(intervals: Sequence[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    """Sub-intervals of ``[lo, hi]`` covered by none of ``intervals`` (the bubbles of one rank)."""
    gaps = []
    cursor = lo
    for start, end in sorted(intervals):
        if start > cursor:
            gaps.append((cursor, min(start, hi)))
        cursor = max(cursor, end)
        if cursor >= hi:
            break
    if cursor < hi:
        gaps.append((cursor, hi))
    return [(a, b) for a, b in gaps if b > a]


def fragment_label(span: dict[str, Any], show_versions: bool = False) -> str | None:
    """``f<i>`` (or ``f<i> v<policy_version>``) for spans that carry a fragment index, else None."""
    if span.get("fragment") is None:
        return None
    if show_versions and span.get("policy_version") is not None:
        return f"f{span['fragment']} v{span['policy_version']}"
    return f"f{span['fragment']}"


@dataclass
class RankRow:
    """What one Gantt row shows: the rank's spans in the window, clipped, with their sub-lanes and bubbles."""

    rank: int
    role: str
    spans: list[dict[str, Any]]
    clipped: list[tuple[float, float]]
    lanes: list[int]
    lane_count: int
    bubbles: list[tuple[float, float]]
    busy_fraction: float

    @property
    def label(self) -> str:
        return f"rank {self.rank} ({self.role})\nbusy {self.busy_fraction:.0%}"


def timeline_rows(
    run: RunLog, iterations: tuple[int, int] | None = None
) -> tuple[list[RankRow], float, float]:
    """One ``RankRow`` per rank (every rank that wrote a log, even if idle in the window), and the window.

    The busy fraction is the union of the rank's work spans in the window over the window length, the
    same definition as ``digenrl.runtime.observe.event_summary`` uses per iteration."""
    if not run.spans:
        raise ValueError(f"run '{run.path}' has no span records in events/rank<r>.jsonl")
    t0, t1 = time_window(run.spans, iterations)
    width = t1 - t0
    by_rank: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for span in run.spans:
        if span["phase"] != Phase.ITERATION and float(span["t_end"]) > t0 and float(span["t_start"]) < t1:
            by_rank[int(span["rank"])].append(span)
    rows = []
    for rank in sorted(set(run.roles) | set(by_rank)):
        spans = sorted(by_rank.get(rank, []), key=lambda s: float(s["t_start"]))
        clipped = [(max(float(s["t_start"]), t0), min(float(s["t_end"]), t1)) for s in spans]
        work = [iv for iv, s in zip(clipped, spans, strict=True) if is_work_phase(s["phase"])]
        lanes, lane_count = assign_lanes(clipped)
        role = run.roles.get(rank) or (str(spans[0]["role"]) if spans else "?")
        busy = union_length(work, t0, t1) / width if width > 0 else 0.0
        rows.append(RankRow(rank, role, spans, clipped, lanes, lane_count, idle_gaps(work, t0, t1), busy))
    return rows, t0, t1


def legend_phase(span: dict[str, Any]) -> str:
    """The legend entry of a span: its phase, with a TAG helper's generation (a trainer rank generating,
    ``extra.helper``) shown apart from the generator pool's."""
    if span["phase"] == Phase.GENERATE and (span.get("extra") or {}).get("helper"):
        return HELPER_GENERATE
    return str(span["phase"])


def plot_timeline(
    run: RunLog | str | Path,
    out_path: str | Path,
    *,
    iterations: tuple[int, int] | None = None,
    show_versions: bool = False,
    title: str | None = None,
    figsize: tuple[float, float] | None = None,
    dpi: int = DEFAULT_DPI,
    min_label_fraction: float = 0.025,
) -> Path:
    """Draw the Gantt chart of ``run`` (a ``RunLog`` or run directory) to ``out_path`` (PNG).

    Args:
        iterations: inclusive (first, last) iteration window; spans of any tag overlapping its time extent
            are drawn, clipped (with TCSS, iteration k+1's generation overlaps iteration k's training).
        show_versions: label fragments ``f<i> v<policy_version>`` instead of ``f<i>``.
        figsize: inches; default 11 wide and 0.55 in per rank.
        min_label_fraction: a fragment label is drawn only on bars at least this fraction of the window.
    """
    run = run if isinstance(run, RunLog) else load_run(run)
    rows, t0, t1 = timeline_rows(run, iterations)
    width = max(t1 - t0, 1e-9)
    # Legend order = order of first appearance (generate, score, train, ... reads like the schedule).
    drawn = sorted((s for row in rows for s in row.spans), key=lambda s: float(s["t_start"]))
    phases = list(dict.fromkeys(legend_phase(s) for s in drawn))
    colors = color_map([p for p in phases if not is_idle_phase(p)], PHASE_COLORS, palette=_PHASE_PALETTE)

    figure = new_figure(figsize or (11.0, max(2.4, 0.55 * len(rows) + 1.6)), dpi)
    axes = figure.add_subplot()
    for y, row in enumerate(rows):
        for gap_start, gap_end in row.bubbles:
            axes.broken_barh(
                [(gap_start - t0, gap_end - gap_start)], (y - 0.42, 0.84),
                facecolors="white", edgecolors=BUBBLE_COLOR, hatch=BUBBLE_HATCH, linewidth=0,
            )  # fmt: skip
        lane_height = 0.84 / row.lane_count
        for span, (start, end), lane in zip(row.spans, row.clipped, row.lanes, strict=True):
            idle = is_idle_phase(span["phase"])
            color = IDLE_COLOR if idle else colors[legend_phase(span)]
            bottom = y - 0.42 + lane * lane_height
            axes.broken_barh(
                [(start - t0, end - start)], (bottom, lane_height),
                facecolors=color, edgecolors="white", linewidth=0.4, hatch=".." if idle else None,
            )  # fmt: skip
            text = fragment_label(span, show_versions)
            if text is not None and (end - start) >= min_label_fraction * width:
                axes.text(
                    (start + end) / 2 - t0, bottom + lane_height / 2, text,
                    ha="center", va="center", fontsize=7, color=_text_color(color), clip_on=True,
                )  # fmt: skip

    _draw_iteration_boundaries(axes, run.spans, t0, t1)
    axes.set_yticks(range(len(rows)), [row.label for row in rows], fontsize=8)
    axes.set_ylim(len(rows) - 0.5, -0.5)
    axes.set_xlim(0, width)
    axes.set_xlabel(f"time since window start (s); window starts {t0:.3f} s after the clock origin")
    axes.grid(axis="x", color="#eeeeee", linewidth=0.6)
    axes.set_axisbelow(True)
    window = "all iterations" if iterations is None else f"iterations {iterations[0]}–{iterations[1]}"
    axes.set_title(title or f"{run.label}: {window}", fontsize=10, pad=14)

    handles = [Patch(facecolor=colors[p], label=p) for p in colors]
    handles += [Patch(facecolor=IDLE_COLOR, hatch="..", label=p) for p in phases if is_idle_phase(p)]
    handles.append(
        Patch(facecolor="white", edgecolor=BUBBLE_COLOR, hatch=BUBBLE_HATCH, label="bubble (no work)")
    )
    bottom_legend(figure, handles)
    return save_png(figure, out_path)


def _draw_iteration_boundaries(axes: Any, spans: Sequence[dict[str, Any]], t0: float, t1: float) -> None:
    """A dotted line and an ``it k`` tag where each iteration starts inside the window."""
    starts: dict[int, float] = {}
    markers = [s for s in spans if s["phase"] == Phase.ITERATION and s.get("iteration") is not None]
    for span in markers or [s for s in spans if s.get("iteration") is not None]:
        k = int(span["iteration"])
        starts[k] = min(starts.get(k, float("inf")), float(span["t_start"]))
    for k, start in sorted(starts.items()):
        if t0 <= start < t1:
            axes.axvline(start - t0, color="#555555", linestyle=":", linewidth=0.8)
            axes.text(
                start - t0, 1.0, f" it {k}", transform=axes.get_xaxis_transform(),
                ha="left", va="bottom", fontsize=7, color="#555555",
            )  # fmt: skip


def _text_color(background: str) -> str:
    """Black on light bars, white on dark ones (relative luminance, ITU-R BT.709 weights)."""
    r, g, b = to_rgb(background)
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.5 else "white"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="output PNG path")
    parser.add_argument(
        "--iterations", type=parse_iteration_window, default=None, help="K or A:B (inclusive)"
    )
    parser.add_argument("--versions", action="store_true", help="label fragments with their policy version")
    args = parser.parse_args(argv)
    try:
        print(plot_timeline(args.run_dir, args.out, iterations=args.iterations, show_versions=args.versions))
    except ValueError as error:  # bad input: a usage error, not a traceback
        parser.error(str(error))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
