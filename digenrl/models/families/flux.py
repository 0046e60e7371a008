"""FLUX.1: FluxTransformer2DModel, AutoencoderKL, T5-XXL + CLIP-L (diffusers 0.42 pipeline_flux.py).

The pipeline packs 2x2 latent patches into tokens outside the transformer (`latent_packing.py`) and embeds
the guidance scale (FLUX-dev is guidance-distilled: no CFG doubling). Condition: the T5 last hidden state;
pooled = CLIP-L `pooler_output`. No mask. Zoo entries: black-forest-labs/FLUX.1-dev and `tiny-flux`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from digenrl.models.families.shared import (
    ATTENTION_TARGETS,
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
from digenrl.models.latent_packing import flux_image_ids, flux_text_ids, pack_2x2, unpack_2x2
from digenrl.models.spec_types import DynamicShiftSpec, EncoderComponentSpec, ModelSpec, TextEncoderSpec

if TYPE_CHECKING:
    from digenrl.data.text_condition import TextCondition


def flux_velocity(
    transformer: nn.Module, latents: Tensor, sigma: Tensor, cond: TextCondition, guidance: Tensor | None
) -> Tensor:
    """FluxTransformer2DModel, pipeline_flux.py: 2x2-packed tokens, `timestep = t / 1000` = sigma (the
    transformer multiplies by 1000 itself), `img_ids` (0, row, col) on the packed grid, zero `txt_ids`,
    CLIP pooled projections, and for FLUX-dev the guidance scale as an embedding (`guidance`, also scaled
    by 1000 inside the transformer); guidance-distilled, so no CFG doubling."""
    _, _, h, w = latents.shape
    out = transformer(
        hidden_states=pack_2x2(latents),
        timestep=sigma,
        guidance=guidance if transformer.config.guidance_embeds else None,
        pooled_projections=cond.pooled,
        encoder_hidden_states=cond.embeds,
        txt_ids=flux_text_ids(cond.embeds.shape[1], device=latents.device, dtype=latents.dtype),
        img_ids=flux_image_ids(h, w, device=latents.device, dtype=latents.dtype),
        return_dict=False,
    )[0]
    return unpack_2x2(out, h, w)


def compose_condition(outputs: dict[str, ComponentOutput]) -> tuple[Tensor, Tensor, None]:
    """T5 tokens; pooled CLIP-L."""
    embeds, _, _ = outputs["t5"]
    _, pooled, _ = outputs["clip_l"]
    return embeds, pooled, None


def patch_size(transformer_config: dict[str, Any]) -> tuple[int, int]:
    """(1, 2): the pipeline packs 2x2 outside the model (whose own `patch_size` is 1)."""
    return 1, 2


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
        seq_len=t5_len,
    )


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
FLUX_VAE_CONFIG: dict = {**KL_F8_16CH, "scaling_factor": 0.3611, "shift_factor": 0.1159}

FLUX1_DEV = ModelSpec(
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
    dynamic_shift=DynamicShiftSpec(base_shift=0.5, max_shift=1.15, base_seq_len=256, max_seq_len=4096),
    sources=(HUB + "black-forest-labs/FLUX.1-dev", "diffusers/pipelines/flux/pipeline_flux.py"),
)

TINY_FLUX = ModelSpec(
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
    vae_config={**TINY_KL, "scaling_factor": 0.3611, "shift_factor": 0.1159},
    vae_scaling_factor=0.3611,
    vae_shift_factor=0.1159,
    text_encoder=flux_text_encoder(
        tiny_t5("t5"), tiny_clip(TINY_POOLED_DIM, TINY_POOLED_DIM), TINY_TEXT_LEN, TINY_TEXT_LEN
    ),
    default_height=32,
    default_width=32,
    default_num_steps=6,
    default_eval_num_steps=12,
    default_guidance_scale=3.5,
    guidance_embedded=True,
    noise_level=0.9,
    shift=3.0,
    dynamic_shift=DynamicShiftSpec(base_shift=0.5, max_shift=1.15, base_seq_len=256, max_seq_len=4096),
)

FAMILY = ModelFamily(
    name="flux",
    velocity=flux_velocity,
    compose_condition=compose_condition,
    patch_size=patch_size,
    latent_compression=autoencoder_kl_compression,
    lora_targets=ATTENTION_TARGETS,
    pipeline_class="FluxPipeline",
    kohya_lora=True,
    specs=(FLUX1_DEV, TINY_FLUX),
)
