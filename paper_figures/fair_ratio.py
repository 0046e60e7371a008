"""DigenRL ÷ the best fair baseline, per panel, grouped by regime (issue 34 item 7), from a throughput table
of ``experiments/simulate.py throughput`` (its ``ratio_vs_best_fair_baseline`` and
``mechanisms_ratio_vs_best_fair_baseline`` columns; experiments/results/README.md, "Throughput tables").

One horizontal bar group per panel (``<scenario> @ <profile>``), panels grouped by the regime of their
GPUs (identical / mixed) and sorted by scenario; three bars per panel:

* ``digenrl`` — the planner's choice on-policy: never below 1, since DigenRL's plan space contains every
  baseline plan (a ratio of exactly 1 is a tie reached by falling back to a baseline);
* ``digenrl s=1`` — the planner's choice with TCSS allowed, over the best baseline of staleness ≤ 1;
* ``mechanisms`` — the best plan that uses at least one mechanism on-policy: below 1 where the mechanisms
  lose to the best fair baseline.

A dashed line marks 1.0 (a tie). Usage: ``python paper_figures/fair_ratio.py TABLE.csv --out fig.png``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from paper_figures.logs import ResultRow, read_results_table, rows_for
from paper_figures.style import DEFAULT_DPI, bottom_legend, new_figure, save_png

RATIO = "ratio_vs_best_fair_baseline"
MECHANISMS_RATIO = "mechanisms_ratio_vs_best_fair_baseline"
SERIES = (
    ("digenrl", "digenrl (on-policy)", "#1f77b4"),
    ("digenrl s=1", "digenrl s=1 (TCSS allowed)", "#2ca02c"),
    ("mechanisms", "best plan with a mechanism (on-policy)", "#ff7f0e"),
)


def _number(value: object) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def panel_ratios(rows: Sequence[ResultRow]) -> list[tuple[str, str, dict[str, float]]]:
    """(regime, panel, {series: ratio}) per panel of the ``main`` rows that carry the fair-ratio columns;
    the regime is the GPU part of the row's ``regime`` column (identical / mixed)."""
    out: dict[str, tuple[str, dict[str, float]]] = {}
    for row in rows_for(rows, "main"):
        if row.system not in ("digenrl", "digenrl s=1"):
            continue
        ratio = _number(row.extra.get(RATIO))
        if ratio is None:
            continue
        regime = str(row.extra.get("regime", "")).split(";")[0] or "unlabelled"
        _, ratios = out.setdefault(row.model, (regime, {}))
        ratios[row.system] = ratio
        mechanisms = _number(row.extra.get(MECHANISMS_RATIO))
        if row.system == "digenrl" and mechanisms is not None:
            ratios["mechanisms"] = mechanisms
    return sorted(((regime, panel, ratios) for panel, (regime, ratios) in out.items()), key=lambda t: t[:2])


def fair_ratio_figure(rows: Sequence[ResultRow] | str | Path, *, dpi: int = DEFAULT_DPI) -> Figure:
    rows = read_results_table(rows) if isinstance(rows, str | Path) else list(rows)
    panels = panel_ratios(rows)
    if not panels:
        raise ValueError(f"no 'main' digenrl rows with a {RATIO} column: not a fair-baseline table")
    height = 0.28 * len(SERIES) * len(panels) + 1.6
    figure = new_figure((7.5, height), dpi)
    axes = figure.subplots()
    labels, ticks = [], []
    y = 0.0
    regime_before = None
    for regime, panel, ratios in panels:
        if regime_before is not None and regime != regime_before:
            axes.axhline(y - 0.45, color="grey", linewidth=0.6)
        regime_before = regime
        for i, (key, _, color) in enumerate(SERIES):
            value = ratios.get(key)
            if value is None:
                continue
            offset = y + (i - 1) * 0.27
            axes.barh(offset, value, height=0.25, color=color, edgecolor="black", linewidth=0.4)
            axes.text(value, offset, f" {value:.2f}", va="center", fontsize=6)
        labels.append(f"[{regime}] {panel}")
        ticks.append(y)
        y += 1.0
    axes.axvline(1.0, color="black", linestyle="--", linewidth=0.8)
    axes.set_yticks(ticks, labels, fontsize=7)
    axes.invert_yaxis()
    axes.set_xlabel("samples/s ÷ best fair baseline of equal or lower staleness")
    lowest = min(v for _, _, r in panels for v in r.values())
    highest = max(v for _, _, r in panels for v in r.values())
    axes.set_xlim(min(0.8, lowest - 0.05), max(1.2, highest + 0.1))
    figure.suptitle("DigenRL ÷ best fair baseline, per panel and regime (simulated)", fontsize=10)
    handles = [Patch(facecolor=color, edgecolor="black", label=label) for _, label, color in SERIES]
    bottom_legend(figure, handles, inches_per_entry=2.5)
    return figure


def plot_fair_ratio(
    rows: Sequence[ResultRow] | str | Path, out_path: str | Path, *, dpi: int = DEFAULT_DPI
) -> Path:
    """:func:`fair_ratio_figure` written to ``out_path`` (PNG)."""
    return save_png(fair_ratio_figure(rows, dpi=dpi), out_path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="output PNG path")
    args = parser.parse_args(argv)
    try:
        print(plot_fair_ratio(args.table, args.out))
    except ValueError as error:
        parser.error(str(error))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
