"""MixGRPO through the rollout engine and the trainer: the window is the only stochastic and trained part,
MixGRPO-Flash changes only the steps after it, and a window over every step is FlowGRPO's update."""

from __future__ import annotations

import copy

import torch

from digenrl.trainer import PolicyTrainer
from tests.tsp.fixtures import PROMPTS, bundle, make_config, make_engine
from tests.tsp.test_tsp_engine_split import _reference, assert_identical

MIX = ["algo=mixgrpo", "algo.mix_shift_interval=2", "algo.mix_stride=2"]


def test_the_engine_trains_and_perturbs_only_the_window_of_the_iteration():
    engine = make_engine(make_config(*MIX, "algo.mix_window=2"))
    out = engine.generate(PROMPTS[:2], [0, 1], iteration=3, policy_version=0)  # 3 // 2 = 1: start 2
    assert out.step_indices.tolist() == [[2, 3]] * 4
    ref = _reference(engine, PROMPTS[:2], [0, 1], 3, 0, out.step_indices)
    for name in ("latents", "next_latents", "log_probs", "final_latents"):
        assert torch.equal(getattr(out, name), ref[name]), name
    first = make_engine(make_config(*MIX, "algo.mix_window=2")).generate(
        PROMPTS[:2], [0, 1], iteration=0, policy_version=0
    )
    assert first.step_indices.tolist() == [[0, 1]] * 4  # iteration 0: the window starts at step 0


def test_flash_changes_only_the_steps_after_the_window():
    euler = make_engine(make_config(*MIX, "algo.mix_window=2"))
    flash = make_engine(make_config(*MIX, "algo.mix_window=2", "algo.mix_ode_solver=dpm2"))
    a = euler.generate(PROMPTS[:2], [0, 1], iteration=0, policy_version=0)  # window [0, 2), ODE after
    b = flash.generate(PROMPTS[:2], [0, 1], iteration=0, policy_version=0)
    for name in ("latents", "next_latents", "log_probs"):  # the trained window is untouched
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    gap = (a.final_latents - b.final_latents).abs().max().item()
    assert 0 < gap < 0.5 * a.final_latents.abs().max().item()


def _one_update(cfg, batch):
    model = copy.deepcopy(bundle().flow_model)
    engine = make_engine(cfg, flow_model=model)
    torch.manual_seed(0)  # the LoRA initialisation
    trainer = PolicyTrainer(cfg, model, engine.sampler, uncond=None, device="cpu")
    batch.rewards = torch.arange(batch.batch_size, dtype=torch.float32)
    batch.advantages = torch.linspace(-1, 1, batch.batch_size)
    trainer.accumulate(batch, 1.0 / batch.num_units)
    metrics = trainer.step()
    return {k: v.detach().clone() for k, v in trainer.trainable_state_dict().items()}, metrics


def test_a_window_over_every_step_is_flowgrpos_update():
    common = ["sampler.guidance_scale=1.0", "trainer.lora_rank=4", "trainer.lr=0.01"]
    flow_cfg = make_config("algo.timestep_fraction=1.0", *common)
    mix_cfg = make_config(*MIX, "algo.mix_window=6", *common)
    flow = make_engine(flow_cfg).generate(PROMPTS[:2], [0, 1], iteration=5, policy_version=0)
    mix = make_engine(mix_cfg).generate(PROMPTS[:2], [0, 1], iteration=5, policy_version=0)
    assert flow.step_indices.tolist() == [list(range(6))] * 4
    assert_identical(flow, mix)
    flow_weights, flow_metrics = _one_update(flow_cfg, flow)
    mix_weights, _ = _one_update(mix_cfg, mix)
    assert flow_metrics["update_norm"] > 0
    assert flow_weights.keys() == mix_weights.keys()
    for key in flow_weights:
        assert torch.equal(flow_weights[key], mix_weights[key]), key


def test_a_tsp_split_of_a_mixgrpo_rollout_equals_generate():
    """The window travels with the batch (its trained steps), so a stage on another engine reproduces it."""
    cfg = make_config(*MIX, "algo.mix_window=2")
    whole = make_engine(cfg).generate(PROMPTS[:2], [0, 1], iteration=3, policy_version=0)
    other = make_engine(cfg, flow_model=copy.deepcopy(bundle().flow_model))
    for cut in (1, 3, 5):
        first = make_engine(cfg).start(PROMPTS[:2], [0, 1], iteration=3, policy_version=0)
        assert_identical(other.advance(make_engine(cfg).advance(first, cut), 6), whole)
