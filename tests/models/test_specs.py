"""Registry, published configurations (parameter counts on the meta device) and schedule shifts."""

from __future__ import annotations

import math

import diffusers
import numpy as np
import pytest
import torch

from digenrl.models import MODEL_SPECS, build_flow_model, get_model_spec
from digenrl.models.construction import build_transformers_config, instantiate_transformers_model

REAL_NAMES = ["sd3.5-medium", "flux.1-dev", "qwen-image", "wan2.1-1.3b", "wan2.1-14b", "hunyuan-video"]
TINY_NAMES = ["tiny-sd3", "tiny-flux", "tiny-qwen-image", "tiny-wan", "tiny-hunyuan-video"]

# docs/algorithm.md, "Model configurations" table (billions of parameters).
EXPECTED_BILLIONS = {
    "flux.1-dev": 11.9,
    "sd3.5-medium": 2.24,
    "qwen-image": 20.4,
    "wan2.1-14b": 14.3,
    "wan2.1-1.3b": 1.42,
    "hunyuan-video": 12.8,
}


def test_registry_has_every_real_and_tiny_entry():
    assert set(REAL_NAMES) | set(TINY_NAMES) == set(MODEL_SPECS)
    families = {MODEL_SPECS[n].family for n in TINY_NAMES}
    assert families == {MODEL_SPECS[n].family for n in REAL_NAMES}


def test_unknown_model_name_lists_allowed_names():
    with pytest.raises(ValueError, match=r"model\.name") as err:
        get_model_spec("sd4-ultra")
    assert "tiny-sd3" in str(err.value) and "flux.1-dev" in str(err.value)


@pytest.mark.parametrize("name", REAL_NAMES)
def test_real_transformer_parameter_count_matches_table(name):
    flow_model = build_flow_model(name, device="meta")
    count = sum(p.numel() for p in flow_model.transformer.parameters())
    assert all(p.is_meta for p in flow_model.transformer.parameters())
    expected = EXPECTED_BILLIONS[name] * 1e9
    assert abs(count - expected) / expected < 0.02, f"{name}: {count / 1e9:.3f} B vs {expected / 1e9} B"


def test_real_block_structure_matches_table():
    cfg = {n: MODEL_SPECS[n].transformer_config for n in REAL_NAMES}
    assert (cfg["flux.1-dev"]["num_layers"], cfg["flux.1-dev"]["num_single_layers"]) == (19, 38)
    assert cfg["sd3.5-medium"]["dual_attention_layers"] == list(range(13))
    assert cfg["qwen-image"]["num_layers"] == 60
    assert (cfg["wan2.1-14b"]["num_layers"], cfg["wan2.1-14b"]["ffn_dim"]) == (40, 13824)
    assert (cfg["wan2.1-1.3b"]["num_attention_heads"], cfg["wan2.1-1.3b"]["ffn_dim"]) == (12, 8960)
    assert (cfg["hunyuan-video"]["num_layers"], cfg["hunyuan-video"]["num_single_layers"]) == (20, 40)


@pytest.mark.parametrize("name", REAL_NAMES + TINY_NAMES)
def test_text_encoder_dims_match_transformer_inputs(name):
    spec = MODEL_SPECS[name]
    cfg = spec.transformer_config
    text = spec.text_encoder
    joint = {
        "sd3": "joint_attention_dim",
        "flux": "joint_attention_dim",
        "qwen-image": "joint_attention_dim",
        "wan": "text_dim",
        "hunyuan-video": "text_embed_dim",
    }[spec.family]
    assert text.embed_dim == cfg[joint]
    assert text.pooled_dim == cfg.get("pooled_projection_dim")
    # every sequence-emitting component's width agrees with the composed width (SD3 pads CLIP up to T5)
    for comp in text.components:
        c = comp.config.get("text_config", comp.config)
        width = c.get("d_model", c.get("hidden_size"))
        if comp.emits_sequence and spec.family != "sd3":
            assert width == text.embed_dim
        if comp.pooled == "pooler_output":
            assert width == text.pooled_dim


@pytest.mark.parametrize("name", ["sd3.5-medium", "flux.1-dev", "hunyuan-video"])
def test_real_clip_text_encoders_instantiate_on_meta(name):
    """The real text-encoder configs are valid transformers configs (shape-only build, no memory)."""
    spec = MODEL_SPECS[name]
    for comp in spec.text_encoder.components:
        if comp.model_class.startswith("CLIP"):
            model = instantiate_transformers_model(
                comp.model_class, comp.config, device="meta", dtype=torch.float32
            )
            expected = {768: 123e6, 1280: 694e6}[comp.config["hidden_size"]]
            count = sum(p.numel() for p in model.parameters())
            assert abs(count - expected) / expected < 0.02
        else:
            assert build_transformers_config(comp.config) is not None


@pytest.mark.parametrize("name", ["flux.1-dev", "qwen-image", "tiny-flux"])
def test_dynamic_time_shift_matches_diffusers_scheduler(name):
    spec = MODEL_SPECS[name]
    ds = spec.dynamic_shift
    seq_len = int(np.random.randint(64, 8192))
    # independent reference: diffusers' own mu (FLUX pipeline calculate_shift) and scheduler sigmas
    m = (ds.max_shift - ds.base_shift) / (ds.max_seq_len - ds.base_seq_len)
    mu_ref = seq_len * m + ds.base_shift - m * ds.base_seq_len
    sched = diffusers.FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, time_shift_type="exponential"
    )
    base = np.linspace(1.0, 1 / 10, 10)
    sched.set_timesteps(sigmas=base, mu=mu_ref)
    s = spec.time_shift(seq_len)
    ours = s * base / (1 + (s - 1) * base)
    np.testing.assert_allclose(ours, sched.sigmas[:-1].double().numpy(), rtol=1e-5)
    assert math.isclose(math.log(s), mu_ref, rel_tol=1e-12)


def test_static_shift_is_returned_for_static_models():
    assert get_model_spec("sd3.5-medium").time_shift(4096) == 3.0
    assert get_model_spec("wan2.1-1.3b").time_shift(1) == 3.0


def test_defaults_follow_algorithm_table():
    assert get_model_spec("sd3.5-medium").noise_level == 0.7
    assert get_model_spec("flux.1-dev").noise_level == 0.9
    assert get_model_spec("qwen-image").noise_level == 1.2
    assert not get_model_spec("flux.1-dev").uses_true_cfg
    assert not get_model_spec("hunyuan-video").uses_true_cfg
    assert get_model_spec("sd3.5-medium").uses_true_cfg
