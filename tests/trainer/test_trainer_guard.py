"""GRPO-Guard through the trainer (algo.ratio_norm, algo.step_reweight) on real engine rollouts."""

from __future__ import annotations

import copy

import torch

from digenrl.trainer import PolicyTrainer
from digenrl.trainer.trainer import _behaviour_mean, _gather_units
from tests.tsp.fixtures import PROMPTS, bundle, make_config, make_engine

COMMON = ["sampler.guidance_scale=1.0", "trainer.lora_rank=4", "trainer.lr=0.01", "trainer.grad_clip=1e6"]


def _trainer_and_batch(*overrides: str):
    cfg = make_config(*COMMON, *overrides)
    model = copy.deepcopy(bundle().flow_model)
    engine = make_engine(cfg, flow_model=model)
    torch.manual_seed(0)
    trainer = PolicyTrainer(cfg, model, engine.sampler, uncond=None, device="cpu")
    batch = engine.generate(PROMPTS[:2], [0, 1], iteration=1, policy_version=0)
    batch.rewards = torch.arange(batch.batch_size, dtype=torch.float32)
    batch.advantages = torch.linspace(-1, 1, batch.batch_size)
    return trainer, batch


def test_the_behaviour_mean_is_regenerated_from_the_rollouts_noise():
    trainer, batch = _trainer_and_batch("algo.ratio_norm=true")
    units = [(b, k) for b in range(batch.batch_size) for k in range(batch.num_train_steps)]
    mb = _gather_units(batch, units, torch.device("cpu"))
    with torch.no_grad():
        v = trainer.sampler.velocity(trainer.flow_model, mb.latents, mb.sigmas, mb.cond, None)
        res = trainer.sampler.transition(
            v, mb.latents, mb.sigmas, mb.next_sigmas, prev_sample=mb.next_latents
        )
    # on-policy, μ_θ is the rollout's mean: x' − s·ε recovers it to float rounding
    assert torch.allclose(_behaviour_mean(mb, res.std), res.mean, atol=1e-5)
    stats = trainer.accumulate(batch, 1.0 / batch.num_units)
    assert abs(stats["ratio_min"] - 1) < 1e-6 and abs(stats["ratio_max"] - 1) < 1e-6


def _grads(trainer: PolicyTrainer) -> torch.Tensor:
    return torch.cat(
        [p.grad.reshape(-1) for p in trainer.backend.trainable_parameters() if p.grad is not None]
    )


def test_step_reweight_divides_each_units_gradient_by_its_step_size():
    one_step = ["algo=mixgrpo", "algo.mix_window=1", "algo.mix_shift_interval=1"]  # every unit at step 1
    plain, batch = _trainer_and_batch(*one_step)
    weighted, same = _trainer_and_batch(*one_step, "algo.step_reweight=true")
    assert torch.equal(batch.next_latents, same.next_latents) and batch.step_indices.unique().tolist() == [1]
    plain.accumulate(batch, 1.0 / batch.num_units)
    weighted.accumulate(same, 1.0 / same.num_units)
    dt = float(batch.sigmas[0, 0] - batch.next_sigmas[0, 0])
    g_plain, g_weighted = _grads(plain), _grads(weighted)
    assert g_plain.abs().sum() > 0
    assert torch.allclose(g_weighted, g_plain / dt, rtol=1e-4, atol=1e-9)
