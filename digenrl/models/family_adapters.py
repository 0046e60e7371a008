"""Per-family calls of a diffusers transformer, all returning v = noise - x0 on unpacked latents.

Every function takes unpacked latents (images [B, C, h, w], videos [B, C, f, h, w]), sigma [B] in [0, 1]
(sigma = 1 is pure noise), a `TextCondition` in the model dtype and an optional guidance scale [B], and
reproduces exactly what the family's diffusers pipeline passes to its transformer (diffusers 0.42).

Sign: none of the five pipelines negates the transformer output. All of them step with
FlowMatchEulerDiscreteScheduler (or UniPC with `prediction_type="flow_prediction"` for Wan), whose update
x_{sigma'} = x_sigma + (sigma' - sigma) * model_output integrates dx/dsigma = noise - x0 for
x_sigma = (1 - sigma) x0 + sigma noise; so the raw output already is v = noise - x0 and no flip is applied.
(Pipelines that do flip, e.g. Lumina2 / Z-Image `noise_pred = -noise_pred`, are not in this zoo.)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from digenrl.data.text_condition import TextCondition
from digenrl.models.latent_packing import flux_image_ids, flux_text_ids, pack_2x2, unpack_2x2

VelocityFn = Callable[[nn.Module, Tensor, Tensor, TextCondition, Tensor | None], Tensor]


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


def qwen_image_velocity(
    transformer: nn.Module, latents: Tensor, sigma: Tensor, cond: TextCondition, guidance: Tensor | None
) -> Tensor:
    """QwenImageTransformer2DModel, pipeline_qwenimage.py: 2x2-packed tokens, `timestep = t / 1000` = sigma
    (its Timesteps projection scales by 1000), `img_shapes` [(1, h/2, w/2)] per sample for the 3-axis RoPE,
    `encoder_hidden_states_mask` masking padded text keys. True CFG (with norm rescale) is the caller's."""
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


FAMILY_VELOCITY: dict[str, VelocityFn] = {
    "sd3": sd3_velocity,
    "flux": flux_velocity,
    "qwen-image": qwen_image_velocity,
    "wan": wan_velocity,
    "hunyuan-video": hunyuan_video_velocity,
}
