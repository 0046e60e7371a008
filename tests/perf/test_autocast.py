"""model.autocast: 16-bit autocast over the transformer, so fp32 LoRA adapters multiply in bf16."""

from __future__ import annotations

import pytest
import torch

from digenrl.config import Config, ConfigError, apply_overrides
from digenrl.models import TextCondition, build_flow_model
from digenrl.models.optimize import optimize_flow_model
from digenrl.rollout.sampler import Sampler
from digenrl.trainer import PolicyTrainer
from digenrl.trainer.lora import apply_lora
from digenrl.validation import validate_config


def _inputs(flow_model, batch: int = 2):
    text = flow_model.spec.text_encoder
    cond = TextCondition(
        torch.randn(batch, text.seq_len, text.embed_dim),
        None if text.pooled_dim is None else torch.randn(batch, text.pooled_dim),
        torch.ones(batch, text.seq_len, dtype=torch.bool) if text.uses_mask else None,
    )
    return torch.randn(batch, *flow_model.latent_shape(32, 32)), torch.rand(batch), cond


def _lora_layers(flow_model):
    return [m for m in flow_model.transformer.modules() if hasattr(m, "cast_input_dtype_enabled")]


def test_autocast_needs_a_16bit_model_at_startup_and_at_build():
    with pytest.raises(ConfigError, match=r"model\.autocast"):
        validate_config(apply_overrides(Config(), {"model.autocast": True}))
    validate_config(apply_overrides(Config(), {"model.autocast": True, "model.dtype": "bfloat16"}))
    with pytest.raises(ValueError, match=r"model\.autocast"):
        build_flow_model("tiny-sd3").set_autocast(True)


def test_fp32_master_weights_of_a_16bit_model_keep_its_autocast():
    """FSDP2 full fine-tuning on a GPU turns a bf16 model's weights into fp32 master shards before the
    trainer applies model.autocast: autocast then computes in the dtype the model was built in (it raised
    here on one H200 before the trainer passed that dtype)."""
    flow_model = build_flow_model("tiny-sd3", dtype=torch.bfloat16)
    compute_dtype = flow_model.dtype
    flow_model.float()  # what FSDP2's full mode does to the parameters
    optimize_flow_model(
        flow_model, compile=False, attention_backend="native", autocast=True, compute_dtype=compute_dtype
    )
    assert flow_model.autocast_dtype == torch.bfloat16


@pytest.mark.parametrize("name", ["tiny-sd3", "tiny-flux"])
def test_lora_adapters_compute_in_bf16_and_keep_fp32_weights_and_grads(name):
    torch.manual_seed(0)
    flow_model = build_flow_model(name, dtype=torch.bfloat16)
    params = apply_lora(flow_model, rank=4, alpha=8)
    for p in params:  # a non-zero adapter, so the adapter path changes the output
        torch.nn.init.normal_(p, std=0.05)
    x, sigma, cond = _inputs(flow_model)
    plain = flow_model(x, sigma, cond).float()
    assert all(m.cast_input_dtype_enabled for m in _lora_layers(flow_model))

    applied = optimize_flow_model(flow_model, compile=False, attention_backend="native", autocast=True)
    assert applied.autocast and applied.to_dict()["autocast"] is True
    assert flow_model.autocast_dtype == torch.bfloat16
    assert not any(m.cast_input_dtype_enabled for m in _lora_layers(flow_model))

    # the adapter matmul really runs in bf16 under autocast (peft would otherwise cast its input to fp32)
    seen = []
    layer = _lora_layers(flow_model)[0]
    adapter = layer.lora_A[next(iter(layer.lora_A))]
    handle = adapter.register_forward_hook(lambda m, args, out: seen.append((args[0].dtype, out.dtype)))
    out = flow_model(x, sigma, cond)
    handle.remove()
    assert out.dtype == torch.bfloat16 and seen and seen[0] == (torch.bfloat16, torch.bfloat16)
    rel = (out.float() - plain).norm() / plain.norm()
    assert rel < 3e-2, f"autocast forward differs from the plain bf16 one by {rel:.3g}"

    out.float().square().mean().backward()
    assert all(
        p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32 for p in params
    )
    assert any(p.grad.abs().sum() > 0 for p in params)

    flow_model.set_autocast(False)
    assert flow_model.autocast_dtype is None and all(
        m.cast_input_dtype_enabled for m in _lora_layers(flow_model)
    )


def test_adapters_added_after_autocast_follow_it():
    flow_model = build_flow_model("tiny-sd3", dtype=torch.bfloat16)
    flow_model.set_autocast(True)
    apply_lora(flow_model, rank=4, alpha=8)
    assert _lora_layers(flow_model) and not any(m.cast_input_dtype_enabled for m in _lora_layers(flow_model))


def test_trainer_applies_model_autocast_and_the_on_policy_ratio_stays_at_one():
    """The rollout forward and the training forward both run under autocast: the first ratio is 1."""
    torch.manual_seed(0)
    cfg = apply_overrides(
        Config(),
        {
            "model.dtype": "bfloat16",
            "model.autocast": True,
            "trainer.backend": "none",
            "trainer.lora_rank": 4,
            "sampler.guidance_scale": 1.0,
        },
    )
    flow_model = build_flow_model("tiny-sd3", dtype=torch.bfloat16)
    sampler = Sampler.from_config(cfg, flow_model.spec, flow_model.token_count(32, 32))
    trainer = PolicyTrainer(cfg, flow_model, sampler, uncond=None, device="cpu")
    assert trainer.optimizations.autocast and flow_model.autocast_dtype == torch.bfloat16

    from digenrl.perf.bench_trainer import synthetic_batch

    class Args:
        samples, train_steps = 3, 2

    batch = synthetic_batch(
        flow_model, sampler, flow_model.latent_shape(32, 32), Args, None, torch.device("cpu")
    )
    stats = trainer.accumulate(batch, 1.0 / batch.num_units)
    assert stats["units"] == 6
    assert max(abs(stats["ratio_min"] - 1), abs(stats["ratio_max"] - 1)) < 1e-3
    before = [p.detach().clone() for p in trainer.backend.trainable_parameters()]
    trainer.step()
    after = trainer.backend.trainable_parameters()
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))
