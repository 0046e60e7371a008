"""The one full-state loader (``ParallelBackend.load_full_state``): names and shapes are checked before a
tensor is written, and a gathered state loads back exactly (multi-rank and DeepSpeed layouts:
test_trainer_distributed.py, test_trainer_deepspeed.py)."""

from __future__ import annotations

import pytest
import torch

from digenrl.trainer import PolicyTrainer

from .fixtures import build_model, make_config, make_sampler


@pytest.fixture
def trainer() -> PolicyTrainer:
    cfg, model = make_config(), build_model()
    return PolicyTrainer(cfg, model, make_sampler(cfg, model), uncond=None, device="cpu")


def test_a_gathered_state_loads_back_exactly(trainer):
    saved = trainer.trainable_state_dict()
    with torch.no_grad():
        for p in trainer.backend.trainable_parameters():
            p.add_(1.0)
    trainer.load_trainable_state_dict(saved)
    assert all(torch.equal(saved[n], p.detach()) for n, p in trainer.backend.named_trainable())


def test_missing_and_unexpected_names_are_refused_before_any_write(trainer):
    state = trainer.trainable_state_dict()
    before = {n: t.clone() for n, t in state.items()}
    first = next(iter(state))
    bad = {("bogus." + first if n == first else n): t + 1 for n, t in state.items()}
    with pytest.raises(ValueError, match=r"missing \[.*" + first.split(".")[-1] + r".*unexpected \['bogus\."):
        trainer.load_trainable_state_dict(bad)
    assert all(torch.equal(before[n], p.detach()) for n, p in trainer.backend.named_trainable())


def test_a_wrong_shape_names_the_parameter(trainer):
    state = trainer.trainable_state_dict()
    name = next(iter(state))
    state[name] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match=rf"trainable state '{name}' has shape \(3, 3\), model \("):
        trainer.load_trainable_state_dict(state)
