"""FlowModel: shapes, batch consistency, packing, guidance handling, attention-backend hook."""

from __future__ import annotations

import diffusers
import pytest
import torch

from digenrl.models import (
    FlowModel,
    TextCondition,
    available_attention_backends,
    pack_2x2,
    set_attention_backend,
    unpack_2x2,
)
from digenrl.models.latent_packing import flux_image_ids

TINY_NAMES = ["tiny-sd3", "tiny-flux", "tiny-qwen-image", "tiny-wan", "tiny-hunyuan-video"]


def _inputs(bundle, batch: int):
    spec = bundle.spec
    shape = bundle.flow_model.latent_shape(spec.default_height, spec.default_width, spec.default_frames)
    prompts = ["a cat", "a very long prompt about a dog riding a skateboard", "", "tree"][:batch]
    prompts += [f"prompt {i}" for i in range(batch - len(prompts))]
    cond = bundle.text_encoder.encode(prompts)
    return torch.randn(batch, *shape), torch.rand(batch), cond


@pytest.mark.parametrize("name", TINY_NAMES)
def test_forward_shape_dtype_and_finite(name, bundles):
    bundle = bundles(name)
    x, sigma, cond = _inputs(bundle, 3)
    with torch.no_grad():
        v = bundle.flow_model(x, sigma, cond)
    assert v.shape == x.shape
    assert v.dtype == bundle.flow_model.dtype
    assert torch.isfinite(v).all()
    assert v.abs().mean() > 0


@pytest.mark.parametrize("name", TINY_NAMES)
def test_batch_of_four_equals_per_sample_forwards(name, bundles):
    bundle = bundles(name)
    x, sigma, cond = _inputs(bundle, 4)
    guidance = torch.tensor([1.0, 2.5, 4.0, 7.0]) if bundle.flow_model.embeds_guidance else None
    with torch.no_grad():
        batched = bundle.flow_model(x, sigma, cond, guidance=guidance)
        singles = [
            bundle.flow_model(
                x[i : i + 1], sigma[i : i + 1], cond[i], guidance=None if guidance is None else guidance[i]
            )
            for i in range(4)
        ]
    torch.testing.assert_close(batched, torch.cat(singles), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", TINY_NAMES)
def test_output_depends_on_sigma_and_text(name, bundles):
    bundle = bundles(name)
    x, sigma, cond = _inputs(bundle, 2)
    with torch.no_grad():
        base = bundle.flow_model(x, sigma, cond)
        other_sigma = bundle.flow_model(x, (sigma + 0.3) % 1.0, cond)
        swapped_text = bundle.flow_model(x, sigma, cond.index_select([1, 0]))
    assert not torch.allclose(base, other_sigma)
    assert not torch.allclose(base, swapped_text)


def test_sigma_scalar_broadcasts(bundles):
    bundle = bundles("tiny-sd3")
    x, _, cond = _inputs(bundle, 2)
    with torch.no_grad():
        a = bundle.flow_model(x, 0.4, cond)
        b = bundle.flow_model(x, torch.full((2,), 0.4), cond)
    torch.testing.assert_close(a, b)


def test_guidance_embedding_changes_flux_output_and_defaults_to_spec(bundles):
    bundle = bundles("tiny-flux")
    x, sigma, cond = _inputs(bundle, 2)
    with torch.no_grad():
        default = bundle.flow_model(x, sigma, cond)
        explicit = bundle.flow_model(x, sigma, cond, guidance=bundle.spec.default_guidance_scale)
        other = bundle.flow_model(x, sigma, cond, guidance=9.0)
    torch.testing.assert_close(default, explicit)
    assert not torch.allclose(default, other)
    assert not bundle.flow_model.uses_true_cfg


def test_guidance_rejected_without_guidance_embedding(bundles):
    bundle = bundles("tiny-sd3")
    x, sigma, cond = _inputs(bundle, 1)
    assert bundle.flow_model.uses_true_cfg
    with pytest.raises(ValueError, match="guidance"):
        bundle.flow_model(x, sigma, cond, guidance=3.0)


def test_bad_inputs_raise_value_errors(bundles):
    fm: FlowModel = bundles("tiny-sd3").flow_model
    x, sigma, cond = _inputs(bundles("tiny-sd3"), 2)
    with pytest.raises(ValueError, match="sigma"):
        fm(x, torch.rand(3), cond)
    with pytest.raises(ValueError, match="batch"):
        fm(x, sigma, cond[0])
    with pytest.raises(ValueError, match="latents shape"):
        fm(x[:, :2], sigma, cond)
    with pytest.raises(ValueError, match="height"):
        fm.latent_shape(30, 32)
    with pytest.raises(ValueError, match="frames"):
        fm.latent_shape(32, 32, frames=5)
    with pytest.raises(ValueError, match="frames"):
        bundles("tiny-wan").flow_model.latent_shape(32, 32, frames=6)


def test_latent_shapes_follow_vae_factors(bundles):
    assert bundles("tiny-sd3").flow_model.latent_shape(64, 32) == (4, 16, 8)  # 4x VAE
    assert bundles("tiny-qwen-image").flow_model.latent_shape(64, 32) == (4, 8, 4)  # 8x VAE
    assert bundles("tiny-wan").flow_model.latent_shape(32, 48, frames=9) == (4, 3, 4, 6)  # 4x temporal
    assert bundles("tiny-hunyuan-video").flow_model.latent_shape(32, 32, frames=1) == (4, 1, 4, 4)
    assert bundles("tiny-flux").flow_model.token_count(32, 32) == 16  # 8x8 latent, 2x2 packing
    assert bundles("tiny-wan").flow_model.token_count(32, 32, frames=5) == 2 * 2 * 2


def test_pack_unpack_round_trip_is_exact_and_matches_diffusers_layout():
    b, c, h, w = 3, 5, 6, 10
    x = torch.randn(b, c, h, w)
    packed = pack_2x2(x)
    assert torch.equal(unpack_2x2(packed, h, w), x)
    # independent reference: the FLUX pipeline's own static helper
    assert torch.equal(packed, diffusers.FluxPipeline._pack_latents(x, b, c, h, w))
    # an explicit element: token (row r, col q), channel order (c, dy, dx)
    r, q, ch, dy, dx = 1, 3, 2, 1, 0
    assert packed[0, r * (w // 2) + q, ch * 4 + dy * 2 + dx] == x[0, ch, 2 * r + dy, 2 * q + dx]


def test_flux_image_ids_match_diffusers():
    ids = flux_image_ids(6, 8, device=torch.device("cpu"), dtype=torch.float32)
    ref = diffusers.FluxPipeline._prepare_latent_image_ids(1, 3, 4, torch.device("cpu"), torch.float32)
    assert torch.equal(ids, ref)


def test_attention_backend_hook(bundles):
    bundle = bundles("tiny-sd3")
    assert "native" in available_attention_backends()
    with pytest.raises(ValueError, match="attention backend"):
        set_attention_backend(bundle.flow_model, "warp-speed")
    with pytest.raises(ValueError, match="attention backend"):
        set_attention_backend(bundle.flow_model, "flash_hub")
    x, sigma, cond = _inputs(bundle, 2)
    with torch.no_grad():
        before = bundle.flow_model(x, sigma, cond)
        set_attention_backend(bundle.flow_model, "native")
        after = bundle.flow_model(x, sigma, cond)
    torch.testing.assert_close(before, after)


def test_transformer_is_plain_attribute_for_lora_and_fsdp(bundles):
    fm = bundles("tiny-sd3").flow_model
    assert "transformer" in dict(fm.named_children())
    assert isinstance(fm.transformer, diffusers.SD3Transformer2DModel)


def test_bf16_forward_runs_and_returns_model_dtype():
    from digenrl.models import build_flow_model

    fm = build_flow_model("tiny-flux", dtype=torch.bfloat16)
    assert fm.dtype == torch.bfloat16
    cond = TextCondition(torch.randn(2, 16, 32), pooled=torch.randn(2, 16))
    with torch.no_grad():
        v = fm(torch.randn(2, 4, 8, 8), torch.rand(2), cond)
    assert v.dtype == torch.bfloat16 and torch.isfinite(v.float()).all()


def test_wan_keeps_fp32_modules_in_half_precision():
    from digenrl.models import build_flow_model

    fm = build_flow_model("tiny-wan", dtype=torch.bfloat16)
    dtypes = {n: p.dtype for n, p in fm.transformer.named_parameters()}
    assert dtypes["scale_shift_table"] == torch.float32  # in WanTransformer3DModel._keep_in_fp32_modules
    assert dtypes["proj_out.weight"] == torch.bfloat16
    assert fm.dtype == torch.bfloat16  # the compute dtype, not the first (fp32-kept) parameter's
    cond = TextCondition(torch.randn(1, 16, 32))
    with torch.no_grad():
        v = fm(torch.randn(1, 4, 2, 4, 4), torch.rand(1), cond)
    assert v.dtype == torch.bfloat16 and torch.isfinite(v.float()).all()


def test_bf16_model_compiles_whole_because_no_buffer_keeps_a_float32_base():
    """cast_floating replaces buffers: SD3's pos_embed is registered as a view of a float32 tensor, and a
    bf16 ``.data`` under that float32 ``_base`` made ``torch.compile`` of the whole transformer (mode
    reduce-overhead, issue 37) fail its fake-tensor check. Compiled with dynamo alone, it runs and gives the
    eager output."""
    from digenrl.models import TextCondition, build_flow_model, get_model_spec
    from digenrl.models.optimize import CompileSettings, compile_flow_model

    spec = get_model_spec("tiny-sd3")
    torch.manual_seed(0)
    fm = build_flow_model(spec, dtype=torch.bfloat16, device=torch.device("cpu"))
    views = [n for n, b in fm.transformer.named_buffers() if b._base is not None and b._base.dtype != b.dtype]
    assert views == []
    x = torch.randn(2, *fm.latent_shape(32, 32, None), dtype=torch.bfloat16)
    cond = TextCondition.random(spec.text_encoder, 2, device=torch.device("cpu"), dtype=torch.bfloat16)
    sigma = torch.full((2,), 0.5)
    with torch.no_grad():
        eager = fm(x, sigma, cond)
        compile_flow_model(fm, CompileSettings(backend="eager", regional=False))
        compiled = fm(x, sigma, cond)
    assert torch.equal(eager, compiled)
