"""A non-finite update is never committed: trainer.nonfinite=stop raises naming the iteration and the
quantity, skip drops the step; weights and (with skip) optimizer state are restored bit for bit, and every
trainer rank takes the same decision."""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from digenrl.trainer import PolicyTrainer
from tests.runtime.spawn import spawn_workers

from .fixtures import build_model, make_config, make_sampler, perturb_adapter, rollout_batch


def _trainer(*overrides: str, world_size: int = 1) -> PolicyTrainer:
    cfg = make_config(*overrides)
    model = build_model()
    trainer = PolicyTrainer(
        cfg, model, make_sampler(cfg, model), uncond=None, device="cpu", world_size=world_size
    )
    perturb_adapter(model)
    return trainer


def _accumulate(trainer: PolicyTrainer, seed: int = 8) -> None:
    batch = rollout_batch(trainer.flow_model, trainer.sampler, batch_size=3, num_train_steps=2, seed=seed)
    trainer.accumulate(batch, 1.0 / batch.num_units)


def _state(trainer: PolicyTrainer) -> dict:
    state = trainer.state_dict()
    return {
        "model": {k: v.clone() for k, v in state["model"].items()},
        "optimizer": {
            name: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in entry.items()}
            for name, entry in state["optimizer"]["state"].items()
        },
        "steps": state["steps"],
    }


def _assert_same(a: dict, b: dict) -> None:
    assert a["steps"] == b["steps"]
    assert a["model"].keys() == b["model"].keys()
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    assert a["optimizer"].keys() == b["optimizer"].keys()
    for name, entry in a["optimizer"].items():
        for key, value in entry.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b["optimizer"][name][key])), (
                name,
                key,
            )


def _poison_lr(trainer: PolicyTrainer) -> None:
    """A finite gradient whose step overflows: the parameter check after the step must catch it."""
    for group in trainer.optimizer.param_groups:
        group["lr"] = float("inf")


def test_skip_drops_a_step_with_a_non_finite_gradient_and_training_goes_on():
    trainer = _trainer("trainer.nonfinite=skip")
    _accumulate(trainer)
    trainer.step(0)  # a good step first, so there is optimizer state to keep
    before = _state(trainer)
    _accumulate(trainer, seed=9)
    trainer.backend.trainable_parameters()[0].grad.fill_(float("nan"))
    out = trainer.step(1)
    assert out["nonfinite_skipped"] == 1.0 and out["update_norm"] == 0.0 and out["optimizer_steps"] == 1
    assert all(p.grad is None for p in trainer.backend.trainable_parameters())
    _assert_same(_state(trainer), before)
    _accumulate(trainer, seed=10)
    good = trainer.step(2)
    assert good["nonfinite_skipped"] == 0.0 and good["update_norm"] > 0 and trainer.steps == 2


def test_stop_names_the_iteration_when_the_step_makes_parameters_non_finite():
    trainer = _trainer()  # trainer.nonfinite=stop is the default
    _accumulate(trainer)
    before = _state(trainer)
    _poison_lr(trainer)
    with pytest.raises(FloatingPointError) as info:
        trainer.step(5)
    message = str(info.value)
    assert "non-finite parameters after the optimizer step (first: " in message
    assert "at iteration 5 (optimizer step 0)" in message and "trainer.nonfinite=skip" in message
    assert all(torch.equal(before["model"][n], v) for n, v in trainer.trainable_state_dict().items())
    assert trainer.steps == 0


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_skip_restores_weights_and_optimizer_state_after_a_step_that_overflowed(mode):
    trainer = _trainer("trainer.nonfinite=skip", f"trainer.mode={mode}", "trainer.lr=0.001")
    _accumulate(trainer)
    trainer.step(0)
    before = _state(trainer)
    _accumulate(trainer, seed=9)
    _poison_lr(trainer)
    out = trainer.step(1)
    assert out["nonfinite_skipped"] == 1.0 and out["grad_norm"] > 0  # the gradient itself was finite
    _assert_same(_state(trainer), before)


def _ddp_worker(rank: int, world: int, tmp: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    try:
        trainer = _trainer("trainer.nonfinite=skip", "trainer.backend=ddp", world_size=world)
        _accumulate(trainer, seed=8 + rank)
        trainer.step(0)
        before = {n: v.clone() for n, v in trainer.trainable_state_dict(all_ranks=True).items()}
        _accumulate(trainer, seed=20 + rank)
        if rank == 1:  # only this replica's update goes bad (e.g. a faulty device)
            real_step = trainer.backend.optimizer_step

            def step_then_corrupt(optimizer):
                real_step(optimizer)
                with torch.no_grad():
                    trainer.backend.trainable_parameters()[-1].view(-1)[0] = float("nan")

            trainer.backend.optimizer_step = step_then_corrupt
        out = trainer.step(1)
        after = trainer.trainable_state_dict(all_ranks=True)
        restored = len(after) > 0 and all(torch.equal(before[n], v) for n, v in after.items())
        torch.save({"out": out, "restored": restored}, os.path.join(tmp, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_every_ddp_rank_skips_when_one_rank_s_update_is_non_finite():
    with tempfile.TemporaryDirectory() as tmp:
        spawn_workers(_ddp_worker, 2, (tmp,), limit_s=90)
        results = [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(2)]
    for result in results:
        assert result["out"]["nonfinite_skipped"] == 1.0 and result["restored"]
