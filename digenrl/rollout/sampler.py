"""The one sampler definition shared by the generator and the trainer.

FlowGRPO's ratio exp(logp_θ − logp_old) is exactly 1 on-policy only if the training forward
recomputes *the same* velocity and *the same* transition density as the rollout (docs/algorithm.md, "Loss").
Both sides therefore go through :class:`Sampler`: :meth:`Sampler.velocity` (model call + guidance)
and :meth:`Sampler.transition` (flow-SDE / CPS / DanceGRPO step with log-prob, fp32).

CFG and the training gradient (``algo.cfg_grad``). With classifier-free guidance the guided velocity is
v = v_u + w·(v_c − v_u), so the full gradient is (1 − w)·∂v_u + w·∂v_c. Public FlowGRPO-style trainers differ:
``compute_log_prob`` in yifan123/flow_grpo_refactor scripts/train_sd3.py detaches the unconditional
prediction, so the gradient is w·∂v_c (``cfg_grad=cond``, the default here); yifan123/flow_grpo
scripts/train_sd3.py and scripts/train_wan2_1.py, and DanceGRPO's fastvideo/train_grpo_sd35.py,
backpropagate through both branches (``cfg_grad=both``). Values, log-probs and ratios are the same either way
(up to float rounding); only the update differs. ``cond`` also makes the training step cheaper: the
unconditional forward needs no autograd graph (:data:`CFG_SPLIT_MIN_BATCH`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from digenrl.algo.guidance import apply_cfg
from digenrl.algo.sde_step import StepResult, dance_step, flow_sde_step
from digenrl.algo.sigmas import dance_sigmas, dynamic_shift_sigmas, flow_sigmas, stretch_to_terminal
from digenrl.config import CFG_GRAD_MODES, Config
from digenrl.data.text_condition import TextCondition
from digenrl.models.flow_model import FlowModel
from digenrl.models.specs import ModelSpec

CFG_SPLIT_MIN_BATCH = 8
"""Smallest training batch (samples B, before CFG doubling) at which ``cfg_grad=cond`` runs the unconditional
branch as its own pass of B samples without an autograd graph, and the conditional branch as a pass of B with
one; below it both branches keep the rollout's single batched forward of 2B, the unconditional half detached
(same gradient, same numerics as the rollout). Measured on one H200 at SD3.5-medium size (eager, backward
through every block): the separate no-graph pass costs 0.72× the time (0.54× the memory) of both branches in
one graph at B=16, 0.79× at B=8, but 1.10× at B=4, where two half-size passes are less efficient than one;
detaching inside the batched pass saves nothing. ``experiments/measure.py trainer --cfg-grad cond,both
--cfg-split-min-batch 1`` re-measures the crossover."""


@dataclass(frozen=True)
class Sampler:
    """Resolved sampler settings (config values, falling back to the model's published defaults)."""

    sde_type: str  # sde | cps | dance
    num_steps: int
    noise_level: float
    guidance_scale: float
    true_cfg: bool  # guidance by a second (unconditional) forward; False = guidance embedding or none
    sigmas: torch.Tensor  # [T+1] float32, 1 -> 0
    cfg_grad: str = "cond"  # algo.cfg_grad: cond | both (module docstring)
    cfg_split_min_batch: int = CFG_SPLIT_MIN_BATCH  # see CFG_SPLIT_MIN_BATCH

    def __post_init__(self) -> None:
        if self.cfg_grad not in CFG_GRAD_MODES:
            raise ValueError(
                f"algo.cfg_grad={self.cfg_grad!r} is not allowed; choose one of: {', '.join(CFG_GRAD_MODES)}"
            )
        if self.cfg_split_min_batch < 1:
            raise ValueError(f"cfg_split_min_batch must be >= 1, got {self.cfg_split_min_batch}")

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
            cfg_grad=cfg.algo.cfg_grad,
        )

    @property
    def model_calls_per_step(self) -> int:
        return 2 if self.true_cfg else 1

    def separate_uncond_pass(self, batch: int) -> bool:
        """Whether a training forward (autograd recording) of ``batch`` samples runs the unconditional
        branch as its own no-graph pass: true CFG, ``cfg_grad=cond`` and ``batch >= cfg_split_min_batch``."""
        return self.true_cfg and self.cfg_grad == "cond" and batch >= self.cfg_split_min_batch

    def velocity(
        self,
        model: FlowModel,
        latents: torch.Tensor,
        sigma: torch.Tensor,
        cond: TextCondition,
        uncond: TextCondition | None,
    ) -> torch.Tensor:
        """Guided velocity for ``latents`` at per-sample ``sigma``.

        True CFG (SD3, Qwen-Image, Wan): the conditional and unconditional halves go through one forward of
        batch 2B, as the diffusers pipelines do; this is always the layout without autograd (the rollout,
        the KL reference, log-prob checks). With autograd recording (the trainer's forward) ``cfg_grad``
        decides the gradient (module docstring): ``both`` backpropagates through the batched forward,
        ``cond`` detaches the unconditional prediction, and from :data:`CFG_SPLIT_MIN_BATCH` samples on
        computes it in a separate pass of B under ``torch.no_grad()`` before the conditional pass of B, so
        the graph, its saved activations and the backward cover B samples instead of 2B. The values agree
        with the batched forward up to float rounding (a different batch composition; bit-identical below
        the threshold). Guidance-distilled models (FLUX-dev, HunyuanVideo) take the scale as an embedding.
        """
        dtype = next(model.parameters()).dtype
        x = latents.to(dtype)
        if self.true_cfg:
            if uncond is None:
                raise ValueError("classifier-free guidance needs the unconditional (empty prompt) condition")
            b = x.shape[0]
            uncond = uncond.repeat_interleave(b) if len(uncond) == 1 else uncond
            if torch.is_grad_enabled() and self.separate_uncond_pass(b):
                with torch.no_grad():  # first, so its activations are freed before the graph is built
                    v_uncond = model(x, sigma, uncond).float()
                v_cond = model(x, sigma, cond).float()
            else:
                v = model(torch.cat([x, x]), torch.cat([sigma, sigma]), TextCondition.cat([cond, uncond]))
                v_cond, v_uncond = v.float().chunk(2)
                if self.cfg_grad == "cond":
                    v_uncond = v_uncond.detach()
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
        sigmas_checked: bool = False,
    ) -> StepResult:
        """One denoising transition with its log-prob (fp32). ``stochastic=False`` is the ODE step
        (FlowGRPO-Fast's steps outside the SDE window, and evaluation). ``sigmas_checked``: the caller ran
        :func:`~digenrl.algo.sde_step.check_sigma_pairs` on these sigmas (its grid or batch) once, so the step
        does not read them back from the device."""
        level = self.noise_level if stochastic else 0.0
        if self.sde_type == "dance":
            return dance_step(
                velocity,
                sample,
                sigma,
                sigma_next,
                eta=level,
                noise=noise,
                prev_sample=prev_sample,
                sigmas_checked=sigmas_checked,
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
            sigma_max=self.sigma_max,
            sigmas_checked=sigmas_checked,
        )

    @cached_property
    def sigma_max(self) -> float:
        """The grid's σ_1 as a Python float, read once (flow_sde_step's ``sigma_max``)."""
        return float(self.sigmas[1])

    def describe(self) -> str:
        guidance = (
            f"cfg {self.guidance_scale:g} (grad: {self.cfg_grad})"
            if self.true_cfg
            else f"guidance-embed {self.guidance_scale:g}"
        )
        return (
            f"{self.sde_type} sampler, {self.num_steps} steps, noise_level {self.noise_level:g}, {guidance}, "
            f"sigmas {', '.join(f'{s:.3f}' for s in self.sigmas.tolist()[:3])} … 0"
        )
