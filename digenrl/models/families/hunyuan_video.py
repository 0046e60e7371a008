"""HunyuanVideo: HunyuanVideoTransformer3DModel, AutoencoderKLHunyuanVideo, Llama (LLaVA-Llama-3) + CLIP-L
(diffusers 0.42 pipeline_hunyuan_video.py).

5-D latents; guidance-distilled (the embedded guidance scale is passed x1000, no CFG doubling).
Condition (`_get_llama_prompt_embeds`, `_get_clip_prompt_embeds`): Llama `hidden_states[-3]` after the
template crop, mask kept; pooled = CLIP-L `pooler_output`. Zoo entries:
hunyuanvideo-community/HunyuanVideo and `tiny-hunyuan-video`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from digenrl.models.families.shared import (
    ATTENTION_TARGETS,
    CLIP_L_CONFIG,
    HUB,
    TINY_LATENT_CHANNELS,
    TINY_POOLED_DIM,
    TINY_TEXT_DIM,
    TINY_TEXT_LEN,
    TINY_VOCAB,
    tiny_clip,
)
from digenrl.models.family import ComponentOutput, ModelFamily
from digenrl.models.spec_types import EncoderComponentSpec, ModelSpec, TextEncoderSpec

if TYPE_CHECKING:
    from digenrl.data.text_condition import TextCondition


def hunyuan_video_velocity(
    transformer: nn.Module, latents: Tensor, sigma: Tensor, cond: TextCondition, guidance: Tensor | None
) -> Tensor:
    """HunyuanVideoTransformer3DModel, pipeline_hunyuan_video.py: 5-D latents, `timestep = t` = sigma * 1000,
    `encoder_attention_mask` (right-padded Llama tokens), CLIP `pooled_projections`, and the embedded
    guidance passed as `guidance_scale * 1000` (the pipeline scales it; the transformer does not)."""
    mask = cond.mask
    if mask is None:
        mask = torch.ones(cond.embeds.shape[:2], dtype=torch.bool, device=cond.embeds.device)
    return transformer(
        hidden_states=latents,
        timestep=sigma * 1000,
        encoder_hidden_states=cond.embeds,
        encoder_attention_mask=mask,
        pooled_projections=cond.pooled,
        guidance=None if guidance is None else guidance * 1000,
        return_dict=False,
    )[0]


def compose_condition(outputs: dict[str, ComponentOutput]) -> tuple[Tensor, Tensor, Tensor]:
    """Llama tokens and their mask; pooled CLIP-L."""
    embeds, _, mask = outputs["llama"]
    _, pooled, _ = outputs["clip_l"]
    return embeds, pooled, mask


def patch_size(transformer_config: dict[str, Any]) -> tuple[int, int]:
    """(temporal, spatial): the config's `patch_size_t` and `patch_size`."""
    return int(transformer_config.get("patch_size_t", 1)), int(transformer_config.get("patch_size", 2))


def latent_compression(vae_config: dict[str, Any]) -> tuple[int, int]:
    """(temporal, spatial) compression ratios AutoencoderKLHunyuanVideo states in its config."""
    return (
        int(vae_config.get("temporal_compression_ratio", 4)),
        int(vae_config.get("spatial_compression_ratio", 8)),
    )


# xtuner/llava-llama-3-8b-v1_1 language model as shipped in hunyuanvideo-community/HunyuanVideo
# `text_encoder` (LlamaModel).
LLAVA_LLAMA3_8B_CONFIG: dict = {
    "model_type": "llama",
    "vocab_size": 128320,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
}

# Chat template: pipeline_hunyuan_video.py `DEFAULT_PROMPT_TEMPLATE`, crop_start 95.
HUNYUAN_VIDEO_TEMPLATE = (
    "<|start_header_id|>system<|end_header_id|>\n\nDescribe the video by detailing the following aspects: "
    "1. The main content and theme of the video."
    "2. The color, shape, size, texture, quantity, text, and spatial relationships of the objects."
    "3. Actions, events, behaviors temporal relationships, physical movement changes of the objects."
    "4. background environment, light, style and atmosphere."
    "5. camera angles, movements, and transitions used in the video:<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|>"
)


def hunyuan_video_text_encoder(llama: dict, clip_l: dict, llama_len: int, clip_len: int) -> TextEncoderSpec:
    """HunyuanVideo: Llama hidden_states[-3] (2 layers skipped) after the template crop, with mask, plus
    CLIP-L pooler_output (pipeline_hunyuan_video.py `_get_llama_prompt_embeds`, `_get_clip_prompt_embeds`)."""
    return TextEncoderSpec(
        composition="hunyuan-video",
        components=(
            EncoderComponentSpec(
                "llama",
                "LlamaModel",
                llama,
                llama_len,
                hidden_state_index=-3,
                pass_attention_mask=True,
                prompt_template=HUNYUAN_VIDEO_TEMPLATE,
                template_drop_tokens=95,
            ),
            EncoderComponentSpec(
                "clip_l",
                "CLIPTextModel",
                clip_l,
                clip_len,
                subfolder="text_encoder_2",
                emits_sequence=False,
                pooled="pooler_output",
            ),
        ),
        embed_dim=llama["hidden_size"],
        pooled_dim=clip_l["hidden_size"],
        uses_mask=True,
        seq_len=llama_len,
    )


HUNYUAN_VIDEO_VAE_CONFIG: dict = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 16,
    "down_block_types": ["HunyuanVideoDownBlock3D"] * 4,
    "up_block_types": ["HunyuanVideoUpBlock3D"] * 4,
    "block_out_channels": [128, 256, 512, 512],
    "layers_per_block": 2,
    "act_fn": "silu",
    "norm_num_groups": 32,
    "scaling_factor": 0.476986,
    "spatial_compression_ratio": 8,
    "temporal_compression_ratio": 4,
    "mid_block_add_attention": True,
}
HUNYUAN_VIDEO_TRANSFORMER: dict = {
    "in_channels": 16,
    "out_channels": 16,
    "num_attention_heads": 24,
    "attention_head_dim": 128,
    "num_layers": 20,
    "num_single_layers": 40,
    "num_refiner_layers": 2,
    "mlp_ratio": 4.0,
    "patch_size": 2,
    "patch_size_t": 1,
    "qk_norm": "rms_norm",
    "guidance_embeds": True,
    "text_embed_dim": 4096,
    "pooled_projection_dim": 768,
    "rope_theta": 256.0,
    "rope_axes_dim": [16, 56, 56],
}

HUNYUAN_VIDEO = ModelSpec(
    name="hunyuan-video",
    family="hunyuan-video",
    transformer_class="HunyuanVideoTransformer3DModel",
    transformer_config=HUNYUAN_VIDEO_TRANSFORMER,
    vae_class="AutoencoderKLHunyuanVideo",
    vae_config=HUNYUAN_VIDEO_VAE_CONFIG,
    vae_scaling_factor=0.476986,
    text_encoder=hunyuan_video_text_encoder(LLAVA_LLAMA3_8B_CONFIG, CLIP_L_CONFIG, 256, 77),
    default_height=720,
    default_width=1280,
    default_frames=129,
    default_num_steps=20,
    default_eval_num_steps=50,
    default_guidance_scale=6.0,
    guidance_embedded=True,
    noise_level=0.7,
    shift=7.0,  # HunyuanVideo sampling flow-shift 7.0 (scheduler config of the diffusers repo)
    is_video=True,
    sources=(
        HUB + "hunyuanvideo-community/HunyuanVideo",
        "diffusers/pipelines/hunyuan_video/pipeline_hunyuan_video.py",
    ),
)

TINY_LLAMA: dict = {
    "model_type": "llama",
    "vocab_size": TINY_VOCAB,
    "hidden_size": TINY_TEXT_DIM,
    "intermediate_size": 32,
    "num_hidden_layers": 3,  # hidden_states[-3] is then the first block's output
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
}
TINY_HUNYUAN_VAE: dict = {
    "latent_channels": TINY_LATENT_CHANNELS,
    "down_block_types": ["HunyuanVideoDownBlock3D"] * 4,
    "up_block_types": ["HunyuanVideoUpBlock3D"] * 4,
    "block_out_channels": [8, 8, 16, 16],
    "layers_per_block": 1,
    "norm_num_groups": 4,
    "scaling_factor": 0.476986,
    "spatial_compression_ratio": 8,
    "temporal_compression_ratio": 4,
}

TINY_HUNYUAN_VIDEO = ModelSpec(
    name="tiny-hunyuan-video",
    family="hunyuan-video",
    transformer_class="HunyuanVideoTransformer3DModel",
    transformer_config={
        "in_channels": TINY_LATENT_CHANNELS,
        "out_channels": TINY_LATENT_CHANNELS,
        "num_attention_heads": 2,
        "attention_head_dim": 8,
        "num_layers": 1,
        "num_single_layers": 1,
        "num_refiner_layers": 1,
        "mlp_ratio": 2.0,
        "patch_size": 2,
        "patch_size_t": 1,
        "qk_norm": "rms_norm",
        "guidance_embeds": True,
        "text_embed_dim": TINY_TEXT_DIM,
        "pooled_projection_dim": TINY_POOLED_DIM,
        "rope_theta": 256.0,
        "rope_axes_dim": [2, 2, 4],
    },
    vae_class="AutoencoderKLHunyuanVideo",
    vae_config=TINY_HUNYUAN_VAE,
    vae_scaling_factor=0.476986,
    text_encoder=hunyuan_video_text_encoder(
        TINY_LLAMA, tiny_clip(TINY_POOLED_DIM, TINY_POOLED_DIM), TINY_TEXT_LEN, TINY_TEXT_LEN
    ),
    default_height=32,
    default_width=32,
    default_frames=5,
    default_num_steps=8,
    default_eval_num_steps=16,
    default_guidance_scale=6.0,
    guidance_embedded=True,
    noise_level=0.7,
    shift=7.0,
    is_video=True,
)

FAMILY = ModelFamily(
    name="hunyuan-video",
    velocity=hunyuan_video_velocity,
    compose_condition=compose_condition,
    patch_size=patch_size,
    latent_compression=latent_compression,
    lora_targets=ATTENTION_TARGETS,
    pipeline_class="HunyuanVideoPipeline",
    specs=(HUNYUAN_VIDEO, TINY_HUNYUAN_VIDEO),
)
