"""Published configurations of the real generators, written as data.

Transformer and VAE dicts are the `config.json` files of the diffusers repositories on the Hugging Face hub
(stabilityai/stable-diffusion-3.5-medium, black-forest-labs/FLUX.1-dev, Qwen/Qwen-Image,
Wan-AI/Wan2.1-T2V-{1.3B,14B}-Diffusers, hunyuanvideo-community/HunyuanVideo), minus bookkeeping keys
(`_class_name`, `_diffusers_version`). Text-encoder dicts are the transformers configs of the encoders
those pipelines load. Parameter counts of the transformers, instantiated on the meta device, match
docs/algorithm.md, "Model configurations" (tests/models/test_specs.py): SD3.5-M 2.243 B, FLUX.1-dev
11.901 B, Qwen-Image 20.430 B, Wan2.1-1.3B 1.419 B, Wan2.1-14B 14.288 B, HunyuanVideo 12.821 B.

Sampling defaults: train-time steps / eval steps / CFG from docs/algorithm.md, "Rollout settings" (FlowGRPO
configs); schedule shifts from each repository's `scheduler/scheduler_config.json`; prompt lengths,
templates and hidden-state indices from the diffusers pipelines (pipeline_stable_diffusion_3.py,
pipeline_flux.py, pipeline_qwenimage.py, pipeline_wan.py, pipeline_hunyuan_video.py, diffusers 0.42).
"""

from __future__ import annotations

from digenrl.models.spec_types import (
    DynamicShiftSpec,
    EncoderComponentSpec,
    ModelSpec,
    TextEncoderSpec,
)

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

# Chat templates (diffusers pipeline_qwenimage.py `prompt_template_encode`, start index 34;
# pipeline_hunyuan_video.py `DEFAULT_PROMPT_TEMPLATE`, crop_start 95).
QWEN_IMAGE_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
    "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
HUNYUAN_VIDEO_TEMPLATE = (
    "<|start_header_id|>system<|end_header_id|>\n\nDescribe the video by detailing the following aspects: "
    "1. The main content and theme of the video."
    "2. The color, shape, size, texture, quantity, text, and spatial relationships of the objects."
    "3. Actions, events, behaviors temporal relationships, physical movement changes of the objects."
    "4. background environment, light, style and atmosphere."
    "5. camera angles, movements, and transitions used in the video:<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|>"
)


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
    )


def flux_text_encoder(t5: dict, clip_l: dict, t5_len: int, clip_len: int) -> TextEncoderSpec:
    """FLUX: T5 last hidden state (sequence) + CLIP-L pooler_output (pooled), pipeline_flux.py."""
    return TextEncoderSpec(
        composition="flux",
        components=(
            EncoderComponentSpec("t5", "T5EncoderModel", t5, t5_len, subfolder="text_encoder_2"),
            EncoderComponentSpec(
                "clip_l", "CLIPTextModel", clip_l, clip_len, emits_sequence=False, pooled="pooler_output"
            ),
        ),
        embed_dim=t5["d_model"],
        pooled_dim=clip_l["hidden_size"],
        uses_mask=False,
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
    )


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
    )


# --- VAEs ----------------------------------------------------------------------------------------------

_KL_F8_16CH: dict = {
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
SD3_VAE_CONFIG: dict = {**_KL_F8_16CH, "scaling_factor": 1.5305, "shift_factor": 0.0609}
FLUX_VAE_CONFIG: dict = {**_KL_F8_16CH, "scaling_factor": 0.3611, "shift_factor": 0.1159}

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

# --- transformers --------------------------------------------------------------------------------------

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
FLUX1_DEV_TRANSFORMER: dict = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": 768,
    "guidance_embeds": True,
    "axes_dims_rope": [16, 56, 56],
}
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

_HUB = "https://huggingface.co/"


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
        sources=(_HUB + repo, "diffusers/pipelines/wan/pipeline_wan.py"),
    )


def published_specs() -> list[ModelSpec]:
    """The real entries of the model zoo."""
    return [
        ModelSpec(
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
                _HUB + "stabilityai/stable-diffusion-3.5-medium",
                "diffusers/pipelines/stable_diffusion_3/pipeline_stable_diffusion_3.py",
            ),
        ),
        ModelSpec(
            name="flux.1-dev",
            family="flux",
            transformer_class="FluxTransformer2DModel",
            transformer_config=FLUX1_DEV_TRANSFORMER,
            vae_class="AutoencoderKL",
            vae_config=FLUX_VAE_CONFIG,
            vae_scaling_factor=0.3611,
            vae_shift_factor=0.1159,
            text_encoder=flux_text_encoder(T5_XXL_CONFIG, CLIP_L_CONFIG, 512, 77),
            default_num_steps=6,
            default_eval_num_steps=28,
            default_guidance_scale=3.5,
            guidance_embedded=True,
            noise_level=0.9,
            shift=3.0,
            dynamic_shift=DynamicShiftSpec(
                base_shift=0.5, max_shift=1.15, base_seq_len=256, max_seq_len=4096
            ),
            sources=(_HUB + "black-forest-labs/FLUX.1-dev", "diffusers/pipelines/flux/pipeline_flux.py"),
        ),
        ModelSpec(
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
            sources=(_HUB + "Qwen/Qwen-Image", "diffusers/pipelines/qwenimage/pipeline_qwenimage.py"),
        ),
        _wan_spec("wan2.1-1.3b", WAN21_1_3B_TRANSFORMER, "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"),
        _wan_spec("wan2.1-14b", WAN21_14B_TRANSFORMER, "Wan-AI/Wan2.1-T2V-14B-Diffusers"),
        ModelSpec(
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
                _HUB + "hunyuanvideo-community/HunyuanVideo",
                "diffusers/pipelines/hunyuan_video/pipeline_hunyuan_video.py",
            ),
        ),
    ]
