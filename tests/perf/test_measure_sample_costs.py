"""``measure.py reward-latency`` / ``sample-costs`` (digenrl/perf/measure_sample_costs.py) on CPU with tiny
models: each writes a variance file the simulator loads, labelled measured by its command."""

from __future__ import annotations

import json

import pytest

from digenrl.costs.sample_costs import SampleVariance
from digenrl.rewards.registry import build_reward
from experiments import measure
from tests.rewards.reward_server import thread_server

TIMING = ["--warmup", "0", "--iters", "1", "--device", "cpu"]


def _written(out, name: str) -> tuple[SampleVariance, dict]:
    variance = SampleVariance.load(out / f"variance-{name}.json")
    report = json.loads((out / f"variance-{name}-report.json").read_text())
    return variance, report


def test_judge_latency_grows_with_the_generated_answer(tmp_path):
    argv = ["reward-latency", "--lengths", "1,24", "--height", "32", "--width", "32", "--out", str(tmp_path)]
    assert measure.main([*argv, *TIMING]) == 0
    variance, report = _written(tmp_path, "tiny-vlm-judge-latency")
    (dist,) = variance.distributions
    assert (dist.phase, dist.kind, dist.per, dist.batching) == ("reward", "discrete", "sample", "max")
    assert dist.source.startswith("measured: python experiments/measure.py reward-latency --lengths 1,24")
    assert "equally likely" in dist.note
    seconds = {r["output_tokens"]: r["seconds"] for r in report["rows"]}
    assert seconds[24] > seconds[1] > 0  # 24 decode steps after the prefill, against one
    assert dist.quantile(0.99) > 1.0 > dist.quantile(0.01)


def test_server_latency_is_an_empirical_distribution_of_requests(tmp_path):
    with thread_server(build_reward("brightness")) as url:
        argv = ["reward-latency", "--url", url, "--requests", "5", "--height", "8", "--width", "8"]
        assert measure.main([*argv, "--out", str(tmp_path), *TIMING]) == 0
    variance, report = _written(tmp_path, "remote-reward")
    (dist,) = variance.distributions
    assert (dist.phase, dist.kind) == ("reward", "empirical") and len(dist.values) == 5
    assert [r["request"] for r in report["rows"]] == list(range(5))


def test_generator_step_per_frame_count(tmp_path):
    assert measure.main(["sample-costs", "--frames", "5,9", "--out", str(tmp_path), *TIMING]) == 0
    variance, report = _written(tmp_path, "tiny-wan-frames")
    (dist,) = variance.distributions
    assert (dist.phase, dist.kind, dist.per, dist.batching) == ("generate", "discrete", "prompt", "mean")
    assert [r["frames"] for r in report["rows"]] == [5, 9] and report["rows"][1]["tokens"] > report["rows"][
        0
    ]["tokens"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["reward-latency", "--lengths", "8"], "at least two output lengths"),
        (["sample-costs", "--frames", "5"], "at least two frame counts"),
        (["reward-latency", "--batch", "0"], "--batch must be >= 1"),
    ],
)
def test_bad_input_is_a_usage_error(argv, message, capsys):
    with pytest.raises(SystemExit):
        measure.main(argv)
    assert message in capsys.readouterr().err


def test_an_image_model_has_no_frame_counts_to_measure(tmp_path):
    with pytest.raises(SystemExit, match="image model"):
        measure.main(["sample-costs", "--model", "tiny-sd3", "--out", str(tmp_path), *TIMING])


def test_a_bad_frame_count_or_cost_file_names_the_problem(tmp_path):
    with pytest.raises(SystemExit, match="sample-costs: --frames=6 invalid for tiny-wan"):
        measure.main(["sample-costs", "--frames", "5,6", "--out", str(tmp_path), *TIMING])
    with pytest.raises(SystemExit, match=r"cost file 'no\.json' does not exist"):
        measure.main(["sample-costs", "--carry", "no.json", "--out", str(tmp_path)])


def test_carry_labels_the_distribution_assumed(tmp_path):
    wan = "experiments/results/costs/h200-wan2.1-14b.json"
    argv = ["sample-costs", "--frames", "33,81", "--carry", wan, "--out", str(tmp_path)]
    assert measure.main(argv) == 0
    variance, report = _written(tmp_path, "wan2.1-14b-frames-assumed")
    (dist,) = variance.distributions
    assert dist.source.startswith("assumed (frame counts [33, 81]") and report["environment"] is None
    assert report["rows"][1]["seconds"] > 2 * report["rows"][0]["seconds"]  # 81 frames: > 2x the FLOPs
