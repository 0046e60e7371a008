"""Stable Diffusion 3 / 3.5: SD3Transformer2DModel, AutoencoderKL, CLIP-L + CLIP-G + T5-XXL (diffusers 0.42
pipeline_stable_diffusion_3.py).

Condition (`encode_prompt`): CLIP-L and CLIP-G `hidden_states[-2]` concatenated on channels, zero-padded to
the T5 width, then concatenated on tokens with the T5 last hidden state; pooled = CLIP-L ⊕ CLIP-G projected
`text_embeds`. No mask reaches the transformer. Zoo entries: stabilityai/stable-diffusion-3.5-medium and
`tiny-sd3`, the project's CPU default (an 8-step rollout of 8 samples plus the training pass takes well
under a second on 2 cores).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from digenrl.models.families.shared import (
    ATTENTION_TARGETS,
    CLIP_G_CONFIG,
    CLIP_L_CONFIG,
    HUB,
    KL_F8_16CH,
    T5_XXL_CONFIG,
    TINY_KL,
    TINY_LATENT_CHANNELS,
    TINY_POOLED_DIM,
    TINY_TEXT_DIM,
    TINY_TEXT_LEN,
    autoencoder_kl_compression,
    tiny_clip,
    tiny_t5,
)
from digenrl.models.family import ComponentOutput, ModelFamily
from digenrl.models.spec_types import EncoderComponentSpec, ModelSpec, TextEncoderSpec

if TYPE_CHECKING:
    from digenrl.data.text_condition import TextCondition


def sd3_velocity(
    transformer: nn.Module, latents: Tensor, sigma: Tensor, cond: TextCondition, guidance: Tensor | None
) -> Tensor:
    """SD3Transformer2DModel, pipeline_stable_diffusion_3.py: `timestep = t` with t = sigma * 1000 (the
    scheduler's timesteps), `encoder_hidden_states` + `pooled_projections`, no mask; CFG by the caller."""
    return transformer(
        hidden_states=latents,
        timestep=sigma * 1000,
        encoder_hidden_states=cond.embeds,
        pooled_projections=cond.pooled,
        return_dict=False,
    )[0]


def compose_condition(outputs: dict[str, ComponentOutput]) -> tuple[Tensor, Tensor, None]:
    """CLIP-L ⊕ CLIP-G on channels, padded to the T5 width, ++ T5 on tokens; pooled CLIP-L ⊕ CLIP-G."""
    l_seq, l_pool, _ = outputs["clip_l"]
    g_seq, g_pool, _ = outputs["clip_g"]
    t5_seq, _, _ = outputs["t5"]
    if l_seq.shape[1] != g_seq.shape[1]:
        raise ValueError(
            f"sd3 text encoder: clip_l gives {l_seq.shape[1]} tokens, clip_g {g_seq.shape[1]}; they are "
            "concatenated on channels and need the same max_length"
        )
    clip_seq = torch.cat([l_seq, g_seq], dim=-1)
    clip_seq = nn.functional.pad(clip_seq, (0, t5_seq.shape[-1] - clip_seq.shape[-1]))
    embeds = torch.cat([clip_seq, t5_seq], dim=-2)
    pooled = torch.cat([l_pool, g_pool], dim=-1)
    return embeds, pooled, None


def patch_size(transformer_config: dict[str, Any]) -> tuple[int, int]:
    """(temporal, spatial): the transformer patchifies `patch_size` x `patch_size` latents itself."""
    return 1, int(transformer_config.get("patch_size", 2))


def sd3_text_encoder(clip_l: dict, clip_g: dict, t5: dict, clip_len: int, t5_len: int) -> TextEncoderSpec:
    """SD3: CLIP-L ⊕ CLIP-G penultimate states (channel concat, zero-padded to T5 width) ++ T5 tokens;
    pooled = CLIP-L ⊕ CLIP-G projected text_embeds (pipeline_stable_diffusion_3.py `encode_prompt`)."""
    return TextEncoderSpec(
        composition="sd3",
        components=(
            EncoderComponentSpec(
                "clip_l",
                "CLIPTextModelWithProjection",
                clip_l,
                clip_len,
                hidden_state_index=-2,
                pooled="text_embeds",
            ),
            EncoderComponentSpec(
                "clip_g",
                "CLIPTextModelWithProjection",
                clip_g,
                clip_len,
                subfolder="text_encoder_2",
                hidden_state_index=-2,
                pooled="text_embeds",
            ),
            EncoderComponentSpec("t5", "T5EncoderModel", t5, t5_len, subfolder="text_encoder_3"),
        ),
        embed_dim=t5["d_model"],
        pooled_dim=clip_l["projection_dim"] + clip_g["projection_dim"],
        uses_mask=False,
        seq_len=clip_len + t5_len,
    )


SD35_MEDIUM_TRANSFORMER: dict = {
    "sample_size": 128,
    "patch_size": 2,
    "in_channels": 16,
    "num_layers": 24,
    "attention_head_dim": 64,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "caption_projection_dim": 1536,
    "pooled_projection_dim": 2048,
    "out_channels": 16,
    "pos_embed_max_size": 384,
    "dual_attention_layers": list(range(13)),
    "qk_norm": "rms_norm",
}
SD3_VAE_CONFIG: dict = {**KL_F8_16CH, "scaling_factor": 1.5305, "shift_factor": 0.0609}

SD35_MEDIUM = ModelSpec(
    name="sd3.5-medium",
    family="sd3",
    transformer_class="SD3Transformer2DModel",
    transformer_config=SD35_MEDIUM_TRANSFORMER,
    vae_class="AutoencoderKL",
    vae_config=SD3_VAE_CONFIG,
    vae_scaling_factor=1.5305,
    vae_shift_factor=0.0609,
    text_encoder=sd3_text_encoder(CLIP_L_CONFIG, CLIP_G_CONFIG, T5_XXL_CONFIG, 77, 256),
    default_num_steps=10,
    default_eval_num_steps=40,
    default_guidance_scale=4.5,
    noise_level=0.7,
    shift=3.0,
    sources=(
        HUB + "stabilityai/stable-diffusion-3.5-medium",
        "diffusers/pipelines/stable_diffusion_3/pipeline_stable_diffusion_3.py",
    ),
)

TINY_SD3 = ModelSpec(
    name="tiny-sd3",
    family="sd3",
    transformer_class="SD3Transformer2DModel",
    transformer_config={
        "sample_size": 16,
        "patch_size": 2,
        "in_channels": TINY_LATENT_CHANNELS,
        "num_layers": 2,
        "attention_head_dim": 8,
        "num_attention_heads": 2,
        "joint_attention_dim": TINY_TEXT_DIM,
        "caption_projection_dim": 16,
        "pooled_projection_dim": 2 * TINY_POOLED_DIM,
        "out_channels": TINY_LATENT_CHANNELS,
        "pos_embed_max_size": 32,
        "dual_attention_layers": [0],
        "qk_norm": "rms_norm",
    },
    vae_class="AutoencoderKL",
    vae_config={**TINY_KL, "scaling_factor": 1.5305, "shift_factor": 0.0609},
    vae_scaling_factor=1.5305,
    vae_shift_factor=0.0609,
    text_encoder=sd3_text_encoder(
        tiny_clip(8, TINY_POOLED_DIM),
        tiny_clip(16, TINY_POOLED_DIM),
        tiny_t5("t5"),
        TINY_TEXT_LEN,
        TINY_TEXT_LEN,
    ),
    default_height=32,
    default_width=32,
    default_num_steps=8,
    default_eval_num_steps=16,
    default_guidance_scale=4.5,
    noise_level=0.7,
    shift=3.0,
)

FAMILY = ModelFamily(
    name="sd3",
    velocity=sd3_velocity,
    compose_condition=compose_condition,
    patch_size=patch_size,
    latent_compression=autoencoder_kl_compression,
    lora_targets=ATTENTION_TARGETS,
    pipeline_class="StableDiffusion3Pipeline",
    kohya_lora=True,
    specs=(SD35_MEDIUM, TINY_SD3),
)
