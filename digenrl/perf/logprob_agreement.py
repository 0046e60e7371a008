"""Does an optimised generator path sample the same policy as the eager one?

FlowGRPO's ratio r = exp(logp_θ − logp_old) must be 1 on-policy (docs/algorithm.md, "Loss"): the trainer
recomputes the log-prob of the generator's recorded transition. If the generator runs a different kernel
path (compiled graphs, another attention kernel) than the trainer, r − 1 is that path's numerical difference,
and with FlowGRPO's clip range of 1e-4 a spread above it clips on-policy units. Two checks, with the same
seeds for both paths (initial latent and per-step SDE noise from :func:`digenrl.rollout.noise.step_noise`):

* teacher-forced: the other path recomputes the log-prob of the reference path's recorded transitions
  (exactly what the trainer does) → max |r − 1|, max |Δ logp|;
* free-running: the other path samples its own trajectory from the same noise → relative L2 error of the
  latents after K steps and of the per-step log-probs (bf16 operands give 1e-3 … 1e-2 relative error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from digenrl.data.text_condition import TextCondition
from digenrl.models.flow_model import FlowModel
from digenrl.rollout.noise import INITIAL_NOISE_STEP, step_noise
from digenrl.rollout.sampler import Sampler

BF16_RELATIVE_TOLERANCE = 2e-2
"""Pass bound for relative L2 errors of a bf16 path (bf16 operands land between 1e-3 and 1e-2, METHOD.md;
a compiled graph re-associates sums, so allow 2x that)."""


@dataclass
class Trajectory:
    """K steps of one rollout: latents [K+1, B, ...] (x_0 = initial noise) and log-probs [K, B], float32."""

    latents: torch.Tensor
    log_probs: torch.Tensor


@torch.no_grad()
def rollout(
    sampler: Sampler,
    model: FlowModel,
    seeds: list[int],
    latent_shape: tuple[int, ...],
    cond: TextCondition,
    uncond: TextCondition | None,
    steps: int,
) -> Trajectory:
    """``steps`` SDE steps from the seeds' initial noise, with the seeds' per-step noise."""
    device = model.device
    steps = min(steps, sampler.num_steps)
    x = step_noise(seeds, INITIAL_NOISE_STEP, latent_shape, device=device)
    sigmas = sampler.sigmas.to(device)
    b = len(seeds)
    latents, log_probs = [x], []
    for i in range(steps):
        s, sn = sigmas[i].expand(b), sigmas[i + 1].expand(b)
        v = sampler.velocity(model, x, s, cond, uncond)
        res = sampler.transition(v, x, s, sn, noise=step_noise(seeds, i, latent_shape, device=device))
        x = res.prev_sample
        latents.append(x)
        log_probs.append(res.log_prob)
    return Trajectory(torch.stack(latents).float(), torch.stack(log_probs).float())


@torch.no_grad()
def recompute_log_probs(
    sampler: Sampler,
    model: FlowModel,
    reference: Trajectory,
    cond: TextCondition,
    uncond: TextCondition | None,
) -> torch.Tensor:
    """log-probs [K, B] of ``reference``'s recorded transitions under ``model`` (the trainer's recompute)."""
    device = model.device
    sigmas = sampler.sigmas.to(device)
    b = reference.latents.shape[1]
    out = []
    for i in range(reference.log_probs.shape[0]):
        x, x_next = reference.latents[i], reference.latents[i + 1]
        s, sn = sigmas[i].expand(b), sigmas[i + 1].expand(b)
        v = sampler.velocity(model, x, s, cond, uncond)
        out.append(sampler.transition(v, x, s, sn, prev_sample=x_next).log_prob)
    return torch.stack(out).float()


def _relative_l2(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.double(), ref.double()
    denom = float(ref.norm())
    return float((a - ref).norm()) / denom if denom > 0 else float((a - ref).norm())


def compare(
    reference: Trajectory,
    free_running: Trajectory,
    recomputed_log_probs: torch.Tensor,
    *,
    clip_range: float,
    tolerance: float = BF16_RELATIVE_TOLERANCE,
) -> dict[str, float | bool]:
    """Agreement numbers of another path against ``reference`` (see the module docstring)."""
    delta = (recomputed_log_probs.double() - reference.log_probs.double()).cpu()
    ratio_spread = float((delta.exp() - 1).abs().max()) if delta.numel() else 0.0
    latent_err = _relative_l2(free_running.latents[-1], reference.latents[-1])
    logp_err = _relative_l2(free_running.log_probs, reference.log_probs)
    finite = bool(
        torch.isfinite(free_running.latents).all()
        and torch.isfinite(free_running.log_probs).all()
        and torch.isfinite(recomputed_log_probs).all()
    )
    return {
        "steps": int(reference.log_probs.shape[0]),
        "samples": int(reference.log_probs.shape[1]),
        "max_abs_ratio_minus_1": ratio_spread,
        "max_abs_delta_logp": float(delta.abs().max()) if delta.numel() else 0.0,
        "final_latent_rel_l2": latent_err,
        "log_prob_rel_l2": logp_err,
        "clip_range": clip_range,
        "ratio_within_clip_range": ratio_spread <= clip_range,
        "tolerance": tolerance,
        "finite": finite,
        "pass": finite and latent_err <= tolerance and math.isfinite(ratio_spread),
    }
