"""Ablation bars: the baselines and DigenRL's mechanisms one at a time (docs/design.md §3, §5), one panel per
model or profile.

Rows are the ``experiment=ablation`` rows of a results table, or the JSON ``experiments/measure.py ablation``
writes (read by ``paper_figures.logs`` as such rows, ``model`` = the profile). A row's ``system`` names a
variant: the cumulative steps ``separate-sync``, ``+GAP``, ``+TSP``, ``+TAG``, ``+TCSS`` (case-insensitive,
the ``+`` optional, drawn in that order) or any other name (drawn in table order, e.g. measure.py ablation's
``digenrl gap+tag``).

Bars are grouped and coloured by the staleness the variant allows (``staleness_allowed``; ``+TCSS`` allows 1,
the other steps 0), so equal-staleness comparisons stand side by side: on-policy variants first, then
one-version-stale ones (``digenrl …+tcss`` next to ``separate-async s=1``, docs/design.md §4). Each bar is the
(median) samples/s with the run-to-run spread as an error bar from the slowest to the fastest run and each
run as a dot, the bubble-free bound as a dashed outline, the share of stale samples written on the bar, and
its ratio to the separate-sync bar of the same panel and source on top. Simulated rows are hatched.

Usage: ``python paper_figures/ablation.py TABLE.csv|json --out ablation.png``
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from paper_figures.bars import Bar, bound_legend_handle, draw_bars, metric_label, spread_err
from paper_figures.cli import table_figure_main
from paper_figures.logs import SOURCES, ResultRow, experiment_rows
from paper_figures.style import DEFAULT_DPI, bottom_legend, new_figure, save_png, source_legend_handles
from paper_figures.throughput import baseline_ratio, unique_rows

ABLATION_STEPS = ("separate-sync", "+GAP", "+TSP", "+TAG", "+TCSS")
BASELINE = "separate-sync"
# On-policy blue, one version stale orange, more stale red; a row that does not say grey.
STALENESS_COLORS = {0: "#4e79a7", 1: "#f28e2b", 2: "#e15759"}
UNKNOWN_STALENESS_COLOR = "#bab0ac"
GROUP_GAP = 0.6  # extra x space between two staleness groups


def ablation_step(system: str) -> str:
    """The canonical step label of a cumulative-step row's ``system`` value, else the name as written."""
    wanted = system.strip().lower().removeprefix("+")
    for step in ABLATION_STEPS:
        if step.lower().removeprefix("+") == wanted:
            return step
    return system.strip()


def row_staleness(row: ResultRow) -> int | None:
    """Versions a variant lets a trained sample lag: the row's ``staleness_allowed``, else the cumulative
    step's (TCSS allows one, docs/design.md §3), else unknown."""
    if row.staleness is not None:
        return row.staleness
    if row.system in ABLATION_STEPS:
        return 1 if row.system == "+TCSS" else 0
    return None


def staleness_color(staleness: int | None) -> str:
    if staleness is None:
        return UNKNOWN_STALENESS_COLOR
    return STALENESS_COLORS[min(staleness, max(STALENESS_COLORS))]


def staleness_label(staleness: int | None) -> str:
    if staleness is None:
        return "staleness not given"
    if staleness == 0:
        return "on-policy (staleness 0)"
    return f"≤{staleness} version{'s' if staleness > 1 else ''} stale"


def panel_order(rows: Sequence[ResultRow]) -> list[ResultRow]:
    """Staleness groups ascending (unknown last); inside a group the cumulative steps in their order when the
    panel has only those, else table order (measure.py ablation writes its ladder in order); measured before
    simulated."""
    steps_only = all(row.system in ABLATION_STEPS for row in rows)

    def key(indexed: tuple[int, ResultRow]) -> tuple:
        index, row = indexed
        staleness = row_staleness(row)
        step = ABLATION_STEPS.index(row.system) if steps_only else 0
        return (staleness is None, staleness or 0, step, index, SOURCES.index(row.source))

    return [row for _, row in sorted(enumerate(rows), key=key)]


def panel_title(model: str, rows: Sequence[ResultRow]) -> str:
    """The model (or profile) and, when the rows say, the pools of the disaggregated variants."""
    pools = {(r.trainers, r.generators) for r in rows if r.trainers and r.generators}
    if len(pools) == 1:
        trainers, generators = pools.pop()
        return f"{model}: {plural(trainers, 'trainer')} + {plural(generators, 'generator')}"
    return model


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def provenance(rows: Sequence[ResultRow]) -> str:
    """``, measured <date> on <hardware>`` when every row says the same (measure.py ablation's meta)."""
    dates = {str(r.extra.get("date", "")) for r in rows}
    hardware = {str(r.extra.get("hardware", "")) for r in rows}
    if len(dates) == 1 and len(hardware) == 1 and all(r.source == "measured" for r in rows):
        date, machine = dates.pop(), hardware.pop()
        return "".join((f", measured {date}" if date else "", f" on {machine}" if machine else ""))
    return ""


def ablation_figure(
    rows: Sequence[ResultRow] | str | Path,
    *,
    metric: str | None = None,
    figsize: tuple[float, float] | None = None,
    dpi: int = DEFAULT_DPI,
) -> Figure:
    """Bars of the ``ablation`` rows of ``rows`` (or of the table at that path); see the module docstring."""
    ablation, metric = experiment_rows(rows, "ablation", metric)
    # Canonical step names, so '+gap' and 'GAP' are one step (and two such rows are ambiguous).
    canonical = [replace(row, system=ablation_step(row.system)) for row in ablation]
    unique_rows(canonical, ("model", "system", "source"))
    models = list(dict.fromkeys(row.model for row in canonical))
    # Runs, bounds and stale fractions are samples/s facts (measure.py ablation); other metrics: bars only.
    detailed = metric == "samples_per_s"
    widest = max(sum(r.model == m for r in canonical) for m in models)

    figure = new_figure(figsize or (max(4.5, (0.62 * widest + 1.4) * len(models)), 4.4), dpi)
    panels = figure.subplots(1, len(models), squeeze=False)[0]
    staleness_seen: list[int | None] = []
    for axes, model in zip(panels, models, strict=True):
        model_rows = panel_order([r for r in canonical if r.model == model])
        baselines = {r.source: r.throughput[metric] for r in model_rows if r.system == BASELINE}
        bars, positions, x, previous = [], [], 0.0, None
        for index, row in enumerate(model_rows):
            staleness = row_staleness(row)
            if index and staleness != previous:
                x += GROUP_GAP
            previous = staleness
            staleness_seen.append(staleness)
            value = row.throughput[metric]
            runs = row.runs if detailed else ()
            std = row.std.get(metric)
            stale = row.stale_fraction if detailed else None
            bars.append(
                Bar(
                    label=row.system,
                    value=value,
                    color=staleness_color(staleness),
                    simulated=row.is_simulated,
                    err=spread_err(value, runs) or ((std, std) if std else None),
                    ratio=baseline_ratio(value, row.source, baselines),
                    points=runs if len(runs) > 1 else (),
                    bound=row.bubble_free if detailed else None,
                    note=f"{stale:.0%} stale" if stale else None,
                )
            )
            positions.append(x)
            x += 1.0
        title = panel_title(model, model_rows)
        title += "" if baselines else f"\n(no {BASELINE} row: no ratios)"
        draw_bars(axes, bars, ylabel=metric_label(metric), title=title, positions=positions)

    repeats = {len(r.runs) for r in canonical if r.runs} if detailed else set()
    spread = f"median of {repeats.pop()} runs, " if len(repeats) == 1 else ""
    figure.suptitle(f"Ablation{provenance(canonical)}\n{spread}bar labels: ratio to {BASELINE}", fontsize=10)
    handles: list = [
        Patch(facecolor=staleness_color(s), edgecolor="black", label=staleness_label(s))
        for s in dict.fromkeys(staleness_seen)
    ]
    if any(len(r.runs) > 1 for r in canonical) and detailed:
        handles.append(
            Line2D([], [], color="black", marker="o", markersize=3, label="runs (bar: slowest–fastest)")
        )
    if detailed and any(r.bubble_free is not None for r in canonical):
        handles.append(bound_legend_handle())
    if any(r.is_simulated for r in canonical):
        handles += source_legend_handles()
    bottom_legend(figure, handles, inches_per_entry=2.0)
    return figure


def plot_ablation(
    rows: Sequence[ResultRow] | str | Path,
    out_path: str | Path,
    *,
    metric: str | None = None,
    figsize: tuple[float, float] | None = None,
    dpi: int = DEFAULT_DPI,
) -> Path:
    """``ablation_figure`` of ``rows`` written to ``out_path`` (PNG)."""
    return save_png(ablation_figure(rows, metric=metric, figsize=figsize, dpi=dpi), out_path)


def main(argv: Sequence[str] | None = None) -> int:
    return table_figure_main(__doc__, plot_ablation, argv)


if __name__ == "__main__":
    raise SystemExit(main())
