"""The project's one FLOP count (digenrl/costs/flops.py): an iteration's model FLOPs by phase, the matmul
ceiling a run compares them with (or why there is none), the per-phase fractions folded into the metrics
and the closing summary's line."""

from __future__ import annotations

import pytest

from digenrl.costs.flops import count_flops, iteration_flops, loop_ceiling, model_flops, text_forward_flops
from digenrl.perf import roofline
from digenrl.runtime.hardware.profiles import load_profile
from digenrl.runtime.observe.events import EventLogger
from digenrl.runtime.observe.metrics import fractions_by_phase
from digenrl.runtime.observe.run_report import closing_summary


def test_benchmarks_and_runs_share_one_counter():
    assert roofline.count_flops is count_flops
    counts = model_flops("tiny-sd3", 64, 64)
    assert counts["forward"] > 0 and counts["vae_decode"] > 0
    assert model_flops("tiny-sd3", 128, 128)["forward"] > counts["forward"]  # more tokens, more work


@pytest.mark.parametrize(
    ("model", "frames"),
    [
        ("tiny-sd3", None),
        ("tiny-flux", None),
        ("tiny-qwen-image", None),
        ("tiny-wan", 5),
        ("tiny-hunyuan-video", 5),
    ],
)
def test_every_family_counts_its_forward_and_its_own_vae_decode(model, frames):
    # each family decodes through its own call (Qwen-Image's 5-D VAE takes an image as one frame): a plain
    # vae.decode of the 4-D latent fails there, which a real Qwen-Image run on the H200 hit after iteration 0
    counts = model_flops(model, 64, 64, frames)
    assert counts["forward"] > 0 and counts["vae_decode"] > 0


@pytest.mark.parametrize(
    ("mode", "true_cfg", "cfg_grad", "unit_forwards"),
    [
        ("full", False, "cond", 3),
        ("full", True, "cond", 4),
        ("full", True, "both", 6),
        # a LoRA backward: activation gradients only (one forward of matmul work), issue 33
        ("lora", False, "cond", 2),
        ("lora", True, "cond", 3),
        ("lora", True, "both", 4),
    ],
)
def test_an_iteration_counts_rollout_score_and_train_by_the_model_flops_convention(
    mode, true_cfg, cfg_grad, unit_forwards
):
    counts = {"forward": 10, "vae_decode": 7}
    flops = iteration_flops(
        counts,
        samples=8,
        train_units=40,
        num_steps=6,
        true_cfg=true_cfg,
        cfg_grad=cfg_grad,
        trainer_mode=mode,
    )
    assert flops["rollout"] == 8 * 6 * 10 * (2 if true_cfg else 1)
    assert flops["score"] == 8 * 7
    assert flops["train"] == 40 * unit_forwards * 10
    assert flops["optimizer"] == flops["sync"] == 0
    assert flops["total"] == flops["rollout"] + flops["score"] + flops["train"]


def test_the_ceiling_is_the_profiles_measured_matmul_rate_on_a_gpu_and_absent_on_a_cpu():
    assert loop_ceiling(load_profile("h200-8"), "cuda")[0] == 790.0
    none, why = loop_ceiling(load_profile("h200-8"), "cpu")
    assert none is None and "cpu device" in why
    none, why = loop_ceiling(load_profile("cpu-2"), "cuda")
    assert none is None and "measured_bf16_tflops" in why


def test_per_phase_fractions_and_the_closing_summary_line(tmp_path):
    flops = {
        "rollout": 790e12,
        "score": 0.0,
        "train": 395e12,
        "optimizer": 0.0,
        "sync": 0.0,
        "total": 1185e12,
    }
    phase_seconds = {"trainer": {"train": 1.0, "optimizer": 0.5}, "generator": {"generate": 2.0}}
    fractions = fractions_by_phase(flops, phase_seconds, 790.0)
    assert fractions == {"rollout": 0.5, "score": None, "train": 0.5, "optimizer": 0.0, "sync": None}
    record = {
        "iteration": 0,
        "reward_mean": 0.0,
        "samples": 8,
        "wall_s": 3.0,
        "flops": flops,
        "ceiling_tflops": 790.0,
        "ceiling_source": "profile h200-8",
        "fraction_of_bound": 0.5,
        "fraction_of_bound_by_phase": fractions,
    }
    with EventLogger(tmp_path, 0, "colocated", 0.0) as events:  # the summary's bubble bound reads the logs
        events.record_span("optimizer", 0.0, 1.0, iteration=0)
    summary = closing_summary([record], tmp_path)
    assert (
        "model FLOPs per iteration 1185 TFLOP (rollout 790, score 0, train 395, optimizer 0, sync 0)"
        in summary
    )
    assert "matmul ceiling 790 TFLOP/s (profile h200-8)" in summary
    assert "the loop ran at 50% of its bound (per phase: rollout 50%, train 50%, optimizer 0%)" in summary
    cpu = {**record, "ceiling_tflops": None, "bound_note": "no ceiling on a cpu device"}
    assert "no fraction of the bound: no ceiling on a cpu device" in closing_summary([cpu], tmp_path)


def test_a_forward_of_real_text_tokens_is_quadratic_in_them_exactly():
    """With the padding cut, the text stream's linears grow linearly and joint attention quadratically in
    the real tokens L: three counted forwards give every other length exactly."""
    a, b, c = text_forward_flops("tiny-qwen-image", 32, 32)
    for length in (2, 5, 11, 13):
        counted = model_flops("tiny-qwen-image", 32, 32, text_tokens=length)["forward"]
        assert a + b * length + c * length**2 == pytest.approx(counted, rel=1e-12)
    # the padded, masked forward (the default count) computes all 16 tokens
    assert (
        model_flops("tiny-qwen-image", 32, 32)["forward"]
        == model_flops("tiny-qwen-image", 32, 32, text_tokens=16)["forward"]
    )


@pytest.mark.parametrize(("cfg_grad", "uncond_units"), [("cond", 1), ("both", 2)])
def test_the_unconditional_pass_is_counted_with_its_own_forward(cfg_grad, uncond_units):
    counts = {"forward": 10, "forward_uncond": 4, "vae_decode": 7}
    flops = iteration_flops(
        counts, samples=8, train_units=40, num_steps=6, true_cfg=True, cfg_grad=cfg_grad, trainer_mode="lora"
    )
    assert flops["rollout"] == 8 * 6 * (10 + 4)
    assert flops["train"] == 40 * (2 * 10 + uncond_units * 4)


def test_a_run_with_the_text_padding_cut_counts_the_real_tokens(tmp_path):
    """Qwen-Image's loop under model.text_padding=split: the iteration's FLOPs follow the trained units'
    real text (text_tokens_mean / _sq_mean in the metrics) and the empty prompt's, not the padded length;
    under mask every forward counts the padded length (issue 37 round 4: 0.65 of the bound read for a
    forward that computed a third fewer tokens)."""
    from digenrl.runtime.observe.metrics import read_metrics
    from tests.systems.launcher import run_train

    records = {}
    for mode in ("split", "mask"):
        out = tmp_path / mode
        run_train(
            [
                "system=colocated-sync",
                "profile=cpu-1",
                "model=tiny-qwen-image",
                "sampler.guidance_scale=4.5",
                "iterations=1",
                f"model.text_padding={mode}",
                f"out_dir={out}",
            ]
        )
        (records[mode],) = read_metrics(out)
    split, mask = records["split"], records["mask"]
    full = model_flops("tiny-qwen-image", 32, 32)["forward"]
    steps, samples, units = 8, split["samples"], split["train_units"]  # tiny.yaml: 8 sampler steps
    assert mask["flops"]["rollout"] == samples * steps * 2 * full and "flops_text" not in mask
    assert split["flops_text"] == "real tokens (model.text_padding=split)"
    a, b, c = text_forward_flops("tiny-qwen-image", 32, 32)
    forward = a + b * split["text_tokens_mean"] + c * split["text_tokens_sq_mean"]
    assert 0 < split["text_tokens_mean"] < 16 and forward < full
    uncond = split["flops"]["rollout"] / (samples * steps) - forward
    assert 0 < uncond < full
    assert split["flops"]["train"] == pytest.approx(units * (2 * forward + uncond), rel=1e-9)
