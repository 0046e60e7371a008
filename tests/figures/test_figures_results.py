"""Results-table figures (throughput, ablation, scaling, split): rendering and the numbers they label."""

from __future__ import annotations

import random

import pytest

from paper_figures.ablation import ABLATION_STEPS, ablation_step, plot_ablation
from paper_figures.logs import parse_result_rows, read_results_table
from paper_figures.scaling import plot_scaling
from paper_figures.split import generator_share, plot_split, total_gpus
from paper_figures.style import ordered_systems
from paper_figures.throughput import baseline_ratio, plot_throughput, unique_rows


@pytest.mark.parametrize("plot", [plot_throughput, plot_ablation, plot_scaling, plot_split])
def test_each_figure_renders_from_the_sample_table(tmp_path, sample_table, png_ok, plot):
    rows = read_results_table(sample_table)
    out = plot(rows, tmp_path / f"{plot.__name__}.png", figsize=(7.0, 4.0), dpi=90)
    png_ok(out, (630, 360))
    # The path form reads the same table itself.
    png_ok(plot(sample_table, tmp_path / "from_path.png", figsize=(5.0, 3.0), dpi=60), (300, 180))


def test_default_sizes(tmp_path, sample_table, png_ok):
    rows = read_results_table(sample_table)
    # Two models in the main rows -> two 3.4-inch panels; one model elsewhere -> the minimum widths.
    png_ok(plot_throughput(rows, tmp_path / "t.png"), (round(150 * 6.8), round(150 * 3.8)))
    png_ok(plot_ablation(rows, tmp_path / "a.png"), (round(150 * 4.0), round(150 * 3.8)))
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


def test_ablation_step_names():
    assert [ablation_step(s) for s in ("Separate-Sync", "gap", "+tsp", "+TAG", "TCSS")] == list(
        ABLATION_STEPS
    )
    with pytest.raises(ValueError, match=r"system='digenrl'"):
        ablation_step("digenrl")
    rows = [
        {"experiment": "ablation", "model": "m", "system": s, "samples_per_s": 1, "source": "measured"}
        for s in ("+GAP", "gap")
    ]
    with pytest.raises(ValueError, match="two rows"):
        plot_ablation(parse_result_rows(rows), "unused.png")


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
