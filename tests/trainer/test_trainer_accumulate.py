"""accumulate(): exact gradient accumulation over micro-batches and calls, the objective against an
independent float64 implementation of FlowGRPO's loss, and on-policy ratios."""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch

from digenrl.data.micro_batches import plan_micro_batches
from digenrl.trainer import PolicyTrainer

from .fixtures import (
    build_model,
    empty_cond,
    grads_by_name,
    make_config,
    make_sampler,
    perturb_adapter,
    rollout_batch,
    select,
)


def _trainer(*overrides: str, uncond=None, seed: int = 0) -> PolicyTrainer:
    cfg = make_config(*overrides)
    model = build_model(seed)
    trainer = PolicyTrainer(cfg, model, make_sampler(cfg, model), uncond=uncond, device="cpu")
    if cfg.trainer.mode == "lora":
        perturb_adapter(model)  # a non-zero adapter: non-zero lora_A gradients and a non-zero KL
    return trainer


def _assert_same_grads(a: dict, b: dict, atol: float = 1e-6) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


def test_gradient_does_not_depend_on_how_units_are_split():
    trainer = _trainer("algo.kl_beta=0.04")
    batch = rollout_batch(trainer.flow_model, trainer.sampler, batch_size=4, num_train_steps=2, seed=11)
    weight = 1.0 / batch.num_units  # 8 units

    trainer.cfg.trainer.micro_batch_size = 8  # one micro-batch of 8 units
    whole = trainer.accumulate(batch, weight)
    g_whole = grads_by_name(trainer)
    trainer.zero_grad()

    trainer.cfg.trainer.micro_batch_size = 2  # four micro-batches of 2
    trainer.accumulate(batch, weight)
    g_four = grads_by_name(trainer)
    trainer.zero_grad()

    trainer.cfg.trainer.micro_batch_size = 4  # two accumulate calls (two GAP fragments) of 4 units
    first = trainer.accumulate(select(batch, [0, 1]), weight)
    second = trainer.accumulate(select(batch, [2, 3]), weight)
    g_two = grads_by_name(trainer)

    assert max(g.abs().max() for g in g_whole.values()) > 1e-4  # a real gradient, not all zeros
    _assert_same_grads(g_whole, g_four)
    _assert_same_grads(g_whole, g_two)
    assert whole["units"] == first["units"] + second["units"] == 8
    assert whole["kl_sum"] > 0
    assert math.isclose(whole["loss_sum"], first["loss_sum"] + second["loss_sum"], rel_tol=1e-5, abs_tol=1e-6)


def _reference_objective(model64, base64, batch, *, noise_level, sigma_max, clip_range, kl_beta):
    """FlowGRPO's mean loss over all units, written out in float64 from docs/algorithm.md (flow-SDE mean,
    Gaussian log-prob averaged over dims, PPO clip, KL / (2σ_t²)) — independent of digenrl.algo."""
    b_idx, k_idx = torch.meshgrid(
        torch.arange(batch.batch_size), torch.arange(batch.num_train_steps), indexing="ij"
    )
    b_idx, k_idx = b_idx.reshape(-1), k_idx.reshape(-1)
    x = batch.latents[b_idx, k_idx].double()
    x_next = batch.next_latents[b_idx, k_idx].double()
    s = batch.sigmas[b_idx, k_idx].double()
    s_next = batch.next_sigmas[b_idx, k_idx].double()
    cond = batch.cond.index_select(b_idx)
    cond = type(cond)(embeds=cond.embeds.double(), pooled=cond.pooled.double())
    shape = (-1, 1, 1, 1)

    def mean_of(model):
        v = model(x, s, cond).double()
        sig, dt = s.view(shape), (s_next - s).view(shape)
        denom = torch.where(sig >= 1.0, torch.full_like(sig, 1.0 - sigma_max), 1.0 - sig)
        sigma_t = noise_level * torch.sqrt(sig / denom)
        mu = x + dt * (v + sigma_t**2 / (2 * sig) * (x + (1 - sig) * v))
        return mu, sigma_t, sigma_t * torch.sqrt(-dt)

    mu, sigma_t, std = mean_of(model64)
    logp = (-((x_next - mu) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi)).mean(
        dim=(1, 2, 3)
    )
    ratio = torch.exp(logp - batch.log_probs[b_idx, k_idx].double())
    adv = batch.advantages[b_idx].double()
    loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip_range, 1 + clip_range))
    with torch.no_grad():
        mu_ref, _, _ = mean_of(base64)
    kl = ((mu - mu_ref) ** 2 / (2 * sigma_t**2)).mean(dim=(1, 2, 3))
    return (loss + kl_beta * kl).mean(), loss.detach(), ratio.detach()


def test_gradient_matches_an_independent_float64_objective():
    trainer = _trainer("algo.kl_beta=0.04", "algo.clip_range=0.0003", "trainer.micro_batch_size=3")
    model = trainer.flow_model
    base64 = build_model(0).double()  # the model before LoRA: the reference policy
    rollout = rollout_batch(model, trainer.sampler, batch_size=3, num_train_steps=3, seed=5)
    with torch.no_grad():  # an update happened since the rollout: ratios spread, some get clipped
        for name, p in model.transformer.named_parameters():
            if "lora_A" in name:
                p.add_(torch.randn_like(p) * 0.3)
    stats = trainer.accumulate(rollout, 1.0 / rollout.num_units)
    grads = grads_by_name(trainer)

    model64 = copy.deepcopy(model).double()
    model64.zero_grad(set_to_none=True)
    objective, loss, ratio = _reference_objective(
        model64,
        base64,
        rollout,
        noise_level=trainer.sampler.noise_level,
        sigma_max=float(trainer.sampler.sigmas[1]),
        clip_range=0.0003,
        kl_beta=0.04,
    )
    objective.backward()
    ref = {n: p.grad.float() for n, p in model64.transformer.named_parameters() if p.grad is not None}
    assert 0 < stats["clipped_count"] < stats["units"]  # both branches of the clip are exercised
    assert math.isclose(stats["loss_sum"], float(loss.sum()), rel_tol=1e-4, abs_tol=1e-5)
    assert math.isclose(stats["ratio_min"], float(ratio.min()), rel_tol=1e-5)
    assert math.isclose(stats["ratio_max"], float(ratio.max()), rel_tol=1e-5)
    assert grads.keys() == ref.keys()
    scale = max(g.abs().max() for g in ref.values())
    for name in ref:
        torch.testing.assert_close(grads[name], ref[name], rtol=1e-3, atol=1e-4 * float(scale))


def test_ratio_is_exactly_one_on_policy_with_the_rollout_composition():
    trainer = _trainer("trainer.micro_batch_size=4", "algo.kl_beta=0.01")
    batch = rollout_batch(trainer.flow_model, trainer.sampler, batch_size=4, num_train_steps=3, seed=2)
    stats = trainer.accumulate(batch, 1.0 / batch.num_units)
    assert stats["ratio_min"] == 1.0 and stats["ratio_max"] == 1.0
    assert stats["clipped_count"] == 0
    trainer.zero_grad()
    trainer.cfg.trainer.micro_batch_size = 1  # another batch composition: ratio only ≈ 1
    spread = trainer.accumulate(batch, 1.0 / batch.num_units)
    print(
        f"ratio spread with micro-batch 1 vs rollout batch 4: [{spread['ratio_min']}, {spread['ratio_max']}]"
    )
    assert abs(spread["ratio_min"] - 1) < 1e-3 and abs(spread["ratio_max"] - 1) < 1e-3


def test_classifier_free_guidance_training_forward_matches_the_rollout():
    uncond = empty_cond()
    trainer = _trainer("sampler.guidance_scale=4.5", "trainer.micro_batch_size=3", uncond=uncond)
    assert trainer.sampler.true_cfg
    batch = rollout_batch(
        trainer.flow_model, trainer.sampler, batch_size=3, num_train_steps=2, seed=4, uncond=uncond
    )
    stats = trainer.accumulate(batch, 1.0 / batch.num_units)
    assert stats["ratio_min"] == 1.0 and stats["ratio_max"] == 1.0
    assert any(g.abs().max() > 0 for g in grads_by_name(trainer).values())


def test_bad_inputs_are_rejected():
    trainer = _trainer()
    batch = rollout_batch(trainer.flow_model, trainer.sampler, batch_size=2, num_train_steps=1, seed=1)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="unit_weight"):
            trainer.accumulate(batch, bad)
    batch.advantages = None
    with pytest.raises(ValueError, match="advantages"):
        trainer.accumulate(batch, 0.5)


def test_micro_batch_plan_covers_every_unit_once():
    for _ in range(50):
        b, k, m = random.randint(0, 9), random.randint(0, 5), random.randint(1, 7)
        plan = plan_micro_batches(b, k, m)
        units = [u for mb in plan for u in mb]
        assert sorted(units) == [(i, j) for i in range(b) for j in range(k)]
        assert all(0 < len(mb) <= max(m, b) for mb in plan)
        if b >= m:  # rollout-aligned: one timestep per micro-batch, samples in rollout order
            assert all(len({j for _, j in mb}) == 1 for mb in plan)
            assert all([i for i, _ in mb] == list(range(mb[0][0], mb[0][0] + len(mb))) for mb in plan)
            # flow_grpo's loop order: chunk by chunk of samples, each chunk's timesteps in turn
            chunks = [list(range(i, min(i + m, b))) for i in range(0, b, m)]
            assert plan == [[(i, j) for i in chunk] for chunk in chunks for j in range(k)]
        elif b > 0:  # small shares: whole timestep rows packed together, micro-batches stay full
            assert all(len(mb) % b == 0 and len(mb) <= m for mb in plan)
    with pytest.raises(ValueError, match="micro_batch_size"):
        plan_micro_batches(2, 2, 0)
