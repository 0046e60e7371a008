"""The one sampler definition shared by the generator and the trainer.

FlowGRPO's ratio exp(logp_θ − logp_old) is exactly 1 on-policy only if the training forward
recomputes *the same* velocity and *the same* transition density as the rollout (docs/algorithm.md, "Loss").
Both sides therefore go through :class:`Sampler`: :meth:`Sampler.velocity` (model call + guidance)
and :meth:`Sampler.transition` (flow-SDE / CPS / DanceGRPO step with log-prob, fp32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from digenrl.algo.guidance import apply_cfg
from digenrl.algo.sde_step import StepResult, dance_step, flow_sde_step
from digenrl.algo.sigmas import dance_sigmas, dynamic_shift_sigmas, flow_sigmas, stretch_to_terminal
from digenrl.config import Config
from digenrl.models.flow_model import FlowModel
from digenrl.models.specs import ModelSpec
from digenrl.models.text import TextCondition


@dataclass(frozen=True)
class Sampler:
    """Resolved sampler settings (config values, falling back to the model's published defaults)."""

    sde_type: str  # sde | cps | dance
    num_steps: int
    noise_level: float
    guidance_scale: float
    true_cfg: bool  # guidance by a second (unconditional) forward; False = guidance embedding or none
    sigmas: torch.Tensor  # [T+1] float32, 1 -> 0

    @classmethod
    def from_config(cls, cfg: Config, spec: ModelSpec, latent_tokens: int) -> Sampler:
        """``latent_tokens`` (the transformer's image sequence length) feeds the dynamic shift of
        FLUX / Qwen-Image."""
        num_steps = cfg.sampler.num_steps or spec.default_num_steps
        noise_level = spec.noise_level if cfg.sampler.noise_level is None else cfg.sampler.noise_level
        guidance = (
            spec.default_guidance_scale if cfg.sampler.guidance_scale is None else cfg.sampler.guidance_scale
        )
        if cfg.sampler.sde_type == "dance":
            shift = cfg.sampler.shift if cfg.sampler.shift is not None else spec.shift
            sigmas = dance_sigmas(num_steps, shift)
        elif cfg.sampler.shift is not None:
            sigmas = flow_sigmas(num_steps, cfg.sampler.shift)
        elif spec.dynamic_shift is not None:
            sigmas = dynamic_shift_sigmas(num_steps, spec.dynamic_shift.mu(latent_tokens))
            if spec.shift_terminal is not None:
                sigmas = stretch_to_terminal(sigmas, spec.shift_terminal)
        else:
            sigmas = flow_sigmas(num_steps, spec.shift)
        true_cfg = not spec.guidance_embedded and guidance > 1.0
        return cls(
            sde_type=cfg.sampler.sde_type,
            num_steps=num_steps,
            noise_level=float(noise_level),
            guidance_scale=float(guidance),
            true_cfg=true_cfg,
            sigmas=sigmas.to(torch.float32),
        )

    @property
    def model_calls_per_step(self) -> int:
        return 2 if self.true_cfg else 1

    def velocity(
        self,
        model: FlowModel,
        latents: torch.Tensor,
        sigma: torch.Tensor,
        cond: TextCondition,
        uncond: TextCondition | None,
    ) -> torch.Tensor:
        """Guided velocity for ``latents`` at per-sample ``sigma``; one batched forward even with CFG.

        True CFG (SD3, Qwen-Image, Wan): the conditional and unconditional halves go through one
        forward of batch 2B, as the diffusers pipelines do. Guidance-distilled models (FLUX-dev,
        HunyuanVideo) take the scale as an embedding instead.
        """
        dtype = next(model.parameters()).dtype
        x = latents.to(dtype)
        if self.true_cfg:
            if uncond is None:
                raise ValueError("classifier-free guidance needs the unconditional (empty prompt) condition")
            b = x.shape[0]
            both = TextCondition.cat([cond, uncond.repeat_interleave(b) if len(uncond) == 1 else uncond])
            v = model(torch.cat([x, x]), torch.cat([sigma, sigma]), both)
            v_cond, v_uncond = v.float().chunk(2)
            return apply_cfg(v_cond, v_uncond, self.guidance_scale)
        guidance = None
        if not model.uses_true_cfg:
            guidance = torch.full((x.shape[0],), self.guidance_scale, device=x.device, dtype=torch.float32)
        return model(x, sigma, cond, guidance=guidance).float()

    def transition(
        self,
        velocity: torch.Tensor,
        sample: torch.Tensor,
        sigma: torch.Tensor,
        sigma_next: torch.Tensor,
        *,
        noise: torch.Tensor | None = None,
        prev_sample: torch.Tensor | None = None,
        stochastic: bool = True,
    ) -> StepResult:
        """One denoising transition with its log-prob (fp32). ``stochastic=False`` is the ODE step
        (FlowGRPO-Fast's steps outside the SDE window, and evaluation)."""
        level = self.noise_level if stochastic else 0.0
        if self.sde_type == "dance":
            return dance_step(
                velocity, sample, sigma, sigma_next, eta=level, noise=noise, prev_sample=prev_sample
            )
        return flow_sde_step(
            velocity,
            sample,
            sigma,
            sigma_next,
            noise_level=level,
            sde_type=self.sde_type,
            noise=noise,
            prev_sample=prev_sample,
            sigma_max=float(self.sigmas[1]),
        )

    def describe(self) -> str:
        guidance = (
            f"cfg {self.guidance_scale:g}" if self.true_cfg else f"guidance-embed {self.guidance_scale:g}"
        )
        return (
            f"{self.sde_type} sampler, {self.num_steps} steps, noise_level {self.noise_level:g}, {guidance}, "
            f"sigmas {', '.join(f'{s:.3f}' for s in self.sigmas.tolist()[:3])} … 0"
        )
