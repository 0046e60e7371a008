"""Results-table figures (throughput, ablation, scaling, split): rendering and the numbers they label."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from paper_figures.ablation import plot_ablation
from paper_figures.logs import parse_result_rows, read_results_table
from paper_figures.scaling import plot_scaling
from paper_figures.split import generator_share, plot_split, total_gpus
from paper_figures.style import SIMULATED_HATCH, ordered_systems
from paper_figures.throughput import (
    GRID_COLUMNS,
    baseline_ratio,
    panel_grid,
    panel_model,
    plot_throughput,
    throughput_figure,
    unique_rows,
)

from .checks import overlapping_texts

THROUGHPUT_TABLE = (
    Path(__file__).resolve().parents[2] / "experiments" / "results" / "throughput" / "table.csv"
)


@pytest.mark.parametrize("plot", [plot_throughput, plot_ablation, plot_scaling, plot_split])
def test_each_figure_renders_from_the_sample_table(tmp_path, sample_table, png_ok, plot):
    rows = read_results_table(sample_table)
    out = plot(rows, tmp_path / f"{plot.__name__}.png", figsize=(7.0, 4.0), dpi=90)
    png_ok(out, (630, 360))
    # The path form reads the same table itself.
    png_ok(plot(sample_table, tmp_path / "from_path.png", figsize=(5.0, 3.0), dpi=60), (300, 180))


def test_default_sizes(tmp_path, sample_table, png_ok):
    rows = read_results_table(sample_table)
    # Two models in the main rows -> one row of two 3.1-inch panels (5 systems); the ablation's five steps
    # -> 0.62 inch per bar + 1.4; one model elsewhere -> the minimum widths.
    png_ok(plot_throughput(rows, tmp_path / "t.png"), (round(150 * 6.6), round(150 * 3.8)))
    png_ok(plot_ablation(rows, tmp_path / "a.png"), (round(150 * 4.5), round(150 * 4.4)))
    png_ok(plot_scaling(rows, tmp_path / "s.png"), (round(150 * 5.2), round(150 * 4.0)))


def test_figures_without_their_rows_say_so(tmp_path):
    only_main = parse_result_rows(
        [{"model": "m", "system": "digenrl", "samples_per_s": 1, "source": "measured"}]
    )
    for plot, kind in ((plot_ablation, "ablation"), (plot_scaling, "scaling"), (plot_split, "split")):
        with pytest.raises(ValueError, match=kind):
            plot(only_main, tmp_path / "x.png")
    with pytest.raises(ValueError, match=r"must end in \.png"):
        plot_throughput(only_main, tmp_path / "x.jpg")


def test_baseline_ratio_prefers_the_same_source():
    measured, simulated, value = (random.uniform(1, 10) for _ in range(3))
    both = {"measured": measured, "simulated": simulated}
    assert baseline_ratio(value, "measured", both) == pytest.approx(value / measured)
    assert baseline_ratio(value, "simulated", both) == pytest.approx(value / simulated)
    assert baseline_ratio(value, "simulated", {"measured": measured}) == pytest.approx(value / measured)
    assert baseline_ratio(value, "measured", {}) is None


def test_throughput_without_baseline_still_renders_and_duplicates_are_rejected(tmp_path, png_ok):
    row = {"model": "m", "system": "digenrl", "samples_per_s": 3.0, "source": "measured"}
    png_ok(plot_throughput(parse_result_rows([row]), tmp_path / "t.png", figsize=(4, 3), dpi=50), (200, 150))
    with pytest.raises(ValueError, match="two rows"):
        unique_rows(parse_result_rows([row, row]), ("model", "system", "source"))
    with pytest.raises(ValueError, match="two rows"):
        plot_throughput(parse_result_rows([row, row]), tmp_path / "t.png")


def test_system_order_and_split_axes():
    assert ordered_systems(["zeta", "digenrl", "colocated-sync", "alpha"]) == [
        "colocated-sync",
        "digenrl",
        "alpha",
        "zeta",
    ]
    g, t = random.randint(1, 9), random.randint(1, 9)
    row = parse_result_rows(
        [
            {
                "experiment": "split",
                "model": "m",
                "system": "s",
                "generators": g,
                "trainers": t,
                "samples_per_s": 1,
                "source": "measured",
            }
        ]
    )[0]
    assert generator_share(row) == pytest.approx(g / (g + t))
    assert total_gpus(row) == g + t


def test_scaling_rejects_two_rows_at_one_point(tmp_path):
    row = {
        "experiment": "scaling",
        "model": "m",
        "system": "s",
        "gpus": 4,
        "samples_per_s": 1,
        "source": "measured",
    }
    with pytest.raises(ValueError, match="x=4"):
        plot_scaling(parse_result_rows([row, row]), tmp_path / "s.png")


def test_throughput_grid_of_the_committed_table_is_readable():
    """experiments/results/throughput/table.csv: a row of panels per profile, a column per model, every
    system at the same x, simulated bars hatched, system names under the bottom row only, no text overlapping
    another or the figure's edge at the default size."""
    rows = read_results_table(THROUGHPUT_TABLE)
    profiles = list(dict.fromkeys(r.extra["profile"] for r in rows))
    models = list(dict.fromkeys(panel_model(r) for r in rows))
    assert panel_grid(rows) == {
        r.model: (profiles.index(r.extra["profile"]), models.index(panel_model(r))) for r in rows
    }
    figure = throughput_figure(rows)
    panels = figure.axes
    assert len(panels) == len(profiles) * len(models)
    systems = ordered_systems(r.system for r in rows)
    cells = {(profiles.index(r.extra["profile"]), models.index(panel_model(r))) for r in rows}
    for index, axes in enumerate(panels):
        profile, model = profiles[index // len(models)], models[index % len(models)]
        row, column = divmod(index, len(models))
        if (row, column) not in cells:  # a profile x scenario pair the table has no rows for: blank
            assert not axes.axison
            continue
        assert axes.get_title() == f"{model}\n{profile} · {rows_of(rows, model, profile)[0].gpus} GPUs"
        bars = [p for p in axes.patches if p.get_fill()]
        expected = {r.system: r for r in rows_of(rows, model, profile)}
        present = [s for s in systems if s in expected]  # speed-split rows exist on one profile only
        assert [p.get_height() for p in bars] == pytest.approx(
            [expected[s].throughput["samples_per_s"] for s in present]
        )
        # a system missing from a panel leaves a gap: every system keeps its x in every panel
        assert [p.get_x() + p.get_width() / 2 for p in bars] == pytest.approx(
            [systems.index(s) for s in present]
        )
        assert all(p.get_hatch() == SIMULATED_HATCH for p in bars)  # the committed table is all simulated
        labels = [t.get_text() for t in axes.get_xticklabels()]
        lowest = all((below, column) not in cells for below in range(row + 1, len(profiles)))
        assert labels == (systems if lowest else [""] * len(systems))  # names under a column's lowest panel
    assert overlapping_texts(figure) == []


def test_throughput_grid_wraps_tables_without_profiles_and_splits_a_shared_slot():
    row = {"system": "digenrl", "samples_per_s": 1.0, "source": "measured"}
    rows = parse_result_rows([dict(row, model=f"m{i}") for i in range(6)])
    assert panel_grid(rows) == {f"m{i}": divmod(i, GRID_COLUMNS) for i in range(6)}
    figure = throughput_figure(rows)
    assert sum(axes.axison for axes in figure.axes) == 6  # the two unused cells of the 2 x 4 grid are off
    both = parse_result_rows(
        [dict(row, model="m"), dict(row, model="m", source="simulated", samples_per_s=2.0)]
    )
    (axes,) = throughput_figure(both).axes
    bars = [p for p in axes.patches if p.get_fill()]
    assert [p.get_hatch() for p in bars] == [None, SIMULATED_HATCH]
    assert [(p.get_x(), p.get_width()) for p in bars] == [
        pytest.approx((-0.4, 0.4)),
        pytest.approx((0.0, 0.4)),
    ]
    assert [t.get_text() for t in axes.get_xticklabels()] == ["digenrl"]


def rows_of(rows, model: str, profile: str) -> list:
    return [r for r in rows if panel_model(r) == model and r.extra["profile"] == profile]


def _fair_rows(panel: str, regime: str, ratios: tuple[float, float, float]) -> list[dict]:
    on, stale, mechanisms = ratios
    common = {"experiment": "main", "model": panel, "source": "simulated", "regime": regime}
    return [
        {**common, "system": "colocated-sync", "samples_per_s": 10.0, "ratio_vs_best_fair_baseline": 1.0},
        {
            **common,
            "system": "digenrl",
            "samples_per_s": 10.0 * on,
            "ratio_vs_best_fair_baseline": on,
            "mechanisms_ratio_vs_best_fair_baseline": mechanisms,
        },
        {
            **common,
            "system": "digenrl s=1",
            "samples_per_s": 10.0 * stale,
            "ratio_vs_best_fair_baseline": stale,
        },
    ]


def test_fair_ratio_figure_groups_panels_by_regime_and_keeps_each_ratio(tmp_path, png_ok):
    from paper_figures.fair_ratio import panel_ratios, plot_fair_ratio

    raw = _fair_rows("flux @ mixed-16", "mixed;memory", (1.13, 1.2, 1.13))
    raw += _fair_rows("sd3.5 @ a100-16", "identical", (1.0, 1.03, 0.94))
    rows = parse_result_rows(raw)
    panels = panel_ratios(rows)
    assert [(regime, panel) for regime, panel, _ in panels] == [
        ("identical", "sd3.5 @ a100-16"),
        ("mixed", "flux @ mixed-16"),
    ]
    assert panels[0][2] == {"digenrl": 1.0, "mechanisms": 0.94, "digenrl s=1": 1.03}
    png_ok(plot_fair_ratio(rows, tmp_path / "fair.png"))
    # a table without the column (an older throughput table, or another experiment) is refused by name
    old = parse_result_rows([{k: v for k, v in r.items() if "ratio" not in k} for r in raw])
    with pytest.raises(ValueError, match="ratio_vs_best_fair_baseline"):
        plot_fair_ratio(old, tmp_path / "old.png")
