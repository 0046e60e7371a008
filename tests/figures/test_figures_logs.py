"""paper_figures.logs: run-directory and results-table loaders, checked against the raw files."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from paper_figures.logs import (
    choose_metric,
    find_run_dirs,
    load_metrics,
    load_run,
    parse_result_rows,
    read_results_table,
    rows_for,
)


def _raw_records(run_dir):
    """Independent reader: every JSON line of every rank file."""
    records = []
    for path in sorted((run_dir / "events").glob("rank*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return records


def test_load_run_counts_match_the_raw_sample_files(sample_run):
    run = load_run(sample_run)
    raw = _raw_records(sample_run)
    raw_spans = [r for r in raw if r["type"] == "span"]
    assert len(run.spans) == len(raw_spans) == 32  # 2 ranks × 4 iterations × 4 phases
    assert run.ranks == [0, 1]
    assert run.roles == {0: "colocated", 1: "colocated"}
    assert run.span_iterations == [0, 1, 2, 3]
    assert Counter(s["phase"] for s in run.spans) == Counter(s["phase"] for s in raw_spans)
    assert run.metric_iterations == [0, 1, 2, 3]
    raw_metrics = [json.loads(line) for line in (sample_run / "metrics.jsonl").read_text().splitlines()]
    assert [m["reward_mean"] for m in run.metrics] == [m["reward_mean"] for m in raw_metrics]
    assert run.config["system"] == "colocated-sync"
    assert run.label == "colocated-sync (tiny_cpu2_run)"


def test_find_run_dirs_finds_nested_runs_and_ignores_other_folders(tmp_path, sample_run):
    (tmp_path / "a" / "b" / "run1" / "events").mkdir(parents=True)
    (tmp_path / "a" / "b" / "run1" / "events" / "rank0.jsonl").write_text(
        (sample_run / "events" / "rank0.jsonl").read_text()
    )
    (tmp_path / "run2").mkdir()
    (tmp_path / "run2" / "metrics.jsonl").write_text((sample_run / "metrics.jsonl").read_text())
    (tmp_path / "not_a_run").mkdir()
    (tmp_path / "not_a_run" / "notes.txt").write_text("x")
    assert find_run_dirs(tmp_path) == [tmp_path / "a" / "b" / "run1", tmp_path / "run2"]
    events_only = load_run(tmp_path / "a" / "b" / "run1")
    assert events_only.metrics == [] and events_only.config == {} and events_only.ranks == [0]
    with pytest.raises(ValueError, match="not a run directory"):
        load_run(tmp_path / "not_a_run")


def test_load_metrics_keeps_the_last_record_of_a_resumed_iteration(tmp_path):
    values = [random.random() for _ in range(4)]
    lines = [
        {"iteration": 0, "reward_mean": values[0]},
        {"iteration": 1, "reward_mean": values[1]},
        {"iteration": 1, "reward_mean": values[2]},  # re-run after resume
        {"iteration": 2, "reward_mean": values[3]},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    loaded = load_metrics(tmp_path)
    assert [r["iteration"] for r in loaded] == [0, 1, 2]
    assert [r["reward_mean"] for r in loaded] == [values[0], values[2], values[3]]


def test_sample_results_table_rows_by_experiment(sample_table):
    rows = read_results_table(sample_table)
    raw = json.loads(sample_table.read_text())["rows"]
    assert len(rows) == len(raw)
    expected = Counter(r.get("experiment", "main") for r in raw)
    for experiment in ("main", "ablation", "scaling", "split"):
        assert len(rows_for(rows, experiment)) == expected[experiment] > 0
    for row, source in zip(rows, raw, strict=True):
        assert row.throughput["samples_per_s"] == pytest.approx(source["samples_per_s"])
        assert row.source == source["source"]
        assert row.gpus == source.get("gpus")


def test_csv_table_with_comments_blanks_and_extra_columns(tmp_path):
    value = round(random.uniform(1, 100), 3)
    path = tmp_path / "t.csv"
    path.write_text(
        "# test data\n"
        "model,system,samples_per_s,images_per_gpu_s,source,experiment,gpus,generators,trainers,note\n"
        f"m,digenrl,{value},,measured,,,,,hello\n"
        f"m,digenrl,,{value / 8},simulated,split,8,5,3,\n"
    )
    main, split = read_results_table(path)
    assert main.experiment == "main" and main.throughput == {"samples_per_s": value}
    assert main.extra == {"note": "hello"} and main.gpus is None
    assert split.experiment == "split" and split.is_simulated
    assert (split.gpus, split.generators, split.trainers) == (8, 5, 3)
    assert split.throughput == {"images_per_gpu_s": pytest.approx(value / 8)}


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"system": "s", "samples_per_s": 1, "source": "measured"}, "'model'"),
        ({"model": "m", "system": "s", "samples_per_s": 1, "source": "guessed"}, "source="),
        ({"model": "m", "system": "s", "source": "measured"}, "throughput keys"),
        ({"model": "m", "system": "s", "samples_per_s": -1, "source": "measured"}, "samples_per_s="),
        ({"model": "m", "system": "s", "samples_per_s": "fast", "source": "measured"}, "not a number"),
        (
            {"model": "m", "system": "s", "samples_per_s": 1, "source": "measured", "experiment": "x"},
            "experiment=",
        ),
        (
            {"model": "m", "system": "s", "samples_per_s": 1, "source": "measured", "experiment": "scaling"},
            "'gpus'",
        ),
        ({"model": "m", "system": "s", "samples_per_s": 1, "source": "measured", "gpus": 2.5}, "gpus="),
        (
            {"model": "m", "system": "s", "samples_per_s": 1, "source": "measured", "experiment": "split"},
            "'generators'",
        ),
    ],
)
def test_bad_rows_raise_naming_the_key(row, message):
    with pytest.raises(ValueError, match=message):
        parse_result_rows([row], origin="t")


def test_bad_table_files(tmp_path):
    (tmp_path / "t.txt").write_text("x")
    with pytest.raises(ValueError, match=r"\.csv or \.json"):
        read_results_table(tmp_path / "t.txt")
    (tmp_path / "trace.json").write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(ValueError, match="'rows'"):
        read_results_table(tmp_path / "trace.json")
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(ValueError, match="no rows"):
        read_results_table(tmp_path / "empty.json")


def test_choose_metric_never_mixes_units():
    both = {"model": "m", "system": "a", "source": "measured", "samples_per_s": 2, "images_per_gpu_s": 1}
    images = {"model": "m", "system": "b", "source": "measured", "images_per_gpu_s": 3}
    samples = {"model": "m", "system": "c", "source": "measured", "samples_per_s": 4}
    assert choose_metric(parse_result_rows([both, samples])) == "samples_per_s"
    assert choose_metric(parse_result_rows([both, images])) == "images_per_gpu_s"
    assert choose_metric(parse_result_rows([both]), "images_per_gpu_s") == "images_per_gpu_s"
    with pytest.raises(ValueError, match="share a throughput metric"):
        choose_metric(parse_result_rows([images, samples]))
    with pytest.raises(ValueError, match="metric="):
        choose_metric(parse_result_rows([both]), "fps")
