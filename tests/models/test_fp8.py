"""``model.fp8`` (digenrl/models/fp8.py): which layers run FP8, that a token's result does not depend on
its batch (rowwise scales: the rollout and the trainer batch samples differently), and that the adapter
still trains through FP8 base layers. torchao's float8 path runs on CPU through ``torch._scaled_mm``."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from digenrl.models import TextCondition, build_flow_model
from digenrl.models.fp8 import apply_fp8, count_fp8_layers, fp8_targets
from digenrl.trainer.lora import apply_lora

pytestmark = pytest.mark.needs("torchao")


def _lora_model(name: str = "tiny-sd3", dtype: torch.dtype = torch.bfloat16):
    torch.manual_seed(0)
    fm = build_flow_model(name, dtype=dtype)
    apply_lora(fm, rank=4, alpha=8)
    # a non-zero adapter (B starts at zero), so the adapter's path contributes to the output and gradients
    for n, p in fm.transformer.named_parameters():
        if "lora_B" in n:
            nn.init.normal_(p, std=0.05)
    return fm


def _inputs(fm, batch: int, scales: list[float]):
    """Latents (sample i scaled by ``scales[i]``), sigmas and a text condition of tiny-sd3's shape."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 4, 8, 8, generator=gen) * torch.tensor(scales).view(-1, 1, 1, 1)
    embeds = torch.randn(batch, 16, 32, generator=gen)
    cond = TextCondition(embeds, pooled=torch.randn(batch, 32, generator=gen))
    return x.to(fm.dtype), torch.full((batch,), 0.6), cond


def test_fp8_converts_the_frozen_token_wise_linears_of_the_blocks_only():
    fm = _lora_model()
    keys_before = list(fm.transformer.state_dict())
    trainable_before = [n for n, p in fm.transformer.named_parameters() if p.requires_grad]
    expected = {f"{id(parent)}.{attr}" for parent, attr, _ in fp8_targets(fm.transformer)}
    converted = apply_fp8(fm)
    assert converted == len(expected) == count_fp8_layers(fm.transformer) > 0
    names = [n for n, m in fm.transformer.named_modules() if type(m).__name__ == "Float8Linear"]
    assert all(n.startswith("transformer_blocks.") for n in names)  # nothing outside the repeated blocks
    assert not any("lora_" in n for n in names)  # the adapter stays 16/32-bit
    assert not any(".norm1" in n for n in names)  # AdaLN modulation stays 16-bit
    assert any(n.endswith("attn.to_q.base_layer") for n in names)  # a LoRA-wrapped base projection
    assert any(".ff.net." in n for n in names)  # frozen MLPs too
    # checkpoints, weight sync and LoRA export see the same parameters
    assert list(fm.transformer.state_dict()) == keys_before
    assert [n for n, p in fm.transformer.named_parameters() if p.requires_grad] == trainable_before
    assert apply_fp8(fm) == 0  # a second call (a generator prepared twice) converts nothing more


def test_fp8_token_results_do_not_depend_on_the_batch_and_stay_close_to_bf16():
    fm = _lora_model()
    reference = copy.deepcopy(fm)
    apply_fp8(fm)
    # samples of very different magnitude: a per-tensor scale would be set by the largest
    x, t, cond = _inputs(fm, 3, [1.0, 8.0, 0.125])
    with torch.no_grad():
        together = fm(x, t, cond).float()
        alone = torch.cat([fm(x[i : i + 1], t[i : i + 1], cond[i : i + 1]).float() for i in range(3)])
        bf16 = reference(x, t, cond).float()
    assert torch.equal(together, alone)
    rel = (together - bf16).norm() / bf16.norm()
    assert 0 < rel < 0.1, rel  # FP8 changes the numbers (the layers did convert), by quantisation noise

    # the contrast the rowwise recipe exists for: tensorwise scales make sample 0 depend on sample 1
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    tensorwise = copy.deepcopy(reference)
    chosen = {id(m) for _, _, m in fp8_targets(tensorwise.transformer)}
    convert_to_float8_training(
        tensorwise.transformer,
        module_filter_fn=lambda m, _fqn: id(m) in chosen,
        config=Float8LinearConfig.from_recipe_name("tensorwise"),
    )
    with torch.no_grad():
        shared = tensorwise(x, t, cond).float()[:1]
        single = tensorwise(x[:1], t[:1], cond[:1]).float()
    assert not torch.equal(shared, single)


def test_the_adapter_trains_through_fp8_base_layers():
    fm = _lora_model()
    reference = copy.deepcopy(fm)
    apply_fp8(fm)
    x, t, cond = _inputs(fm, 2, [1.0, 1.0])
    grads = []
    for model in (reference, fm):
        model.transformer.zero_grad(set_to_none=True)
        model(x, t, cond).float().square().mean().backward()
        grads.append(
            torch.cat([p.grad.flatten() for n, p in model.transformer.named_parameters() if "lora_" in n])
        )
        frozen = [p for n, p in model.transformer.named_parameters() if "lora_" not in n]
        assert all(p.grad is None for p in frozen)
    bf16, fp8 = grads
    assert fp8.abs().sum() > 0
    cosine = torch.nn.functional.cosine_similarity(bf16, fp8, dim=0)
    assert cosine > 0.98, cosine


def test_a_model_without_fp8_sized_layers_is_refused():
    fm = build_flow_model("tiny-wan")  # width 24: no block linear has dimensions divisible by 16
    apply_lora(fm, rank=4, alpha=8)
    with pytest.raises(ValueError, match="divisible by 16"):
        apply_fp8(fm)
