"""The reward benchmark (``experiments/measure.py reward``) on the tiny VLM judge (CPU): a valid report whose
cost fragment is what it measured, and ``--apply-to`` rewriting only the cost files it fits (no timing
assertions)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from digenrl.costs.cost_model import CostModel
from experiments.measure import FOLDERS


@pytest.fixture(scope="module")
def bench():
    from digenrl.perf import bench_reward

    return bench_reward


def test_help(bench, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--help"])
    assert exit_.value.code == 0 and "--apply-to" in capsys.readouterr().out


def test_bench_reports_costs_and_applies_them_where_they_fit(bench, tmp_path: Path) -> None:
    cpu_file = tmp_path / "in" / "cpu-tiny-sd3.json"  # decodes 32x32 images on the CPU
    cpu_file.parent.mkdir()
    shutil.copy(FOLDERS.costs / "cpu-tiny-sd3.json", cpu_file)
    gpu_file = FOLDERS.costs / "h200-sd3.5-medium.json"  # another device: must be left alone
    out = tmp_path / "out"
    args = ["--device", "cpu", "--threads", "1", "--batch-sizes", "2,1", "--height", "32", "--width", "32"]
    args += [
        "--iters",
        "1",
        "--warmup",
        "0",
        "--ceiling-size",
        "64",
        "--vision-attention",
        "varlen",
        "--out",
        str(out),
    ]
    assert bench.main([*args, "--apply-to", str(cpu_file), str(gpu_file)]) == 0

    report = json.loads((out / "reward-tiny-vlm-judge.json").read_text())
    assert (out / "reward-tiny-vlm-judge.md").is_file()
    rows = report["results"]
    assert [r["batch_size"] for r in rows] == [1, 2]
    assert all(r["ms_per_call"] > 0 and r["flops_per_call"] > 0 for r in rows)
    assert rows[1]["flops_per_call"] > rows[0]["flops_per_call"]  # two images cost more than one
    assert all(r["scores_finite"] and 0 <= r["score_min"] <= r["score_max"] <= 1 for r in rows)
    assert rows[1]["batch_vs_single_max_abs"] < 1e-5 and "batch_vs_single_max_abs" not in rows[0]
    assert rows[0]["image_tokens"] == 4  # 32^2 is resized up to 56^2: 4x4 patches, 2x2 merged
    assert report["vision_resize_hw"] == [56, 56] and report["dtype"] == "float32"
    assert report["vision_attention"] == "varlen"  # on the CPU through the per-window fallback: exact
    assert all(r["vision_varlen_vs_loop_rel_l2"] < 1e-6 for r in rows)
    assert report["reward_param_bytes"] == 4 * report["parameters"] > 0  # float32 weights
    fragment = report["cost_fragment"]
    assert fragment["reward_points"] == {str(r["batch_size"]): r["ms_per_call"] / 1e3 for r in rows}
    assert fragment["device"] == "cpu" and (fragment["height"], fragment["width"]) == (32, 32)

    applied = {Path(a["file"]).name: a for a in report["applied"]}
    assert "device 'h200'" in applied[gpu_file.name]["skipped"]
    written = CostModel.load(applied[cpu_file.name]["written"])
    original = CostModel.load(cpu_file)
    assert written.reward_points == {int(b): s for b, s in fragment["reward_points"].items()}
    assert written.reward_param_bytes == report["reward_param_bytes"]
    assert written.meta["reward"] == "tiny-vlm-judge" and original.meta["reward"] == "brightness"
    assert written.meta["reward_costs"]["command"].startswith("python experiments/measure.py reward")
    for field in (
        "generator_step_points",
        "vae_decode_points",
        "train_points",
        "param_bytes",
        "optimizer_step_s",
    ):
        assert getattr(written, field) == getattr(original, field)
    assert not (out / "costs" / gpu_file.name).exists()
    assert written.score_s(2) == pytest.approx(original.vae_decode_s(2) + fragment["reward_points"]["2"])


@pytest.mark.parametrize(
    ("reward", "batch_sizes"),
    [("tiny-clipscore", "2"), ("tiny-hpsv2.1", "2"), ("tiny-imagereward", "2"), ("tiny-ocr", "1")],
)
def test_bench_runs_each_new_reward_on_its_tiny_twin(
    bench, tmp_path: Path, reward: str, batch_sizes: str
) -> None:
    """Every reward with a model goes through the same benchmark (parameters counted through the reward's
    helper objects, OCR fed its target text as metadata); the real sizes build in --dry-run."""
    args = ["--reward", reward, "--device", "cpu", "--threads", "1", "--batch-sizes", batch_sizes]
    args += ["--height", "32", "--width", "32", "--iters", "1", "--warmup", "0", "--no-flops"]
    assert bench.main([*args, "--ceiling-size", "0", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / f"reward-{reward}.json").read_text())
    (row,) = report["results"]
    assert row["ms_per_call"] > 0 and row["scores_finite"] and report["dtype"] == "float32"
    assert 0 < report["parameters"] < 2_000_000 and report["reward_param_bytes"] == 4 * report["parameters"]
    assert report["cost_fragment"]["reward_points"] == {batch_sizes: row["ms_per_call"] / 1e3}


def test_dry_run_builds_the_real_size_on_meta(bench, tmp_path: Path) -> None:
    assert bench.main(["--reward", "hpsv2.1", "--dry-run", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "reward-hpsv2.1.json").read_text())
    assert report["dry_run"] and report["parameters"] == 986_109_441 and report["results"] == []
    assert report["reward_param_bytes"] == 4 * report["parameters"]
