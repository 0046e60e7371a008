"""LoRA injection, freezing, default targets per family, and the adapter-disabled reference policy."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from digenrl.models import build_flow_model
from digenrl.trainer import PolicyTrainer, apply_lora, enable_full_finetune, reference_policy
from digenrl.trainer.lora import default_lora_targets

from .fixtures import build_model, make_config, make_sampler, perturb_adapter, random_cond, rollout_batch


def _lora_module_names(transformer: nn.Module) -> set[str]:
    return {n for n, m in transformer.named_modules() if hasattr(m, "lora_A") and len(m.lora_A) > 0}


def _velocity_inputs(flow_model, n: int = 3):
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    x = torch.randn(n, *flow_model.latent_shape(32, 32), generator=g)
    sigma = torch.rand(n, generator=g) * 0.9 + 0.05
    return x, sigma, random_cond(n, g)


def test_lora_trains_only_the_adapter():
    cfg = make_config()
    model = build_model()
    base = {k: v.clone() for k, v in model.transformer.state_dict().items()}
    trainer = PolicyTrainer(cfg, model, make_sampler(cfg, model), uncond=None, device="cpu")
    perturb_adapter(model)  # so that lora_A receives gradient too
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert {n for n, _ in trainer.backend.named_trainable()} == {
        n.removeprefix("transformer.") for n in trainable
    }
    before = {n: p.detach().clone() for n, p in model.transformer.named_parameters()}
    batch = rollout_batch(model, trainer.sampler, batch_size=3, num_train_steps=2, seed=3)
    trainer.accumulate(batch, 1.0 / batch.num_units)
    trainer.step()
    for name, p in model.transformer.named_parameters():
        if "lora_" in name:
            assert not torch.equal(p, before[name]), f"adapter weight {name} did not move"
        else:
            key = name.replace(".base_layer", "")
            assert torch.equal(p, base[key]), f"frozen weight {name} changed"


def test_default_sd3_targets_are_flow_grpos_attention_projections():
    model = build_model()
    pristine = copy.deepcopy(model.transformer)
    apply_lora(model, rank=2, alpha=4)
    wrapped = _lora_module_names(model.transformer)
    expected = {
        n
        for n, m in pristine.named_modules()
        if isinstance(m, nn.Linear) and any(n.endswith("." + t) for t in default_lora_targets("sd3"))
    }
    assert wrapped == expected
    assert any(".attn.add_q_proj" in n for n in wrapped) and any(".attn.to_out.0" in n for n in wrapped)
    assert not any(".attn2." in n or ".ff." in n for n in wrapped)  # flow_grpo leaves these out


@pytest.mark.parametrize("name", ["tiny-flux", "tiny-qwen-image", "tiny-wan", "tiny-hunyuan-video"])
def test_default_targets_exist_in_every_family(name):
    model = build_flow_model(name)
    pristine = copy.deepcopy(model.transformer)
    apply_lora(model, rank=2, alpha=4)
    targets = default_lora_targets(model.spec.family)
    expected = {
        n
        for n, m in pristine.named_modules()
        if isinstance(m, nn.Linear) and any(n.endswith("." + t) for t in targets)
    }
    wrapped = _lora_module_names(model.transformer)
    assert wrapped and wrapped == expected
    # every block's query projection is adapted (the attention is what FlowGRPO's LoRA edits)
    assert any(n.endswith("to_q") for n in wrapped)
    assert all(p.requires_grad == ("lora_" in n) for n, p in model.named_parameters())


def test_unknown_target_is_rejected():
    model = build_model()
    with pytest.raises(ValueError, match=r"attn\.to_qq"):
        apply_lora(model, rank=2, alpha=4, targets=["attn.to_q", "attn.to_qq"])


def test_reference_policy_is_the_base_model_and_restores_the_adapter():
    model = build_model(seed=1)
    base_model = copy.deepcopy(model)
    apply_lora(model, rank=4, alpha=8)
    perturb_adapter(model)
    x, sigma, cond = _velocity_inputs(model)
    with torch.no_grad():
        v_base = base_model(x, sigma, cond)
        v_adapted = model(x, sigma, cond)
        assert (v_adapted - v_base).abs().max() > 1e-3  # the adapter matters
        with reference_policy(model):
            v_ref = model(x, sigma, cond)
        v_after = model(x, sigma, cond)
    torch.testing.assert_close(v_ref, v_base, rtol=0, atol=1e-6)
    assert torch.equal(v_after, v_adapted)
    assert all(p.requires_grad == ("lora_" in n) for n, p in model.named_parameters())


def test_reference_policy_restores_flags_after_an_exception():
    model = build_model()
    apply_lora(model, rank=2, alpha=4)
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    with pytest.raises(RuntimeError, match="boom"), reference_policy(model):
        raise RuntimeError("boom")
    assert flags == {n: p.requires_grad for n, p in model.named_parameters()}


def test_full_mode_trains_everything_and_has_no_reference():
    model = build_model()
    params = enable_full_finetune(model)
    assert len(params) == len(list(model.transformer.parameters()))
    assert all(p.requires_grad for p in model.transformer.parameters())
    with pytest.raises(ValueError, match=r"trainer\.mode=lora"), reference_policy(model):
        pass
