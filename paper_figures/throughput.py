"""Throughput bars per model × system from a results table (docs/design.md §5, "Figures": throughput bars
per system and model). A grid of panels, one per model (per scenario on one profile for the tables of
``experiments/simulate.py throughput``: a row per profile, a column per scenario), each on its own y
scale; systems in the fixed baseline-first order at the same x in every panel, coloured per system (legend
below); simulated rows hatched; each bar labelled with its ratio to the baseline system of the same panel
(same source — measured against measured, simulated against simulated — falling back to the other source when
only that exists).

Usage: ``python paper_figures/throughput.py TABLE.csv|json --out throughput.png [--baseline colocated-sync]``
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

from paper_figures.bars import Bar, draw_bars, metric_label
from paper_figures.logs import SOURCES, ResultRow, choose_metric, read_results_table, rows_for
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
GRID_COLUMNS = 4


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


def panel_model(row: ResultRow) -> str:
    """The column a row belongs to: its ``scenario`` (one model can have several workloads, e.g. LoRA and
    full fine-tuning of FLUX.1-dev) when the table has one, else its ``model_name``; "" when neither."""
    return str(row.extra.get("scenario") or row.extra.get("model_name") or "")


def panel_grid(rows: Sequence[ResultRow]) -> dict[str, tuple[int, int]]:
    """Grid cell (row, column) of each ``model`` panel key.

    Tables from ``experiments/simulate.py throughput`` name a panel ``<scenario> @ <profile>`` and carry the
    ``scenario`` (or ``model_name``) and ``profile`` columns: then one grid row per profile and one column per
    scenario, so a column compares a workload across clusters and a row reads one cluster. Other tables:
    panels in table order, wrapped at ``GRID_COLUMNS`` per row."""
    keys = list(dict.fromkeys(row.model for row in rows))
    if all(panel_model(row) and row.extra.get("profile") for row in rows):
        cells = {row.model: (str(row.extra["profile"]), panel_model(row)) for row in rows}
        profiles = list(dict.fromkeys(profile for profile, _ in cells.values()))
        models = list(dict.fromkeys(model for _, model in cells.values()))
        return {k: (profiles.index(cells[k][0]), models.index(cells[k][1])) for k in keys}
    return {k: divmod(i, GRID_COLUMNS) for i, k in enumerate(keys)}


def panel_title(model_rows: Sequence[ResultRow], baseline: str, has_baseline: bool) -> str:
    """``<model>`` (two lines when the key is ``<model> @ <profile>``) and the GPU count when one."""
    key = model_rows[0].model
    name, profile = panel_model(model_rows[0]), model_rows[0].extra.get("profile")
    title = f"{name}\n{profile}" if name and profile else key
    gpus = {r.gpus for r in model_rows}
    title += f" · {gpus.pop()} GPUs" if len(gpus) == 1 and None not in gpus else ""
    return title + ("" if has_baseline else f"\n(no {baseline} row: no ratios)")


def throughput_figure(
    rows: Sequence[ResultRow] | str | Path,
    *,
    baseline: str = DEFAULT_BASELINE,
    metric: str | None = None,
    figsize: tuple[float, float] | None = None,
    dpi: int = DEFAULT_DPI,
) -> Figure:
    """Bars of the ``main`` rows of ``rows`` (or of the table at that path). See the module docstring."""
    rows = read_results_table(rows) if isinstance(rows, str | Path) else list(rows)
    main = rows_for(rows, "main")
    if not main:
        raise ValueError(
            "the table has no 'main' rows (experiment blank or 'main') for the throughput figure"
        )
    metric = choose_metric(main, metric)
    keyed = unique_rows(main, ("model", "system", "source"))
    grid = panel_grid(main)
    n_rows = 1 + max(r for r, _ in grid.values())
    n_cols = 1 + max(c for _, c in grid.values())
    systems = ordered_systems(r.system for r in main)
    colors = color_map(systems, SYSTEM_COLORS)
    # Every panel puts a system at the same x (a missing one leaves a gap), so one label row serves a column.
    slot = {system: float(i) for i, system in enumerate(systems)}
    # Measured and simulated rows of one system share its slot as two half-width bars.
    shared = len({(r.model, r.system) for r in main}) < len(main)
    panel_width = max(2.4, 0.5 * len(systems) + 0.6)

    figure = new_figure(figsize or (max(4.0, panel_width * n_cols + 0.4), 2.5 * n_rows + 1.3), dpi)
    panels = figure.subplots(n_rows, n_cols, squeeze=False)
    for model, (r, c) in grid.items():
        axes = panels[r][c]
        model_rows = [row for row in main if row.model == model]
        baselines = {row.source: row.throughput[metric] for row in model_rows if row.system == baseline}
        bars, positions = [], []
        for system in ordered_systems(row.system for row in model_rows):
            sources = [s for s in SOURCES if (model, system, s) in keyed]
            offsets = [-0.2, 0.2] if len(sources) == 2 else [0.0]
            for offset, source in zip(offsets, sources, strict=True):
                row = keyed[(model, system, source)]
                value = row.throughput[metric]
                std = row.std.get(metric)
                bars.append(
                    Bar(
                        label=system,
                        value=value,
                        color=colors[system],
                        simulated=row.is_simulated,
                        err=(std, std) if std else None,
                        ratio=baseline_ratio(value, source, baselines),
                    )
                )
                positions.append(slot[system] + offset)
        lowest_in_column = all((rr, c) not in grid.values() for rr in range(r + 1, n_rows))
        draw_bars(
            axes, bars, ylabel=metric_label(metric) if c == 0 else None, positions=positions,
            width=0.4 if shared else 0.8, ticks=(list(slot.values()), systems),
            title=panel_title(model_rows, baseline, bool(baselines)), tick_labels=lowest_in_column,
        )  # fmt: skip
    for r in range(n_rows):
        for c in range(n_cols):
            if (r, c) not in grid.values():
                panels[r][c].set_axis_off()
    sources = {row.source for row in main}
    kind = " and ".join(s for s in SOURCES if s in sources)
    figure.suptitle(f"Throughput ({kind}); bar labels: ratio to {baseline}", fontsize=11)
    handles = [Patch(facecolor=colors[s], edgecolor="black", label=s) for s in systems]
    bottom_legend(figure, handles + source_legend_handles(), inches_per_entry=1.6)
    return figure


def plot_throughput(
    rows: Sequence[ResultRow] | str | Path,
    out_path: str | Path,
    *,
    baseline: str = DEFAULT_BASELINE,
    metric: str | None = None,
    figsize: tuple[float, float] | None = None,
    dpi: int = DEFAULT_DPI,
) -> Path:
    """``throughput_figure`` of ``rows`` written to ``out_path`` (PNG)."""
    return save_png(
        throughput_figure(rows, baseline=baseline, metric=metric, figsize=figsize, dpi=dpi), out_path
    )


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
