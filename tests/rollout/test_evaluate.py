"""Evaluation (digenrl/rollout/evaluate.py) on the tiny SD3 model in one process: the schedule, fixed noise,
the model's evaluation steps, ODE by default, every reward term, the grid; the startup errors of bad settings.
Whole runs of every system: tests/systems/test_eval_runs.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from digenrl.config import Config, ConfigError, load_config
from digenrl.data.prompts import BUILTIN_EVAL_PROMPTS
from digenrl.models import build_model_bundle
from digenrl.rewards.registry import build_configured_reward
from digenrl.rollout.evaluate import Evaluator, eval_schedule, grid_pixels, local_scoring
from digenrl.rollout.scoring import Scorer
from digenrl.runtime.observe.sample_grid import CELL_PIXELS, write_sample_grid
from digenrl.systems.components import resolve_resolution
from digenrl.validation import validate_config

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "experiments" / "configs" / "tiny.yaml"


def _evaluator(overrides: list[str], bundle=None) -> Evaluator:
    cfg = load_config(None, ["model=tiny-sd3", "eval.every=1", "eval.num_prompts=3", *overrides])
    bundle = bundle or build_model_bundle("tiny-sd3", dtype=torch.float32, device="cpu", seed=0)
    height, width, frames = resolve_resolution(cfg, bundle)
    reward = build_configured_reward(cfg.reward.name, cfg.reward.weights, None, device="cpu")
    return Evaluator.build(
        cfg,
        bundle,
        bundle.flow_model.latent_shape(height, width, frames),
        bundle.flow_model.token_count(height, width, frames),
        local_scoring(Scorer(bundle.decoder, reward, "drop-group")),
        BUILTIN_EVAL_PROMPTS,
        device=torch.device("cpu"),
    )


@pytest.fixture(scope="module")
def bundle():
    return build_model_bundle("tiny-sd3", dtype=torch.float32, device="cpu", seed=0)


def test_the_schedule_is_iteration_zero_every_nth_and_the_final_policy():
    cfg = Config()
    cfg.iterations, cfg.eval.every = 7, 3
    starts = [k for k in range(7) if eval_schedule(cfg, k, final=False)]
    finals = [k for k in range(7) if eval_schedule(cfg, k, final=True)]
    assert starts == [0, 3] and finals == [6]  # 6 is a multiple of 3: the final evaluation replaces it
    cfg.iterations = 1  # iteration 0 is also the last: only the final policy
    assert not eval_schedule(cfg, 0, final=False) and eval_schedule(cfg, 0, final=True)
    cfg.eval.every = 0
    assert not any(eval_schedule(cfg, k, final=f) for k in range(7) for f in (False, True))


def test_two_evaluations_of_the_same_weights_are_identical_and_new_weights_change_them(bundle):
    evaluator = _evaluator([], bundle)
    first = evaluator.run(0, 0)
    again = evaluator.run(5, 5)  # a later evaluation draws the same noise
    assert first.rewards == again.rewards and torch.equal(first.images, again.images)
    assert first.metrics["eval_reward_mean"] == again.metrics["eval_reward_mean"]
    assert first.metrics["eval_policy_version"] == 0 and again.metrics["eval_policy_version"] == 5
    assert first.prompts == list(BUILTIN_EVAL_PROMPTS[:3]) and len(first.rewards) == 3
    param = next(p for p in bundle.flow_model.parameters() if p.ndim == 2)
    original = param.detach().clone()
    try:
        with torch.no_grad():
            param.add_(0.05 * torch.randn(param.shape, generator=torch.Generator().manual_seed(1)))
        changed = evaluator.run(1, 1)
    finally:
        with torch.no_grad():
            param.copy_(original)
    assert changed.rewards != first.rewards  # it evaluates the weights the model holds now
    assert evaluator.run(2, 2).rewards == first.rewards


def test_rollout_calls_of_any_size_draw_the_same_noise(bundle):
    whole = _evaluator([], bundle).run(0, 0)
    one_by_one = _evaluator(["eval.batch_size=1"], bundle).run(0, 0)
    assert one_by_one.rewards == pytest.approx(whole.rewards, abs=1e-6)


def test_the_models_evaluation_steps_and_the_ode_are_the_defaults(bundle):
    default = _evaluator([], bundle)
    assert default.num_steps == bundle.spec.default_eval_num_steps == 16  # tiny-sd3 (FlowGRPO SD3: 40)
    assert default.engine.sampler.noise_level == 0.0
    sde = _evaluator(["eval.sde=true", "eval.num_steps=6"], bundle)
    assert sde.num_steps == 6 and sde.engine.sampler.noise_level == bundle.spec.noise_level > 0
    assert sde.engine.sampler.sigmas.shape == (7,)
    assert sde.run(0, 0).metrics["eval_num_steps"] == 6


def test_every_reward_term_is_reported_beside_their_weighted_sum(bundle):
    result = _evaluator(["reward.weights={brightness: 1.0, colorfulness: 0.5}"], bundle).run(0, 0)
    metrics = result.metrics
    assert {"eval_reward_brightness", "eval_reward_colorfulness"} <= metrics.keys()
    expected = metrics["eval_reward_brightness"] + 0.5 * metrics["eval_reward_colorfulness"]
    assert metrics["eval_reward_mean"] == pytest.approx(expected, rel=1e-6)
    assert metrics["eval_reward_std"] >= 0 and metrics["eval_samples"] == 3


def test_the_grid_holds_one_captioned_cell_per_prompt_and_videos_as_frame_strips(tmp_path):
    from PIL import Image

    images = grid_pixels(torch.rand(3, 3, 16, 16))
    path = write_sample_grid(
        tmp_path / "samples" / "iter_0.png", images, ["a", "b", "c"], [0.5, -1.0, math.nan]
    )
    with Image.open(path) as picture:
        assert picture.format == "PNG" and picture.width > 3 * 16 and picture.height > 16
    video = grid_pixels(torch.rand(2, 3, 9, 8, 8))  # [B, 3, F, H, W] from a video VAE
    assert video.shape == (2, 4, 3, 8, 8) and video.dtype == torch.uint8
    strip = write_sample_grid(tmp_path / "video.png", video, ["x", "y"], [0.1, 0.2])
    with Image.open(strip) as picture:
        assert picture.width >= 4 * CELL_PIXELS  # one row per sample, its 4 frames side by side
        assert 2 * CELL_PIXELS < picture.height < 3 * CELL_PIXELS
    with pytest.raises(ValueError, match="one prompt and one reward per image"):
        write_sample_grid(tmp_path / "bad.png", images, ["a"], [0.1])


# ------------------------------------------------------------------------------------- bad input


def _error(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        validate_config(load_config(TINY, overrides), world_size=2)
    return str(info.value)


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["eval.num_steps=1"], ["eval.num_steps=1", "[2, 1000]"]),
        (["eval.num_prompts=17"], ["eval.num_prompts=17", "data.eval_prompts='builtin:eval'", "16 prompt"]),
        (["eval.use_ema=true"], ["eval.use_ema=true", "trainer.ema_decay"]),
        (["data.eval_prompts=/nonexistent/eval.txt"], ["data.eval_prompts='/nonexistent/eval.txt'"]),
        (["eval.every=0", "eval.sde=true"], ["eval.sde=true", "eval.every > 0"]),
        (["logger.wandb_mode=offline"], ["logger.wandb_mode='offline'", "logger.wandb=true"]),
        (["logger.wandb_mode=sometimes"], ["logger.wandb_mode='sometimes'", "online, offline"]),
    ],
)
def test_evaluation_settings_the_run_cannot_carry_out_fail_at_startup_naming_the_key(overrides, needles):
    message = _error(overrides)
    for needle in needles:
        assert needle in message, (needle, message)


def test_an_empty_eval_prompt_file_fails_at_startup_naming_the_key(tmp_path):
    empty = tmp_path / "eval.txt"
    empty.write_text("\n\n")
    assert f"data.eval_prompts='{empty}'" in _error([f"data.eval_prompts={empty}"])
    few = tmp_path / "few.txt"
    few.write_text("one\ntwo\n")
    assert "eval.num_prompts=4" in _error([f"data.eval_prompts={few}"])  # tiny.yaml evaluates 4


@pytest.mark.skipif(
    __import__("importlib.util").util.find_spec("wandb") is not None, reason="wandb is installed here"
)
def test_wandb_without_the_package_fails_at_startup_naming_the_key():
    assert "logger.wandb=true" in _error(["logger.wandb=true"])
    assert 'pip install -e ".[wandb]"' in _error(["logger.wandb=true"])
