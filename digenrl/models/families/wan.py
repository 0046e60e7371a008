"""Wan2.1 text-to-video: WanTransformer3DModel, AutoencoderKLWan, UMT5-XXL (diffusers 0.42 pipeline_wan.py).

5-D latents [B, C, f, h, w] patchified by the transformer (`patch_size` [t, h, w]); the causal VAE keeps the
first frame, so F pixel frames give (F - 1) / 4 + 1 latent frames. Condition (`_get_t5_prompt_embeds`):
the UMT5 last hidden state zeroed beyond the prompt length, no mask. Zoo entries:
Wan-AI/Wan2.1-T2V-{1.3B,14B}-Diffusers and `tiny-wan`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from digenrl.models.families.shared import (
    HUB,
    TINY_LATENT_CHANNELS,
    TINY_TEXT_DIM,
    TINY_TEXT_LEN,
    TINY_WAN_VAE,
    WAN_LATENTS_MEAN,
    WAN_LATENTS_STD,
    tiny_t5,
    wan_vae_compression,
)
from digenrl.models.family import ComponentOutput, ModelFamily
from digenrl.models.spec_types import EncoderComponentSpec, ModelSpec, TextEncoderSpec

if TYPE_CHECKING:
    from digenrl.data.text_condition import TextCondition


def wan_velocity(
    transformer: nn.Module, latents: Tensor, sigma: Tensor, cond: TextCondition, guidance: Tensor | None
) -> Tensor:
    """WanTransformer3DModel, pipeline_wan.py: 5-D latents [B, C, f, h, w], `timestep = t` = sigma * 1000,
    UMT5 states already zeroed past each prompt (no mask argument), CFG by the caller."""
    return transformer(
        hidden_states=latents,
        timestep=sigma * 1000,
        encoder_hidden_states=cond.embeds,
        return_dict=False,
    )[0]


def compose_condition(outputs: dict[str, ComponentOutput]) -> tuple[Tensor, None, None]:
    """UMT5 tokens (already zeroed past each prompt); no pooled vector, no mask."""
    embeds, _, _ = outputs["umt5"]
    return embeds, None, None


def patch_size(transformer_config: dict[str, Any]) -> tuple[int, int]:
    """(temporal, spatial) of the config's 3-D `patch_size` [t, h, w]."""
    pt, ph, _ = transformer_config.get("patch_size", (1, 2, 2))
    return int(pt), int(ph)


WAN_TARGETS: tuple[str, ...] = tuple(
    f"{attn}.{proj}" for attn in ("attn1", "attn2") for proj in ("to_q", "to_k", "to_v", "to_out.0")
)
"""Wan's blocks have self-attention ``attn1`` and text cross-attention ``attn2`` (diffusers
``WanTransformerBlock``); the added-KV projections exist only for image-to-video and are left out."""

# google/umt5-xxl encoder: Wan2.1 `text_encoder`.
UMT5_XXL_CONFIG: dict = {
    "model_type": "umt5",
    "vocab_size": 256384,
    "d_model": 4096,
    "d_kv": 64,
    "d_ff": 10240,
    "num_layers": 24,
    "num_heads": 64,
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "feed_forward_proj": "gated-gelu",
    "layer_norm_epsilon": 1e-6,
    "dropout_rate": 0.1,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
    "eos_token_id": 1,
}


def wan_text_encoder(umt5: dict, max_len: int) -> TextEncoderSpec:
    """Wan: UMT5 last hidden state, zeroed beyond each prompt's length (pipeline_wan.py)."""
    return TextEncoderSpec(
        composition="wan",
        components=(
            EncoderComponentSpec(
                "umt5", "UMT5EncoderModel", umt5, max_len, pass_attention_mask=True, zero_padding=True
            ),
        ),
        embed_dim=umt5["d_model"],
        pooled_dim=None,
        uses_mask=False,
        seq_len=max_len,
    )


# Wan2.1 VAE (AutoencoderKLWan config of Wan-AI/Wan2.1-T2V-*-Diffusers; Qwen-Image's VAE ships the
# same per-channel statistics).
WAN_VAE_CONFIG: dict = {
    "base_dim": 96,
    "z_dim": 16,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    "dropout": 0.0,
    "latents_mean": list(WAN_LATENTS_MEAN),
    "latents_std": list(WAN_LATENTS_STD),
}
_WAN21_COMMON: dict = {
    "patch_size": [1, 2, 2],
    "attention_head_dim": 128,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": 4096,
    "freq_dim": 256,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6,
    "image_dim": None,
    "added_kv_proj_dim": None,
    "rope_max_seq_len": 1024,
}
WAN21_1_3B_TRANSFORMER: dict = {**_WAN21_COMMON, "num_attention_heads": 12, "num_layers": 30, "ffn_dim": 8960}
WAN21_14B_TRANSFORMER: dict = {**_WAN21_COMMON, "num_attention_heads": 40, "num_layers": 40, "ffn_dim": 13824}


def _wan_spec(name: str, transformer: dict, repo: str) -> ModelSpec:
    return ModelSpec(
        name=name,
        family="wan",
        transformer_class="WanTransformer3DModel",
        transformer_config=transformer,
        vae_class="AutoencoderKLWan",
        vae_config=WAN_VAE_CONFIG,
        vae_latents_mean=WAN_LATENTS_MEAN,
        vae_latents_std=WAN_LATENTS_STD,
        text_encoder=wan_text_encoder(UMT5_XXL_CONFIG, 512),
        default_height=480,
        default_width=832,
        default_frames=81,
        default_num_steps=20,
        default_eval_num_steps=50,
        default_guidance_scale=5.0,
        noise_level=0.7,
        shift=3.0,  # UniPC flow_shift 3.0 (480p) of the repository's scheduler config
        is_video=True,
        sources=(HUB + repo, "diffusers/pipelines/wan/pipeline_wan.py"),
    )


WAN21_1_3B = _wan_spec("wan2.1-1.3b", WAN21_1_3B_TRANSFORMER, "Wan-AI/Wan2.1-T2V-1.3B-Diffusers")
WAN21_14B = _wan_spec("wan2.1-14b", WAN21_14B_TRANSFORMER, "Wan-AI/Wan2.1-T2V-14B-Diffusers")

TINY_WAN = ModelSpec(
    name="tiny-wan",
    family="wan",
    transformer_class="WanTransformer3DModel",
    transformer_config={
        "patch_size": [1, 2, 2],
        "num_attention_heads": 2,
        "attention_head_dim": 12,
        "in_channels": TINY_LATENT_CHANNELS,
        "out_channels": TINY_LATENT_CHANNELS,
        "text_dim": TINY_TEXT_DIM,
        "freq_dim": 16,
        "ffn_dim": 32,
        "num_layers": 2,
        "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads",
        "eps": 1e-6,
        "rope_max_seq_len": 32,
    },
    vae_class="AutoencoderKLWan",
    vae_config=TINY_WAN_VAE,
    vae_latents_mean=WAN_LATENTS_MEAN[:TINY_LATENT_CHANNELS],
    vae_latents_std=WAN_LATENTS_STD[:TINY_LATENT_CHANNELS],
    text_encoder=wan_text_encoder(tiny_t5("umt5"), TINY_TEXT_LEN),
    default_height=32,
    default_width=32,
    default_frames=5,
    default_num_steps=8,
    default_eval_num_steps=16,
    default_guidance_scale=5.0,
    noise_level=0.7,
    shift=3.0,
    is_video=True,
)

FAMILY = ModelFamily(
    name="wan",
    velocity=wan_velocity,
    compose_condition=compose_condition,
    patch_size=patch_size,
    latent_compression=wan_vae_compression,
    lora_targets=WAN_TARGETS,
    pipeline_class="WanPipeline",
    specs=(WAN21_1_3B, WAN21_14B, TINY_WAN),
)
