"""The model-family registry: a family registered in one place is what every consumer uses.

A toy family (SD3's transformer class at toy size behind its own call, composition, patching, VAE rules
and LoRA targets) is registered here; the flow model, text encoder, VAE decoder, start-up validation and
the trainer's LoRA default must all go through it. A static check keeps per-family tables out of the
consumers.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from digenrl.config import Config, ConfigError
from digenrl.models import (
    MODEL_SPECS,
    ModelFamily,
    build_flow_model,
    build_model_bundle,
    family_names,
    get_family,
    get_model_spec,
    register_family,
)
from digenrl.models.families import sd3
from digenrl.models.families.shared import (
    TINY_KL,
    TINY_LATENT_CHANNELS,
    TINY_TEXT_DIM,
    TINY_TEXT_LEN,
    autoencoder_kl_compression,
    tiny_t5,
)
from digenrl.models.family import plain_vae_decode
from digenrl.models.spec_types import EncoderComponentSpec, ModelSpec, TextEncoderSpec
from digenrl.models.specs import unregister_family
from digenrl.trainer.lora import apply_lora, default_lora_targets
from digenrl.validation import check_model

TOY_TARGETS = ("attn.to_q", "attn.to_v")
PACKAGE = Path(__file__).resolve().parents[2] / "digenrl"


def _toy_family(calls: Counter) -> ModelFamily:
    """SD3's transformer driven by a T5-only condition whose pooled vector is the token mean."""

    def velocity(transformer, latents, sigma, cond, guidance):
        calls["velocity"] += 1
        return sd3.sd3_velocity(transformer, latents, sigma, cond, guidance)

    def compose(outputs):
        calls["compose"] += 1
        embeds, _, _ = outputs["t5"]
        return embeds, embeds.mean(dim=1), None

    def patch_size(cfg):
        calls["patch_size"] += 1
        return 1, int(cfg["patch_size"])

    def compression(cfg):
        calls["latent_compression"] += 1
        return autoencoder_kl_compression(cfg)

    def decode(vae, latents):
        calls["vae_decode"] += 1
        return plain_vae_decode(vae, latents)

    text = TextEncoderSpec(
        composition="toy",
        components=(EncoderComponentSpec("t5", "T5EncoderModel", tiny_t5("t5"), TINY_TEXT_LEN),),
        embed_dim=TINY_TEXT_DIM,
        pooled_dim=TINY_TEXT_DIM,
        uses_mask=False,
        seq_len=TINY_TEXT_LEN,
    )
    transformer = {
        **sd3.TINY_SD3.transformer_config,
        "pooled_projection_dim": TINY_TEXT_DIM,
        "dual_attention_layers": [],
    }
    spec = ModelSpec(
        name="tiny-toy",
        family="toy",
        transformer_class="SD3Transformer2DModel",
        transformer_config=transformer,
        vae_class="AutoencoderKL",
        vae_config={**TINY_KL, "scaling_factor": 1.0, "shift_factor": 0.0},
        text_encoder=text,
        default_height=32,
        default_width=32,
        default_num_steps=4,
    )
    return ModelFamily(
        name="toy",
        velocity=velocity,
        compose_condition=compose,
        patch_size=patch_size,
        latent_compression=compression,
        lora_targets=TOY_TARGETS,
        specs=(spec,),
        pipeline_class="StableDiffusion3Pipeline",
        vae_decode=decode,
    )


@pytest.fixture
def toy():
    calls: Counter = Counter()
    register_family(_toy_family(calls))
    try:
        yield calls
    finally:
        unregister_family("toy")
    assert "toy" not in family_names() and "tiny-toy" not in MODEL_SPECS


def test_a_registered_family_is_what_every_consumer_uses(toy):
    assert "toy" in family_names() and get_model_spec("tiny-toy").family == "toy"
    bundle = build_model_bundle("tiny-toy")
    assert toy["patch_size"] and toy["latent_compression"]

    cond = bundle.text_encoder.encode(["a red cube", "a blue ball"])
    assert toy["compose"] == 2  # one encoder pass per uncached prompt
    torch.testing.assert_close(cond.pooled, cond.embeds.mean(dim=1))

    flow_model = bundle.flow_model
    assert flow_model.latent_shape(32, 32) == (TINY_LATENT_CHANNELS, 8, 8)
    x = torch.randn(2, *flow_model.latent_shape(32, 32))
    v = flow_model(x, torch.tensor([0.3, 0.7]), cond)
    assert toy["velocity"] == 1 and v.shape == x.shape

    pixels = bundle.decoder.decode(v)
    assert toy["vae_decode"] == 1 and pixels.shape == (2, 3, 32, 32)

    assert default_lora_targets("toy") == list(TOY_TARGETS)
    pristine = {n for n, m in flow_model.transformer.named_modules() if isinstance(m, nn.Linear)}
    apply_lora(flow_model, rank=2, alpha=4)
    wrapped = {n for n, m in flow_model.transformer.named_modules() if hasattr(m, "lora_A")}
    assert wrapped == {n for n in pristine if n.endswith(TOY_TARGETS)}


def test_start_up_validation_reads_the_registered_family(toy):
    cfg = Config()
    cfg.model.name = "tiny-toy"
    check_model(cfg)
    cfg.model.height = 36  # VAE factor 4 x patch 2 = 8
    with pytest.raises(ConfigError, match=r"model\.height=36 must be a positive multiple of 8 for tiny-toy"):
        check_model(cfg)


def test_the_planner_reads_a_registered_familys_rollout_defaults(toy):
    """A family registered at run time is planned and simulated too (digenrl/plan/rollout_defaults.py)."""
    from digenrl.config import load_config
    from digenrl.plan import Workload

    spec = get_model_spec("tiny-toy")
    workload = Workload.from_config(load_config(None, ["model.name=tiny-toy"]))
    assert workload.num_steps == spec.default_num_steps


def test_registration_refuses_clashes_and_mismatched_specs(toy):
    family = _toy_family(Counter())
    with pytest.raises(ValueError, match="'toy' is already registered"):
        register_family(family)
    spec = family.specs[0]  # the same model name under another family
    text = replace(spec.text_encoder, composition="toy2")
    twin = replace(family, name="toy2", specs=(replace(spec, family="toy2", text_encoder=text),))
    with pytest.raises(ValueError, match=r"model names \['tiny-toy'\] are already registered"):
        register_family(twin)
    with pytest.raises(ValueError, match="lists spec 'tiny-sd3' of family 'sd3'"):
        replace(family, specs=(sd3.TINY_SD3,))


def test_an_unregistered_family_is_a_clear_error():
    spec = replace(get_model_spec("tiny-sd3"), family="sd9")
    with pytest.raises(ValueError, match=r"unknown model family 'sd9'; registered: \[.*'sd3'"):
        build_flow_model(spec, device="meta")
    with pytest.raises(ValueError, match="unknown model family 'sd9'"):
        default_lora_targets("sd9")
    assert get_family("sd3") is sd3.FAMILY


def _string_constants(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_consumers_hold_no_per_family_table():
    """Family names appear as code only in their family module: the flow model, text encoder, VAE, specs,
    trainer and sampler ask the registry (a per-family `if`/dict would spell a family name)."""
    consumers = [
        *(p for p in (PACKAGE / "models").glob("*.py")),
        *(PACKAGE / "trainer").rglob("*.py"),
        *(PACKAGE / "rollout").rglob("*.py"),
        PACKAGE / "validation.py",
    ]
    names = set(family_names())
    spelled = {str(p.relative_to(PACKAGE)): sorted(_string_constants(p) & names) for p in consumers}
    assert {k: v for k, v in spelled.items() if v} == {}
