"""step(): global grad norm, clipping, update norm, policy version, gradient reset."""

from __future__ import annotations

import math

import pytest
import torch

from digenrl.trainer import PolicyTrainer

from .fixtures import build_model, grads_by_name, make_config, make_sampler, perturb_adapter, rollout_batch


def _trained_once(*overrides: str):
    cfg = make_config(*overrides)
    model = build_model()
    trainer = PolicyTrainer(cfg, model, make_sampler(cfg, model), uncond=None, device="cpu")
    if cfg.trainer.mode == "lora":
        perturb_adapter(model)
    batch = rollout_batch(model, trainer.sampler, batch_size=3, num_train_steps=2, seed=8)
    trainer.accumulate(batch, 1.0 / batch.num_units)
    return trainer


def test_step_reports_grad_norm_and_update_norm():
    for mode in ("lora", "full"):
        trainer = _trained_once(f"trainer.mode={mode}", "trainer.grad_clip=1000.0")
        grads = grads_by_name(trainer)
        expected_grad_norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads.values()))
        before = trainer.trainable_state_dict()
        out = trainer.step()
        after = trainer.trainable_state_dict()
        expected_update = math.sqrt(
            sum(float((after[n].double() - before[n].double()).pow(2).sum()) for n in after)
        )
        assert expected_update > 0
        assert math.isclose(out["grad_norm"], expected_grad_norm, rel_tol=1e-5)
        assert math.isclose(out["update_norm"], expected_update, rel_tol=1e-6)
        assert trainer.steps == 1 and out["optimizer_steps"] == 1
        assert all(p.grad is None for p in trainer.backend.trainable_parameters())
        if mode == "full":
            assert len(after) == len(list(trainer.flow_model.transformer.parameters()))


def test_gradient_is_clipped_to_the_configured_norm():
    trainer = _trained_once("trainer.grad_clip=0.000001")
    raw = grads_by_name(trainer)
    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in raw.values()))
    assert norm > 1e-5
    reported = trainer.backend.clip_grad_norm(1e-6)
    clipped = grads_by_name(trainer)
    clipped_norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in clipped.values()))
    assert math.isclose(reported, norm, rel_tol=1e-5)
    assert math.isclose(clipped_norm, 1e-6, rel_tol=1e-3)
    for name, g in raw.items():  # same direction
        torch.testing.assert_close(clipped[name], g * (1e-6 / norm), rtol=1e-3, atol=1e-12)


def test_non_finite_gradient_stops_the_step():
    trainer = _trained_once()
    before = trainer.trainable_state_dict()
    trainer.backend.trainable_parameters()[0].grad.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="optimizer step 0"):
        trainer.step()
    after = trainer.trainable_state_dict()
    assert all(torch.equal(before[n], after[n]) for n in before) and trainer.steps == 0
