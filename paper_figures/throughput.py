"""Throughput bars per model × system from a results table (docs/design.md §5, "Figures": throughput bars
per system and model). One panel per model; systems in the fixed baseline-first order; simulated rows
hatched; each bar labelled with its ratio to the baseline system of the same panel (same source —
measured against measured, simulated against simulated — falling back to the other source when only that
exists).

Usage: ``python paper_figures/throughput.py TABLE.csv|json --out throughput.png [--baseline colocated-sync]``
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from paper_figures.bars import Bar, draw_bars, metric_label
from paper_figures.logs import ResultRow, choose_metric, read_results_table, rows_for
from paper_figures.style import (
    DEFAULT_DPI,
    SYSTEM_COLORS,
    bottom_legend,
    color_map,
    new_figure,
    ordered_systems,
    save_png,
    source_legend_handles,
)

DEFAULT_BASELINE = "colocated-sync"


def unique_rows(rows: Sequence[ResultRow], key_fields: Sequence[str]) -> dict[tuple, ResultRow]:
    """Rows keyed by ``key_fields``; two rows with one key are ambiguous, so that is an error."""
    keyed: dict[tuple, ResultRow] = {}
    for row in rows:
        key = tuple(getattr(row, f) for f in key_fields)
        if key in keyed:
            named = dict(zip(key_fields, key, strict=True))
            raise ValueError(f"two rows for {named}: {keyed[key].origin} and {row.origin}")
        keyed[key] = row
    return keyed


def baseline_ratio(value: float, source: str, baselines: dict[str, float]) -> float | None:
    """``value`` over the baseline's value of the same source, else of the other source; None if none."""
    reference = baselines.get(source, next(iter(baselines.values()), None))
    return value / reference if reference else None


def plot_throughput(
    rows: Sequence[ResultRow] | str | Path,
    out_path: str | Path,
    *,
    baseline: str = DEFAULT_BASELINE,
    metric: str | None = None,
    figsize: tuple[float, float] | None = None,
    dpi: int = DEFAULT_DPI,
) -> Path:
    """Bars of the ``main`` rows of ``rows`` (or of the table at that path). See the module docstring."""
    rows = read_results_table(rows) if isinstance(rows, str | Path) else list(rows)
    main = rows_for(rows, "main")
    if not main:
        raise ValueError(
            "the table has no 'main' rows (experiment blank or 'main') for the throughput figure"
        )
    metric = choose_metric(main, metric)
    keyed = unique_rows(main, ("model", "system", "source"))
    models = list(dict.fromkeys(row.model for row in main))
    colors = color_map(ordered_systems(r.system for r in main), SYSTEM_COLORS)

    figure = new_figure(figsize or (max(4.0, 3.4 * len(models)), 3.8), dpi)
    panels = figure.subplots(1, len(models), squeeze=False)[0]
    for axes, model in zip(panels, models, strict=True):
        model_rows = [r for r in main if r.model == model]
        baselines = {r.source: r.throughput[metric] for r in model_rows if r.system == baseline}
        bars = []
        for system in ordered_systems(r.system for r in model_rows):
            for source in ("measured", "simulated"):
                row = keyed.get((model, system, source))
                if row is None:
                    continue
                value = row.throughput[metric]
                bars.append(
                    Bar(
                        label=system,
                        value=value,
                        color=colors[system],
                        simulated=row.is_simulated,
                        std=row.std.get(metric),
                        ratio=baseline_ratio(value, source, baselines),
                    )
                )
        gpus = {r.gpus for r in model_rows}
        suffix = f" · {gpus.pop()} GPUs" if len(gpus) == 1 and None not in gpus else ""
        suffix += "" if baselines else f"\n(no {baseline} row: no ratios)"
        draw_bars(axes, bars, ylabel=metric_label(metric), title=f"{model}{suffix}")
    figure.suptitle(f"Throughput (ratio vs {baseline})", fontsize=11)
    bottom_legend(figure, source_legend_handles())
    return save_png(figure, out_path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="output PNG path")
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="system the ratio labels divide by")
    parser.add_argument(
        "--metric", default=None, help="samples_per_s | images_per_gpu_s (default: first present)"
    )
    args = parser.parse_args(argv)
    try:
        print(plot_throughput(args.table, args.out, baseline=args.baseline, metric=args.metric))
    except ValueError as error:  # bad input: a usage error, not a traceback
        parser.error(str(error))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
