"""Ablation bars: separate-sync → +GAP → +TSP → +TAG → +TCSS (docs/design.md §3, §5), one panel per model.

Rows are the ``experiment=ablation`` rows of a results table; their ``system`` names a cumulative step:
``separate-sync``, ``+GAP``, ``+TSP``, ``+TAG``, ``+TCSS`` (case-insensitive, the ``+`` optional). Each bar
is labelled with its speed-up over the separate-sync bar of the same panel and source; missing steps are
left out (not drawn as zero). Simulated rows are hatched.

Usage: ``python paper_figures/ablation.py TABLE.csv|json --out ablation.png``
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from paper_figures.bars import Bar, draw_bars, metric_label
from paper_figures.cli import table_figure_main
from paper_figures.logs import ResultRow, experiment_rows
from paper_figures.style import (
    DEFAULT_DPI,
    SYSTEM_COLORS,
    bottom_legend,
    new_figure,
    save_png,
    source_legend_handles,
)
from paper_figures.throughput import baseline_ratio, unique_rows

ABLATION_STEPS = ("separate-sync", "+GAP", "+TSP", "+TAG", "+TCSS")
# separate-sync keeps its system colour; the mechanisms darken step by step towards DigenRL's blue.
STEP_COLORS = (SYSTEM_COLORS["separate-sync"], "#c6dbef", "#9ecae1", "#6baed6", "#2171b5")


def ablation_step(system: str) -> str:
    """Canonical step label of an ablation row's ``system`` value."""
    wanted = system.strip().lower().removeprefix("+")
    for step in ABLATION_STEPS:
        if step.lower().removeprefix("+") == wanted:
            return step
    raise ValueError(f"ablation row system={system!r}; allowed: {list(ABLATION_STEPS)}")


def plot_ablation(
    rows: Sequence[ResultRow] | str | Path,
    out_path: str | Path,
    *,
    metric: str | None = None,
    figsize: tuple[float, float] | None = None,
    dpi: int = DEFAULT_DPI,
) -> Path:
    """Bars of the ``ablation`` rows of ``rows`` (or of the table at that path)."""
    ablation, metric = experiment_rows(rows, "ablation", metric)
    # Canonical step names, so '+gap' and 'GAP' are one step (and two such rows are ambiguous).
    canonical = [replace(row, system=ablation_step(row.system)) for row in ablation]
    keyed = unique_rows(canonical, ("model", "system", "source"))
    models = list(dict.fromkeys(row.model for row in ablation))

    figure = new_figure(figsize or (max(4.0, 3.6 * len(models)), 3.8), dpi)
    panels = figure.subplots(1, len(models), squeeze=False)[0]
    for axes, model in zip(panels, models, strict=True):
        baselines = {
            source: keyed[(model, ABLATION_STEPS[0], source)].throughput[metric]
            for source in ("measured", "simulated")
            if (model, ABLATION_STEPS[0], source) in keyed
        }
        bars = []
        for step, color in zip(ABLATION_STEPS, STEP_COLORS, strict=True):
            for source in ("measured", "simulated"):
                row = keyed.get((model, step, source))
                if row is None:
                    continue
                value = row.throughput[metric]
                ratio = baseline_ratio(value, source, baselines)
                bars.append(Bar(step, value, color, row.is_simulated, row.std.get(metric), ratio))
        title = model if baselines else f"{model}\n(no separate-sync row: no ratios)"
        draw_bars(axes, bars, ylabel=metric_label(metric), title=title)
    figure.suptitle("Ablation (speed-up vs separate-sync)", fontsize=11)
    bottom_legend(figure, source_legend_handles())
    return save_png(figure, out_path)


def main(argv: Sequence[str] | None = None) -> int:
    return table_figure_main(__doc__, plot_ablation, argv)


if __name__ == "__main__":
    raise SystemExit(main())
