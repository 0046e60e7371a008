"""Throughput vs GPU count, one line per system, one panel per model (docs/design.md §5, "Figures":
scaling with the GPU count). Rows: ``experiment=scaling`` with a ``gpus`` column. The x axis is log2
(GPU counts double); a dotted grey line per panel shows ideal linear scaling from the highest throughput
at the smallest GPU count.

Usage: ``python paper_figures/scaling.py TABLE.csv|json --out scaling.png``
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


def plot_scaling(
    rows: Sequence[ResultRow] | str | Path,
    out_path: str | Path,
    *,
    metric: str | None = None,
    figsize: tuple[float, float] | None = None,
    dpi: int = DEFAULT_DPI,
) -> Path:
    """Lines of the ``scaling`` rows of ``rows`` (or of the table at that path)."""
    scaling, metric = experiment_rows(rows, "scaling", metric)
    models = list(dict.fromkeys(row.model for row in scaling))

    figure = new_figure(figsize or (max(5.2, 3.8 * len(models)), 4.0), dpi)
    panels = figure.subplots(1, len(models), squeeze=False)[0]
    for axes, model in zip(panels, models, strict=True):
        model_rows = [r for r in scaling if r.model == model]
        drawn = draw_system_lines(axes, model_rows, metric, lambda r: float(r.gpus))
        gpu_counts = sorted({float(r.gpus) for r in model_rows})
        smallest = gpu_counts[0]
        starts = [pts[0][1] for pts in drawn.values() if pts[0][0] == smallest]
        if len(gpu_counts) > 1 and starts:
            best = max(starts)
            axes.plot(gpu_counts, [best * g / smallest for g in gpu_counts], color="#999999", linestyle=":",
                      linewidth=1.0, label="linear")  # fmt: skip
        axes.set_xscale("log", base=2)
        axes.set_xticks(gpu_counts, [f"{g:g}" for g in gpu_counts])
        axes.minorticks_off()
        axes.set_ylim(bottom=0)
        label_axes(axes, xlabel="GPUs", ylabel=metric_label(metric), title=model)
    figure.suptitle("Scaling with GPU count (dotted: linear)", fontsize=11)
    handles = legend_handles(scaling)
    bottom_legend(figure, handles)
    return save_png(figure, out_path)


def main(argv: Sequence[str] | None = None) -> int:
    return table_figure_main(__doc__, plot_scaling, argv)


if __name__ == "__main__":
    raise SystemExit(main())
