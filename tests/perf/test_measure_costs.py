"""``experiments/measure.py costs`` measures the real tiny-sd3 components; ``experiments/simulate.py plan``
plans from the file. No timed assertions: only that every cost was measured and the byte counts are what
the tensors hold."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from digenrl.costs.cost_model import CostModel
from digenrl.rollout.sampler import CFG_SPLIT_MIN_BATCH
from experiments import measure, simulate


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("costs") / "cpu-tiny-sd3.json"
    args = ["--batches", "1,2", "--micro-batches", "1,2", "--iters", "1", "--warmup", "0", "--device", "cpu"]
    args += ["--out", str(out)]  # --device cpu: on a GPU machine "auto" would measure CUDA
    assert measure.main(["costs", *args]) == 0
    return out


def test_profile_cli_writes_a_complete_measured_cost_model(measured, capsys):
    costs = CostModel.load(measured)
    assert costs.source == "measured" and costs.device == "cpu" and costs.model == "tiny-sd3"
    assert costs.command.startswith("python experiments/measure.py costs")
    assert costs.path == "eager" and costs.text_encoder_bytes > 0 and costs.vae_param_bytes > 0
    for table in (*costs.generator_step_points.values(), *costs.train_points.values()):
        assert sorted(table) == [1, 2] and all(t > 0 and math.isfinite(t) for t in table.values())
    assert set(costs.generator_step_points) == {"cfg", "no_cfg"}
    assert sorted(costs.vae_decode_points) == [1, 2] and sorted(costs.reward_points) == [1, 2]
    assert costs.optimizer_step_s > 0 and costs.meta["grad_park_s"] > 0
    assert costs.meta["cfg_grad"] == "cond" and costs.meta["cfg_split_min_batch"] == CFG_SPLIT_MIN_BATCH
    # tiny-sd3 latents are [4, 8, 8] float32; a trajectory record holds latents and next latents for every
    # trained step, so it is at least 2 * K latents; LoRA is a strict subset of the transformer.
    assert costs.latent_bytes_per_sample == 4 * 8 * 8 * 4
    k = costs.meta["train_steps_per_sample"]
    # a whole record holds the condition once and 2 latents per trained step; a unit row holds the
    # condition and one transition (2 latents), so K unit rows repeat the condition K times
    assert (
        costs.fragment_bytes_per_sample >= costs.cond_bytes_per_sample + 2 * k * costs.latent_bytes_per_sample
    )
    assert costs.unit_bytes >= costs.cond_bytes_per_sample + 2 * costs.latent_bytes_per_sample
    assert k * costs.unit_bytes - costs.fragment_bytes_per_sample >= (k - 1) * costs.cond_bytes_per_sample
    assert costs.cond_bytes_per_sample > 0
    assert 0 < costs.weight_sync_bytes == costs.grad_bytes < costs.param_bytes
    assert costs.optimizer_bytes >= 2 * costs.weight_sync_bytes  # AdamW: two moments per trainable value


def test_plan_cli_plans_from_the_measured_file(measured, capsys):
    assert simulate.main(["plan", "--profile", "cpu-4", "--costs", str(measured), "--baselines"]) == 0
    printed = capsys.readouterr().out
    assert "best:" in printed and "runner-up:" in printed and "colocated-sync" in printed
    line = next(x for x in printed.splitlines() if "run it:" in x)  # a complete command (issue 33)
    assert line.split("run it: ")[1].startswith("python experiments/run_train.py model.name=tiny-sd3 ")
    assert " system=" in line and " profile=cpu-4" in line
