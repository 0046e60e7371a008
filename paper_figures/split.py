"""Sensitivity to the generator:trainer split (docs/design.md §5), one panel per (model, GPU total).

Rows: ``experiment=split`` with ``generators`` and ``trainers`` columns (``gpus`` if scorer GPUs make the
total larger than their sum). x is the generator share ``g / (g + t)``, ticks read ``g:t``; one line per
system; the best split of each series is starred, since picking it is what the planner must get right.

Usage: ``python paper_figures/split.py TABLE.csv|json --out split.png``
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from paper_figures.bars import metric_label
from paper_figures.cli import table_figure_main
from paper_figures.lines import draw_system_lines, legend_handles
from paper_figures.logs import ResultRow, experiment_rows
from paper_figures.style import DEFAULT_DPI, bottom_legend, label_axes, new_figure, save_png


def generator_share(row: ResultRow) -> float:
    """Fraction of the generator+trainer GPUs that generate."""
    assert row.generators is not None and row.trainers is not None  # guaranteed for split rows by logs.py
    return row.generators / (row.generators + row.trainers)


def total_gpus(row: ResultRow) -> int:
    assert row.generators is not None and row.trainers is not None
    return row.gpus if row.gpus is not None else row.generators + row.trainers


def plot_split(
    rows: Sequence[ResultRow] | str | Path,
    out_path: str | Path,
    *,
    metric: str | None = None,
    figsize: tuple[float, float] | None = None,
    dpi: int = DEFAULT_DPI,
) -> Path:
    """Lines of the ``split`` rows of ``rows`` (or of the table at that path)."""
    split, metric = experiment_rows(rows, "split", metric)
    panels_keys = list(dict.fromkeys((row.model, total_gpus(row)) for row in split))

    figure = new_figure(figsize or (max(5.2, 3.8 * len(panels_keys)), 4.0), dpi)
    panels = figure.subplots(1, len(panels_keys), squeeze=False)[0]
    for axes, (model, total) in zip(panels, panels_keys, strict=True):
        panel_rows = [r for r in split if r.model == model and total_gpus(r) == total]
        drawn = draw_system_lines(axes, panel_rows, metric, generator_share)
        for points in drawn.values():
            best_x, best_y = max(points, key=lambda p: p[1])
            axes.plot([best_x], [best_y], marker="*", markersize=13, color="gold", markeredgecolor="black",
                      linestyle="none", zorder=5)  # fmt: skip
        ticks = {generator_share(r): f"{r.generators}:{r.trainers}" for r in panel_rows}
        axes.set_xticks(sorted(ticks), [ticks[x] for x in sorted(ticks)], fontsize=8)
        axes.set_ylim(bottom=0)
        label_axes(
            axes,
            xlabel="generator GPUs : trainer GPUs",
            ylabel=metric_label(metric),
            title=f"{model} · {total} GPUs",
        )
    figure.suptitle("Generator:trainer split (★ best per system)", fontsize=11)
    handles = legend_handles(split)
    bottom_legend(figure, handles)
    return save_png(figure, out_path)


def main(argv: Sequence[str] | None = None) -> int:
    return table_figure_main(__doc__, plot_split, argv)


if __name__ == "__main__":
    raise SystemExit(main())
