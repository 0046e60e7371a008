"""Pieces several model families share: the text-encoder configs (CLIP-L, CLIP-G, T5-XXL), the VAE
structures and their downsampling rules (AutoencoderKL of SD3 / FLUX; the Wan VAE, which Qwen-Image's
VAE copies with the same per-channel statistics), the tiny building blocks of the CPU variants, and the
joint-attention LoRA targets.

Transformers dicts are the configs of the encoders the diffusers pipelines load (see each family's module
for its sources).
"""

from __future__ import annotations

from typing import Any

HUB = "https://huggingface.co/"

# --- text encoders (transformers configs) -------------------------------------------------------------

# openai/clip-vit-large-patch14 text tower: SD3 `text_encoder`, FLUX `text_encoder`, HunyuanVideo
# `text_encoder_2`.
CLIP_L_CONFIG: dict = {
    "model_type": "clip_text_model",
    "vocab_size": 49408,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "projection_dim": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "max_position_embeddings": 77,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 1,
}

# laion/CLIP-ViT-bigG-14-laion2B-39B-b160k text tower: SD3 `text_encoder_2`.
CLIP_G_CONFIG: dict = {
    "model_type": "clip_text_model",
    "vocab_size": 49408,
    "hidden_size": 1280,
    "intermediate_size": 5120,
    "projection_dim": 1280,
    "num_hidden_layers": 32,
    "num_attention_heads": 20,
    "max_position_embeddings": 77,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-5,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 1,
}

# google/t5-v1_1-xxl encoder: SD3 `text_encoder_3`, FLUX `text_encoder_2`.
T5_XXL_CONFIG: dict = {
    "model_type": "t5",
    "vocab_size": 32128,
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

# --- VAEs ----------------------------------------------------------------------------------------------

KL_F8_16CH: dict = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "block_out_channels": [128, 256, 512, 512],
    "layers_per_block": 2,
    "act_fn": "silu",
    "latent_channels": 16,
    "norm_num_groups": 32,
    "sample_size": 1024,
    "force_upcast": True,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
    "mid_block_add_attention": True,
}


def autoencoder_kl_compression(vae_config: dict[str, Any]) -> tuple[int, int]:
    """(temporal, spatial) downsampling of an AutoencoderKL: 2 per down block after the first."""
    return 1, 2 ** (len(vae_config["block_out_channels"]) - 1)


# Wan2.1 VAE statistics (AutoencoderKLWan config of Wan-AI/Wan2.1-T2V-*-Diffusers; Qwen-Image's VAE ships the
# same per-channel statistics).
WAN_LATENTS_MEAN = (
    -0.7571,
    -0.7089,
    -0.9113,
    0.1075,
    -0.1745,
    0.9653,
    -0.1517,
    1.5508,
    0.4134,
    -0.0715,
    0.5517,
    -0.3632,
    -0.1922,
    -0.9497,
    0.2503,
    -0.2921,
)
WAN_LATENTS_STD = (
    2.8184,
    1.4541,
    2.3275,
    2.6558,
    1.2196,
    1.7708,
    2.6052,
    2.0743,
    3.2687,
    2.1526,
    2.8652,
    1.5579,
    1.6382,
    1.1253,
    2.8251,
    1.916,
)


def wan_vae_compression(vae_config: dict[str, Any]) -> tuple[int, int]:
    """(temporal, spatial) downsampling of AutoencoderKLWan / AutoencoderKLQwenImage: 2 per temporal
    down-sampling stage, 2 per level of `dim_mult` after the first."""
    return 2 ** sum(bool(t) for t in vae_config["temperal_downsample"]), 2 ** (
        len(vae_config["dim_mult"]) - 1
    )


# --- tiny building blocks (the CPU variants of every family) -------------------------------------------

TINY_VOCAB = 30522  # BERT WordPiece vocabulary of the offline tokenizer (overridden from the tokenizer)
TINY_TEXT_LEN = 16
TINY_TEXT_DIM = 32
TINY_POOLED_DIM = 16
TINY_LATENT_CHANNELS = 4


def tiny_clip(hidden: int, projection: int) -> dict:
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


def tiny_t5(model_type: str) -> dict:
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


# AutoencoderKL with 3 blocks: 4x downsampling, so 32 px -> 8x8 latents (16 SD3 / FLUX tokens).
TINY_KL: dict = {
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
TINY_WAN_VAE: dict = {
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

# --- LoRA ----------------------------------------------------------------------------------------------

ATTENTION_TARGETS: tuple[str, ...] = (
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
)
"""flow_grpo scripts/train_sd3.py's LoRA targets. In diffusers 0.42 the same names exist in the dual-stream
blocks of SD3 (``JointTransformerBlock.attn``), FLUX (``FluxAttention``; single blocks have q/k/v only),
Qwen-Image and HunyuanVideo (whose token refiner also has an ``attn.to_q`` … and is matched too). SD3.5's
second self-attention ``attn2`` is *not* matched, as in flow_grpo."""
