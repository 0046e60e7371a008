"""FlowModel conventions checked end-to-end against the diffusers pipelines themselves.

For every family the real diffusers pipeline (with the tiny transformer, given latents and prompt embeddings,
no CFG) runs a few Euler steps and returns latents. The reference here is independent of FlowModel: it is the
pipeline's own packing, position ids, timestep scaling, guidance embedding and scheduler. Replaying the same
sigmas with x <- x + (sigma' - sigma) * FlowModel(x, sigma) must give the same latents, which checks the
timestep scale, token packing, masks, guidance and the sign convention v = noise - x0 at once.
"""

from __future__ import annotations

import diffusers
import pytest
import torch

from digenrl.models import ModelBundle

STEPS = 3
H = W = 32


def _euler_with_flow_model(bundle: ModelBundle, x: torch.Tensor, sigmas: torch.Tensor, cond, guidance=None):
    for i in range(len(sigmas) - 1):
        sigma = sigmas[i].expand(x.shape[0])
        with torch.no_grad():
            v = bundle.flow_model(x, sigma, cond, guidance=guidance)
        x = x + (sigmas[i + 1] - sigmas[i]) * v.float()
    return x


def _run_sd3(bundle, x, cond):
    sched = diffusers.FlowMatchEulerDiscreteScheduler(shift=bundle.spec.shift)
    pipe = diffusers.StableDiffusion3Pipeline(
        transformer=bundle.flow_model.transformer,
        scheduler=sched,
        vae=bundle.decoder.vae,
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
        text_encoder_3=None,
        tokenizer_3=None,
    )
    out = pipe(
        latents=x,
        prompt_embeds=cond.embeds,
        pooled_prompt_embeds=cond.pooled,
        guidance_scale=1.0,
        height=H,
        width=W,
        num_inference_steps=STEPS,
        output_type="latent",
    ).images
    return out, sched.sigmas, None


def _run_flux(bundle, x, cond):
    ds = bundle.spec.dynamic_shift
    sched = diffusers.FlowMatchEulerDiscreteScheduler(
        shift=bundle.spec.shift,
        use_dynamic_shifting=True,
        base_shift=ds.base_shift,
        max_shift=ds.max_shift,
        base_image_seq_len=ds.base_seq_len,
        max_image_seq_len=ds.max_seq_len,
    )
    pipe = diffusers.FluxPipeline(
        transformer=bundle.flow_model.transformer,
        scheduler=sched,
        vae=bundle.decoder.vae,
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
    )
    b, c, h, w = x.shape
    packed = diffusers.FluxPipeline._pack_latents(x, b, c, h, w)
    guidance = 2.5
    out = pipe(
        latents=packed,
        prompt_embeds=cond.embeds,
        pooled_prompt_embeds=cond.pooled,
        guidance_scale=guidance,
        height=H,
        width=W,
        num_inference_steps=STEPS,
        output_type="latent",
    ).images
    out = diffusers.FluxPipeline._unpack_latents(out, H, W, pipe.vae_scale_factor)
    return out, sched.sigmas, guidance


def _run_qwen(bundle, x, cond):
    ds = bundle.spec.dynamic_shift
    sched = diffusers.FlowMatchEulerDiscreteScheduler(
        shift=bundle.spec.shift,
        use_dynamic_shifting=True,
        base_shift=ds.base_shift,
        max_shift=ds.max_shift,
        base_image_seq_len=ds.base_seq_len,
        max_image_seq_len=ds.max_seq_len,
        time_shift_type="exponential",
    )
    pipe = diffusers.QwenImagePipeline(
        transformer=bundle.flow_model.transformer,
        scheduler=sched,
        vae=bundle.decoder.vae,
        text_encoder=None,
        tokenizer=None,
    )
    b, c, h, w = x.shape
    packed = diffusers.QwenImagePipeline._pack_latents(x, b, c, h, w)
    out = pipe(
        latents=packed,
        prompt_embeds=cond.embeds,
        prompt_embeds_mask=cond.mask.long(),
        true_cfg_scale=1.0,
        height=H,
        width=W,
        num_inference_steps=STEPS,
        output_type="latent",
    ).images
    out = diffusers.QwenImagePipeline._unpack_latents(out, H, W, pipe.vae_scale_factor)[:, :, 0]
    return out, sched.sigmas, None


def _run_wan(bundle, x, cond):
    sched = diffusers.FlowMatchEulerDiscreteScheduler(shift=bundle.spec.shift)
    pipe = diffusers.WanPipeline(
        transformer=bundle.flow_model.transformer,
        scheduler=sched,
        vae=bundle.decoder.vae,
        text_encoder=None,
        tokenizer=None,
    )
    out = pipe(
        latents=x,
        prompt_embeds=cond.embeds,
        guidance_scale=1.0,
        height=H,
        width=W,
        num_frames=bundle.spec.default_frames,
        num_inference_steps=STEPS,
        output_type="latent",
    ).frames
    return out, sched.sigmas, None


def _run_hunyuan(bundle, x, cond):
    sched = diffusers.FlowMatchEulerDiscreteScheduler(shift=bundle.spec.shift)
    pipe = diffusers.HunyuanVideoPipeline(
        transformer=bundle.flow_model.transformer,
        scheduler=sched,
        vae=bundle.decoder.vae,
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
    )
    guidance = 4.0
    out = pipe(
        latents=x,
        prompt_embeds=cond.embeds,
        pooled_prompt_embeds=cond.pooled,
        prompt_attention_mask=cond.mask,
        guidance_scale=guidance,
        height=H,
        width=W,
        num_frames=bundle.spec.default_frames,
        num_inference_steps=STEPS,
        output_type="latent",
    ).frames
    return out, sched.sigmas, guidance


RUNNERS = {
    "tiny-sd3": _run_sd3,
    "tiny-flux": _run_flux,
    "tiny-qwen-image": _run_qwen,
    "tiny-wan": _run_wan,
    "tiny-hunyuan-video": _run_hunyuan,
}


@pytest.mark.parametrize("name", sorted(RUNNERS))
def test_euler_with_flow_model_matches_diffusers_pipeline(name, bundles):
    bundle = bundles(name)
    spec = bundle.spec
    shape = bundle.flow_model.latent_shape(H, W, spec.default_frames)
    x = torch.randn(2, *shape)
    # prompts of different lengths so the Qwen / Hunyuan masks have padding
    cond = bundle.text_encoder.encode(["a red cube on a table", "bird"])
    expected, sigmas, guidance = RUNNERS[name](bundle, x.clone(), cond)
    assert sigmas[0] == 1.0 and sigmas[-1] == 0.0 and len(sigmas) == STEPS + 1
    got = _euler_with_flow_model(bundle, x.clone(), sigmas.float(), cond, guidance=guidance)
    assert expected.shape == got.shape
    torch.testing.assert_close(got, expected.float(), rtol=1e-4, atol=1e-4)
    # the model output is not negligible: a wrong sign or scale would be visible
    assert (got - x).abs().mean() > 1e-2
