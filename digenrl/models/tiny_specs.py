"""Tiny variants of every family: the same diffusers / transformers classes at toy sizes.

They exist so the whole system (rollout, training, distributed schedules) runs on CPU in tests and examples.
Each keeps its family's structure (SD3 dual-attention block, FLUX double + single blocks with guidance
embedding, Qwen-Image packing and text mask, Wan 3D patches, HunyuanVideo token refiner + pooled CLIP) and
its family's VAE class with real scaling statistics, so every code path of the adapter is exercised.
`tiny-sd3` is the project's CPU default: an 8-step rollout of 8 samples plus the training pass takes well
under a second on 2 cores.
"""

from __future__ import annotations

from digenrl.models.published_specs import (
    WAN_LATENTS_MEAN,
    WAN_LATENTS_STD,
    flux_text_encoder,
    hunyuan_video_text_encoder,
    qwen_image_text_encoder,
    sd3_text_encoder,
    wan_text_encoder,
)
from digenrl.models.spec_types import DynamicShiftSpec, ModelSpec

TINY_VOCAB = 30522  # BERT WordPiece vocabulary of the offline tokenizer (overridden from the tokenizer)
TINY_TEXT_LEN = 16
TINY_TEXT_DIM = 32
TINY_POOLED_DIM = 16
TINY_LATENT_CHANNELS = 4


def _clip(hidden: int, projection: int) -> dict:
    return {
        "model_type": "clip_text_model",
        "vocab_size": TINY_VOCAB,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "projection_dim": projection,
        "num_hidden_layers": 2,  # hidden_states[-2] is then a real intermediate layer
        "num_attention_heads": 2,
        "max_position_embeddings": TINY_TEXT_LEN,
        "hidden_act": "quick_gelu",
    }


def _t5(model_type: str) -> dict:
    return {
        "model_type": model_type,
        "vocab_size": TINY_VOCAB,
        "d_model": TINY_TEXT_DIM,
        "d_kv": 8,
        "d_ff": 32,
        "num_layers": 1,
        "num_heads": 2,
        "relative_attention_num_buckets": 8,
        "relative_attention_max_distance": 16,
        "feed_forward_proj": "gated-gelu",
        "dropout_rate": 0.0,
        "tie_word_embeddings": False,
    }


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

# AutoencoderKL with 3 blocks: 4x downsampling, so 32 px -> 8x8 latents (16 SD3 / FLUX tokens).
_TINY_KL: dict = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ["DownEncoderBlock2D"] * 3,
    "up_block_types": ["UpDecoderBlock2D"] * 3,
    "block_out_channels": [8, 16, 16],
    "layers_per_block": 1,
    "latent_channels": TINY_LATENT_CHANNELS,
    "norm_num_groups": 4,
    "sample_size": 32,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
}
# Wan / Qwen-Image VAE with the real 8x spatial, 4x temporal structure at base width 8.
_TINY_WAN_VAE: dict = {
    "base_dim": 8,
    "z_dim": TINY_LATENT_CHANNELS,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 1,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    "dropout": 0.0,
    "latents_mean": list(WAN_LATENTS_MEAN[:TINY_LATENT_CHANNELS]),
    "latents_std": list(WAN_LATENTS_STD[:TINY_LATENT_CHANNELS]),
}
_TINY_HUNYUAN_VAE: dict = {
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


def tiny_specs() -> list[ModelSpec]:
    """Tiny entries, one per family."""
    return [
        ModelSpec(
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
            vae_config={**_TINY_KL, "scaling_factor": 1.5305, "shift_factor": 0.0609},
            vae_scaling_factor=1.5305,
            vae_shift_factor=0.0609,
            text_encoder=sd3_text_encoder(
                _clip(8, TINY_POOLED_DIM), _clip(16, TINY_POOLED_DIM), _t5("t5"), TINY_TEXT_LEN, TINY_TEXT_LEN
            ),
            default_height=32,
            default_width=32,
            default_num_steps=8,
            default_eval_num_steps=16,
            default_guidance_scale=4.5,
            noise_level=0.7,
            shift=3.0,
        ),
        ModelSpec(
            name="tiny-flux",
            family="flux",
            transformer_class="FluxTransformer2DModel",
            transformer_config={
                "patch_size": 1,
                "in_channels": 4 * TINY_LATENT_CHANNELS,
                "num_layers": 1,
                "num_single_layers": 1,
                "attention_head_dim": 8,
                "num_attention_heads": 2,
                "joint_attention_dim": TINY_TEXT_DIM,
                "pooled_projection_dim": TINY_POOLED_DIM,
                "guidance_embeds": True,
                "axes_dims_rope": [2, 2, 4],
            },
            vae_class="AutoencoderKL",
            vae_config={**_TINY_KL, "scaling_factor": 0.3611, "shift_factor": 0.1159},
            vae_scaling_factor=0.3611,
            vae_shift_factor=0.1159,
            text_encoder=flux_text_encoder(
                _t5("t5"), _clip(TINY_POOLED_DIM, TINY_POOLED_DIM), TINY_TEXT_LEN, TINY_TEXT_LEN
            ),
            default_height=32,
            default_width=32,
            default_num_steps=6,
            default_eval_num_steps=12,
            default_guidance_scale=3.5,
            guidance_embedded=True,
            noise_level=0.9,
            shift=3.0,
            dynamic_shift=DynamicShiftSpec(
                base_shift=0.5, max_shift=1.15, base_seq_len=256, max_seq_len=4096
            ),
        ),
        ModelSpec(
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
            vae_config=_TINY_WAN_VAE,
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
        ),
        ModelSpec(
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
            vae_config=_TINY_WAN_VAE,
            vae_latents_mean=WAN_LATENTS_MEAN[:TINY_LATENT_CHANNELS],
            vae_latents_std=WAN_LATENTS_STD[:TINY_LATENT_CHANNELS],
            text_encoder=wan_text_encoder(_t5("umt5"), TINY_TEXT_LEN),
            default_height=32,
            default_width=32,
            default_frames=5,
            default_num_steps=8,
            default_eval_num_steps=16,
            default_guidance_scale=5.0,
            noise_level=0.7,
            shift=3.0,
            is_video=True,
        ),
        ModelSpec(
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
            vae_config=_TINY_HUNYUAN_VAE,
            vae_scaling_factor=0.476986,
            text_encoder=hunyuan_video_text_encoder(
                TINY_LLAMA, _clip(TINY_POOLED_DIM, TINY_POOLED_DIM), TINY_TEXT_LEN, TINY_TEXT_LEN
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
        ),
    ]
