"""Ablation figure: the JSON of ``measure.py ablation`` (both formats it has written) read as ablation rows,
and the bars drawn from them (order and colour by staleness, run spread, bubble-free bound, ratio to
separate-sync)."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
from matplotlib.colors import to_hex
from matplotlib.lines import Line2D

from paper_figures.ablation import (
    ABLATION_STEPS,
    STALENESS_COLORS,
    ablation_figure,
    ablation_step,
    panel_order,
    plot_ablation,
)
from paper_figures.logs import parse_result_rows, read_results_table, staleness_of_overrides

from .checks import DATA_DIR, overlapping_texts

ABLATION_FILE = DATA_DIR / "ablation_cpu2.json"


def write(tmp_path: Path, loaded: dict, name: str = "ablation.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(loaded))
    return path


def first_format(values: list[float]) -> dict:
    """The layout run_ablation.py first wrote (experiments/results/ablation/cpu-2.json of 2026-11-29): one
    run per variant, ``busy_<pool>`` keys, no staleness, runs or bound."""
    names = ("separate-sync", "digenrl gap f=1", "digenrl gap f=4")
    rows = [
        {
            "variant": name,
            "overrides": [f"system={name.split()[0]}"],
            "samples_per_s": value,
            "busy_trainer": 0.5,
            "busy_generator": 0.25,
        }
        for name, value in zip(names, values, strict=True)
    ]
    meta = {"profile": "cpu-2", "nproc": 2, "trainers": 1, "date": "d", "hardware": "h"}
    return {"meta": meta, "rows": rows}


def bar_patches(axes) -> list:
    return [patch for patch in axes.patches if patch.get_fill()]


def test_current_format_rows_keep_every_ablation_field():
    raw = json.loads(ABLATION_FILE.read_text())
    rows = read_results_table(ABLATION_FILE)
    assert [r.system for r in rows] == [r["variant"] for r in raw["rows"]]
    for row, source in zip(rows, raw["rows"], strict=True):
        assert (row.experiment, row.model, row.source) == ("ablation", raw["meta"]["profile"], "measured")
        assert row.throughput == {"samples_per_s": pytest.approx(source["samples_per_s"])}
        assert row.runs == pytest.approx(source["samples_per_s_runs"])
        assert row.bubble_free == pytest.approx(source["bubble_free_samples_per_s"])
        assert row.staleness == source["staleness_allowed"]
        assert row.stale_fraction == pytest.approx(source["stale_fraction"])
        assert row.extra["busy"] == source["busy"]
        assert row.extra["tag_fragments"] == pytest.approx(source["tag_fragments"])
        colocated = source["overrides"][0].startswith("system=colocated")
        pools = (raw["meta"]["trainers"], raw["meta"]["nproc"] - raw["meta"]["trainers"])
        assert (row.trainers, row.generators) == ((None, None) if colocated else pools)


def test_first_format_rows_read_with_staleness_from_the_overrides(tmp_path):
    values = [random.uniform(10, 60) for _ in range(3)]
    rows = read_results_table(write(tmp_path, first_format(values)))
    assert [r.throughput["samples_per_s"] for r in rows] == pytest.approx(values)
    assert all(r.staleness == 0 and r.runs == () and r.bubble_free is None for r in rows)
    assert rows[0].extra["busy"] == {"trainer": 0.5, "generator": 0.25}
    figure = ablation_figure(rows)
    (axes,) = figure.axes
    assert [p.get_height() for p in bar_patches(axes)] == pytest.approx(values)
    assert not [p for p in axes.patches if not p.get_fill()]  # no bound outline without a bound
    assert f"{values[2] / values[0]:.2f}×" in {t.get_text() for t in axes.texts}


def test_staleness_of_overrides():
    assert staleness_of_overrides(["system=digenrl", "tag=true"]) == 0
    assert staleness_of_overrides(["system=digenrl", "tcss=true"]) == 1
    assert staleness_of_overrides(["tcss=false", "asynchrony.max_staleness=2"]) == 2
    assert staleness_of_overrides(["tcss=false", "tcss=true"]) == 1  # the ablation's ladder: the last wins
    assert staleness_of_overrides(["tcss=true", "tcss=false"]) == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f.pop("meta"), "'meta.profile'"),
        (lambda f: f["rows"][0].update(stale_fraction=1.5), "stale_fraction="),
        (lambda f: f["rows"][1].update(samples_per_s_runs=["fast"]), "samples_per_s_runs="),
        (lambda f: f["rows"][2].update(staleness_allowed=0.5), "staleness_allowed="),
        (lambda f: f["rows"][2].pop("samples_per_s"), "row 3: needs one of the throughput keys"),
    ],
)
def test_bad_ablation_files_name_the_key(tmp_path, change, message):
    loaded = first_format([1.0, 2.0, 3.0])
    change(loaded)
    with pytest.raises(ValueError, match=message):
        read_results_table(write(tmp_path, loaded))


def test_runs_in_a_csv_cell():
    (row,) = parse_result_rows(
        [
            {
                "model": "m",
                "system": "s",
                "source": "measured",
                "samples_per_s": "2",
                "samples_per_s_runs": "1;2 3",
            }
        ]
    )
    assert row.runs == (1.0, 2.0, 3.0)


def test_figure_groups_by_staleness_and_labels_ratios_runs_and_bounds():
    rows = read_results_table(ABLATION_FILE)
    figure = ablation_figure(rows)
    (axes,) = figure.axes
    ordered = sorted(rows, key=lambda r: r.staleness)  # stable: the ladder order inside a staleness group
    assert [t.get_text() for t in axes.get_xticklabels()] == [r.system for r in ordered]
    bars = bar_patches(axes)
    assert [p.get_height() for p in bars] == pytest.approx([r.throughput["samples_per_s"] for r in ordered])
    assert [to_hex(p.get_facecolor()) for p in bars] == [STALENESS_COLORS[r.staleness] for r in ordered]
    # Equal-staleness variants stand side by side; a gap separates the groups.
    centres = [p.get_x() + p.get_width() / 2 for p in bars]
    steps = [b - a for a, b in itertools.pairwise(centres)]
    boundaries = [i for i in range(len(ordered) - 1) if ordered[i].staleness != ordered[i + 1].staleness]
    assert all(step > 1.0 if i in boundaries else step == pytest.approx(1.0) for i, step in enumerate(steps))
    base = next(r for r in rows if r.system == "separate-sync").throughput["samples_per_s"]
    ratios = [t.get_text() for t in axes.texts if t.get_text().endswith("×")]
    assert ratios == [f"{r.throughput['samples_per_s'] / base:.2f}×" for r in ordered]
    outlines = [p for p in axes.patches if not p.get_fill()]
    assert sorted(p.get_height() for p in outlines) == pytest.approx(sorted(r.bubble_free for r in rows))
    dots = [line for line in axes.lines if line.get_marker() == "o"]
    assert sorted(y for line in dots for y in line.get_ydata()) == pytest.approx(
        sorted(run for r in rows for run in r.runs)
    )
    notes = {t.get_text() for t in axes.texts if t.get_text().endswith("stale")}
    assert notes == {f"{r.stale_fraction:.0%} stale" for r in rows if r.stale_fraction}
    legend = {t.get_text() for t in figure.legends[0].get_texts()}
    assert {"on-policy (staleness 0)", "≤1 version stale", "bubble-free bound"} <= legend
    assert any(isinstance(h, Line2D) for h in figure.legends[0].legend_handles)
    assert overlapping_texts(figure) == []


def test_cumulative_steps_keep_their_order_and_tcss_is_one_version_stale(sample_table, tmp_path, png_ok):
    rows = [r for r in read_results_table(sample_table) if r.experiment == "ablation"]
    random.shuffle(rows)
    assert [r.system for r in panel_order(rows)] == list(ABLATION_STEPS)
    (axes,) = ablation_figure(rows).axes
    colors = [to_hex(p.get_facecolor()) for p in bar_patches(axes)]
    assert colors == [STALENESS_COLORS[0]] * 4 + [STALENESS_COLORS[1]]
    png_ok(plot_ablation(rows, tmp_path / "a.png", figsize=(6, 4), dpi=50), (300, 200))


def test_ablation_step_names():
    assert [ablation_step(s) for s in ("Separate-Sync", "gap", "+tsp", "+TAG", "TCSS")] == list(
        ABLATION_STEPS
    )
    assert ablation_step(" digenrl gap+tag ") == "digenrl gap+tag"  # a run_ablation variant, as written
    rows = [
        {"experiment": "ablation", "model": "m", "system": s, "samples_per_s": 1, "source": "measured"}
        for s in ("+GAP", "gap")
    ]
    with pytest.raises(ValueError, match="two rows"):
        plot_ablation(parse_result_rows(rows), "unused.png")
