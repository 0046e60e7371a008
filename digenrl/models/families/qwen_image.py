"""Qwen-Image: QwenImageTransformer2DModel, AutoencoderKLQwenImage, Qwen2.5-VL (diffusers 0.42
pipeline_qwenimage.py).

The pipeline packs 2x2 latent patches into tokens (`latent_packing.py`); its VAE is a video VAE that decodes
an image as one frame. Condition (`_get_qwen_prompt_embeds`): Qwen2.5-VL `hidden_states[-1]` after dropping
the chat-template prefix, padding zeroed, mask kept (the transformer masks text keys). True CFG with the
output rescaled to the conditional norm (`cfg_renorm`). Zoo entries: Qwen/Qwen-Image and `tiny-qwen-image`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from digenrl.models.families.shared import (
    ATTENTION_TARGETS,
    HUB,
    TINY_LATENT_CHANNELS,
    TINY_TEXT_DIM,
    TINY_TEXT_LEN,
    TINY_VOCAB,
    TINY_WAN_VAE,
    WAN_LATENTS_MEAN,
    WAN_LATENTS_STD,
    wan_vae_compression,
)
from digenrl.models.family import ComponentOutput, ModelFamily
from digenrl.models.latent_packing import pack_2x2, unpack_2x2
from digenrl.models.spec_types import DynamicShiftSpec, EncoderComponentSpec, ModelSpec, TextEncoderSpec

if TYPE_CHECKING:
    from digenrl.data.text_condition import TextCondition


def qwen_image_velocity(
    transformer: nn.Module, latents: Tensor, sigma: Tensor, cond: TextCondition, guidance: Tensor | None
) -> Tensor:
    """QwenImageTransformer2DModel, pipeline_qwenimage.py: 2x2-packed tokens, `timestep = t / 1000` = sigma
    (its Timesteps projection scales by 1000), `img_shapes` [(1, h/2, w/2)] per sample for the 3-axis RoPE,
    `encoder_hidden_states_mask` masking padded text keys (None when `model.text_padding=split` has cut the
    padding, digenrl/models/text_padding.py). True CFG (with norm rescale) is the caller's."""
    b, _, h, w = latents.shape
    out = transformer(
        hidden_states=pack_2x2(latents),
        timestep=sigma,
        encoder_hidden_states=cond.embeds,
        encoder_hidden_states_mask=cond.mask,
        img_shapes=[[(1, h // 2, w // 2)]] * b,
        return_dict=False,
    )[0]
    return unpack_2x2(out, h, w)


def compose_condition(outputs: dict[str, ComponentOutput]) -> tuple[Tensor, None, Tensor]:
    """Qwen2.5-VL tokens and their mask; no pooled vector."""
    embeds, _, mask = outputs["qwen2_5_vl"]
    return embeds, None, mask


def patch_size(transformer_config: dict[str, Any]) -> tuple[int, int]:
    """(temporal, spatial): 2x2 packing, the config's `patch_size`."""
    return 1, int(transformer_config.get("patch_size", 2))


def vae_decode(vae: nn.Module, latents: Tensor) -> Tensor:
    """AutoencoderKLQwenImage is 5-D: a frame axis is added before and removed after decoding."""
    return vae.decode(latents.unsqueeze(2)).sample[:, :, 0]


# Qwen/Qwen2.5-VL-7B-Instruct: Qwen-Image `text_encoder` (vision tower unused for text prompts).
QWEN25_VL_7B_CONFIG: dict = {
    "model_type": "qwen2_5_vl",
    "text_config": {
        "model_type": "qwen2_5_vl_text",
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "hidden_act": "silu",
        "max_position_embeddings": 128000,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "tie_word_embeddings": False,
    },
    "vision_config": {
        "depth": 32,
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "out_hidden_size": 3584,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "tokens_per_second": 2,
        "in_chans": 3,
        "hidden_act": "silu",
    },
}

# Chat template: pipeline_qwenimage.py `prompt_template_encode`, start index 34.
QWEN_IMAGE_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
    "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def qwen_image_text_encoder(qwen_vl: dict, max_len: int) -> TextEncoderSpec:
    """Qwen-Image: Qwen2.5-VL last hidden state after the chat-template prefix, with token mask."""
    return TextEncoderSpec(
        composition="qwen-image",
        components=(
            EncoderComponentSpec(
                "qwen2_5_vl",
                "Qwen2_5_VLForConditionalGeneration",
                qwen_vl,
                max_len,
                hidden_state_index=-1,
                pass_attention_mask=True,
                zero_padding=True,
                prompt_template=QWEN_IMAGE_TEMPLATE,
                template_drop_tokens=34,
            ),
        ),
        embed_dim=qwen_vl["text_config"]["hidden_size"],
        pooled_dim=None,
        uses_mask=True,
        seq_len=max_len,
    )


QWEN_IMAGE_TRANSFORMER: dict = {
    "patch_size": 2,
    "in_channels": 64,
    "out_channels": 16,
    "num_layers": 60,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 3584,
    "guidance_embeds": False,
    "axes_dims_rope": [16, 56, 56],
}
# Qwen-Image's VAE ships the Wan2.1 VAE's per-channel statistics.
QWEN_IMAGE_VAE_CONFIG: dict = {
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

QWEN_IMAGE = ModelSpec(
    name="qwen-image",
    family="qwen-image",
    transformer_class="QwenImageTransformer2DModel",
    transformer_config=QWEN_IMAGE_TRANSFORMER,
    vae_class="AutoencoderKLQwenImage",
    vae_config=QWEN_IMAGE_VAE_CONFIG,
    vae_latents_mean=WAN_LATENTS_MEAN,
    vae_latents_std=WAN_LATENTS_STD,
    text_encoder=qwen_image_text_encoder(QWEN25_VL_7B_CONFIG, 512),
    default_num_steps=10,
    default_eval_num_steps=50,
    default_guidance_scale=4.0,  # pipeline `true_cfg_scale`
    cfg_renorm=True,  # pipeline_qwenimage.py rescales the CFG output to the cond norm
    noise_level=1.2,
    shift=1.0,
    dynamic_shift=DynamicShiftSpec(base_shift=0.5, max_shift=0.9, base_seq_len=256, max_seq_len=8192),
    shift_terminal=0.02,
    sources=(HUB + "Qwen/Qwen-Image", "diffusers/pipelines/qwenimage/pipeline_qwenimage.py"),
)

TINY_QWEN25_VL: dict = {
    "model_type": "qwen2_5_vl",
    "text_config": {
        "model_type": "qwen2_5_vl_text",
        "vocab_size": TINY_VOCAB,
        "hidden_size": TINY_TEXT_DIM,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 128,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        "tie_word_embeddings": False,
    },
    "vision_config": {
        "depth": 1,
        "hidden_size": 16,
        "intermediate_size": 16,
        "num_heads": 2,
        "out_hidden_size": TINY_TEXT_DIM,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "fullatt_block_indexes": [0],
    },
}

TINY_QWEN_IMAGE = ModelSpec(
    name="tiny-qwen-image",
    family="qwen-image",
    transformer_class="QwenImageTransformer2DModel",
    transformer_config={
        "patch_size": 2,
        "in_channels": 4 * TINY_LATENT_CHANNELS,
        "out_channels": TINY_LATENT_CHANNELS,
        "num_layers": 2,
        "attention_head_dim": 8,
        "num_attention_heads": 2,
        "joint_attention_dim": TINY_TEXT_DIM,
        "guidance_embeds": False,
        "axes_dims_rope": [2, 2, 4],
    },
    vae_class="AutoencoderKLQwenImage",
    vae_config=TINY_WAN_VAE,
    vae_latents_mean=WAN_LATENTS_MEAN[:TINY_LATENT_CHANNELS],
    vae_latents_std=WAN_LATENTS_STD[:TINY_LATENT_CHANNELS],
    text_encoder=qwen_image_text_encoder(TINY_QWEN25_VL, TINY_TEXT_LEN),
    default_height=32,
    default_width=32,
    default_num_steps=8,
    default_eval_num_steps=16,
    default_guidance_scale=4.0,
    cfg_renorm=True,
    noise_level=1.2,
    shift=1.0,
    dynamic_shift=DynamicShiftSpec(base_shift=0.5, max_shift=0.9, base_seq_len=256, max_seq_len=8192),
    shift_terminal=0.02,
)

FAMILY = ModelFamily(
    name="qwen-image",
    velocity=qwen_image_velocity,
    compose_condition=compose_condition,
    patch_size=patch_size,
    latent_compression=wan_vae_compression,
    lora_targets=ATTENTION_TARGETS,
    pipeline_class="QwenImagePipeline",
    specs=(QWEN_IMAGE, TINY_QWEN_IMAGE),
    vae_decode=vae_decode,
    cuts_text_padding=True,  # padded keys masked, text RoPE from position 0 (digenrl/models/text_padding.py)
)
