"""Reward curves from metrics.jsonl, and make_all end to end (in-process and as the documented command)."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from paper_figures.learning import eval_curve, plot_learning, reward_curve
from paper_figures.logs import load_run
from paper_figures.make_all import default_timeline_window, display_name, make_all, root_labels
from paper_figures.make_all import main as make_all_main

REPO_ROOT = Path(__file__).resolve().parents[2]
EXPECTED_PNGS = {
    "timeline_tiny_cpu2_run.png",
    "learning.png",
    "results_table_throughput.png",
    "results_table_ablation.png",
    "results_table_scaling.png",
    "results_table_split.png",
    "ablation_cpu2_ablation.png",  # the JSON experiments/measure.py ablation writes
}


def test_reward_curve_matches_the_metrics_file(sample_run):
    raw = [json.loads(line) for line in (sample_run / "metrics.jsonl").read_text().splitlines()]
    xs, means, stds = reward_curve(load_run(sample_run).metrics)
    assert xs == [0.0, 1.0, 2.0, 3.0]
    assert means == [r["reward_mean"] for r in raw] and stds == [r["reward_std"] for r in raw]
    wall_xs, _, _ = reward_curve(load_run(sample_run).metrics, x="wall")
    np.testing.assert_allclose(wall_xs, np.cumsum(np.array([r["wall_s"] for r in raw], dtype=np.float64)))
    with pytest.raises(ValueError, match="x="):
        reward_curve(raw, x="epoch")


def test_reward_curve_drops_non_finite_rewards():
    walls = [random.uniform(0.1, 1) for _ in range(3)]
    records = [
        {"iteration": 0, "reward_mean": 0.5, "reward_std": 0.1, "wall_s": walls[0]},
        {
            "iteration": 1,
            "reward_mean": None,
            "reward_std": None,
            "wall_s": walls[1],
        },  # non-finite, as logged
        {"iteration": 2, "reward_mean": 0.7, "reward_std": None, "wall_s": walls[2]},
    ]
    xs, means, stds = reward_curve(records, x="wall")
    assert xs == pytest.approx([walls[0], sum(walls)]) and means == [0.5, 0.7] and stds == [0.1, 0.0]
    with pytest.raises(ValueError, match="'wall_s'"):
        reward_curve([{"iteration": 0, "reward_mean": 1.0, "reward_std": 0.0}])


def test_eval_curve_places_each_evaluation_at_its_policy_version(tmp_path, png_ok):
    records = [
        {"iteration": 0, "reward_mean": 0.5, "reward_std": 0.1, "wall_s": 1.0, "eval_policy_version": 0}
        | {"eval_reward_mean": 0.4},
        {"iteration": 1, "reward_mean": 0.6, "reward_std": 0.1, "wall_s": 2.0},
        {"iteration": 2, "reward_mean": 0.7, "reward_std": 0.1, "wall_s": 3.0, "eval_policy_version": 3}
        | {"eval_reward_mean": 0.8},
    ]
    assert eval_curve(records) == ([0.0, 3.0], [0.4, 0.8])  # the final policy one past the last iteration
    assert eval_curve(records, x="wall") == ([1.0, 6.0], [0.4, 0.8])
    assert eval_curve(records[1:2]) == ([], [])
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    png_ok(plot_learning([run], tmp_path / "l.png", dpi=100), (640, 400))


def test_learning_png_for_several_runs(tmp_path, sample_run, png_ok):
    out = plot_learning([sample_run, load_run(sample_run)], tmp_path / "l.png", labels=["a", "b"], dpi=100)
    png_ok(out, (640, 400))
    with pytest.raises(ValueError, match="labels"):
        plot_learning([sample_run], tmp_path / "l.png", labels=["a", "b"])


def test_default_timeline_window_skips_warm_up(sample_run):
    run = load_run(sample_run)
    assert default_timeline_window(run) is None  # 4 iterations: draw them all
    run.spans = [dict(s, iteration=s["iteration"] + 4 * copy) for copy in range(2) for s in run.spans]
    assert default_timeline_window(run) == (1, 3)
    run.spans.append(dict(run.spans[0], iteration=-1))  # set-up spans (initial weight sync) are not warm-up
    assert default_timeline_window(run) == (1, 3)


def test_make_all_in_process_with_a_bad_table_and_an_empty_run(tmp_path, data_dir, png_ok, capsys):
    logs = tmp_path / "logs"
    shutil.copytree(data_dir, logs)
    (logs / "empty_run" / "events").mkdir(parents=True)  # a run with metrics but no events
    (logs / "empty_run" / "metrics.jsonl").write_text("")
    (logs / "broken.csv").write_text("model,system\nm,s\n")  # lacks source and throughput
    (logs / "tiny_cpu2_run" / "trace.json").write_text(json.dumps({"traceEvents": []}))  # a run's own file
    report = make_all(logs, tmp_path / "out")
    assert {p.name for p in report.made} == EXPECTED_PNGS
    for path in report.made:
        png_ok(path)
    skipped = dict(report.skipped)
    assert any("broken.csv" in what and "not a results table" in why for what, why in skipped.items())
    assert not any("trace.json" in what for what in skipped)
    printed = capsys.readouterr().out
    assert printed.count("made ") == len(EXPECTED_PNGS) and "skipped " in printed


def test_make_all_command_end_to_end(tmp_path, data_dir, png_ok):
    command = [sys.executable, "paper_figures/make_all.py", "--logs", str(data_dir), "--out", str(tmp_path)]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert {p.name for p in tmp_path.glob("*.png")} == EXPECTED_PNGS
    for name in EXPECTED_PNGS:
        png_ok(tmp_path / name)
        assert f"made     {tmp_path / name}" in result.stdout
    # the ablation file has no main/scaling/split rows: three "skipped" lines
    assert f"{len(EXPECTED_PNGS)} figure(s) made, 3 skipped" in result.stdout

    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = subprocess.run(
        [sys.executable, "paper_figures/make_all.py", "--logs", str(empty), "--out", str(tmp_path / "o")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert nothing.returncode == 1 and "no run directories" in nothing.stdout


def test_several_logs_folders_name_each_run_by_its_folder(tmp_path, sample_run, sample_table, png_ok):
    first, second = tmp_path / "runs" / "a", tmp_path / "runs" / "b"
    for folder in (first, second):  # the same run name in both folders
        shutil.copytree(sample_run, folder / "run1")
    shutil.copy(sample_table, second / "table.json")
    assert root_labels([first, second]) == ["a", "b"]
    assert root_labels([first]) == [""]
    assert display_name(first / "run1", first, "a") == "a/run1"
    assert display_name(first / "run1", first / "run1", "") == "run1"  # a folder that is itself a run
    report = make_all([first, second, second / "run1"], tmp_path / "out")  # the last is inside the second
    made = {path.name for path in report.made}
    assert {"timeline_a__run1.png", "timeline_b__run1.png", "learning.png"} <= made
    assert {"b__table_throughput.png", "b__table_ablation.png"} <= made
    assert sum(name.startswith("timeline_") for name in made) == 2  # b/run1 is drawn once
    for path in report.made:
        png_ok(path)
    system = load_run(sample_run).config["system"]
    assert load_run(first / "run1", name="a/run1").label == f"{system} (a/run1)"


def test_make_all_command_takes_several_folders(tmp_path, sample_run, capsys):
    folders = [tmp_path / "x", tmp_path / "y"]
    for folder in folders:
        shutil.copytree(sample_run, folder / "r")
    assert make_all_main(["--logs", *map(str, folders), "--out", str(tmp_path / "o")]) == 0
    made = {p.name for p in (tmp_path / "o").glob("*.png")}
    assert made == {"timeline_x__r.png", "timeline_y__r.png", "learning.png"}
    with pytest.raises(SystemExit) as exit_info:
        make_all_main(["--logs", str(folders[0]), str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert (
        exit_info.value.code == 2
        and f"--logs {tmp_path / 'nope'} is not a directory" in capsys.readouterr().err
    )
