"""PPO-clip policy loss and the KL-to-reference penalty of FlowGRPO, per unit (not reduced).

A unit is one (sample, trained timestep). The caller reduces (mean over units, divided by the
gradient-accumulation count) so that gradient accumulation over fragments stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from digenrl.algo.sde_step import mean_over_non_batch


@dataclass
class PolicyLossTerms:
    """loss [N] per unit; ratio [N] = exp(logp − logp_old); clipped [N] bool = |ratio − 1| > ε.

    `clipped.float().mean()` is flow_grpo's `clipfrac` metric (scripts/train_sd3.py).
    """

    loss: Tensor
    ratio: Tensor
    clipped: Tensor


def clipped_policy_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    clip_range: float,
    *,
    log_ratio_bias: Tensor | None = None,
    log_ratio_scale: Tensor | None = None,
) -> PolicyLossTerms:
    """max(−A·ratio, −A·clip(ratio, 1 − ε, 1 + ε)) per unit (PPO, Schulman et al. 2017).

    Source: flow_grpo scripts/train_sd3.py (`unclipped_loss`, `clipped_loss`, `torch.maximum`) and
    DanceGRPO fastvideo/train_grpo_flux.py (same form). `old_log_prob` and `advantages` are data and are
    detached; gradients flow through `log_prob` only. With log_prob == old_log_prob the ratio is
    exp(0) = 1 exactly and the loss is exactly −A.

    GRPO-Guard's RatioNorm (:func:`ratio_norm_terms`) passes ``log_ratio_bias`` b and ``log_ratio_scale`` s:
    ratio = exp((logp − logp_old + b)·s) [N]; without them the ratio is FlowGRPO's, bit for bit.
    """
    if not (0 < clip_range < 1):
        raise ValueError(f"clip_range must be in (0, 1), got {clip_range!r}")
    if not (log_prob.shape == old_log_prob.shape == advantages.shape):
        raise ValueError(
            "log_prob, old_log_prob and advantages must have the same shape, got "
            f"{tuple(log_prob.shape)}, {tuple(old_log_prob.shape)}, {tuple(advantages.shape)}"
        )
    advantages = advantages.detach()
    log_ratio = log_prob - old_log_prob.detach()
    if log_ratio_bias is not None:
        log_ratio = log_ratio + log_ratio_bias
    if log_ratio_scale is not None:
        log_ratio = log_ratio * log_ratio_scale.detach()
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped_term = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    loss = torch.maximum(unclipped, clipped_term)
    clipped = (ratio.detach() - 1.0).abs() > clip_range
    return PolicyLossTerms(loss=loss, ratio=ratio, clipped=clipped)


def ratio_norm_terms(mean: Tensor, old_mean: Tensor, std: Tensor) -> tuple[Tensor, Tensor]:
    """GRPO-Guard's RatioNorm: the bias b [N] and scale s [N] of the normalised log-ratio (log r + b)·s.

    Source: Wang et al. 2025, "GRPO-Guard: Mitigating Implicit Over-Optimization in Flow Matching via
    Regulated Clipping", arXiv 2510.22319 (RatioNorm); as verl-omni implements it
    (verl_omni/trainer/diffusion/diffusion_algos.py, `GRPOGuardLoss.compute_loss`; docs algo/grpo_guard.md).
    With x' = μ_old + s·ε and the log-density averaged over the D latent elements (docs/algorithm.md,
    "Flow-SDE step"), log r = −mean((μ_θ − μ_old)²)/(2s²) + mean(ε·(μ_θ − μ_old))/s: the first term pulls
    every ratio below 1 (the "left shift" that keeps positive-advantage units out of the upper clip) and the
    second has a spread that varies with the step's s. b = mean((μ_θ − μ_old)²)/(2s²) removes the shift and
    the factor s = σ_t·sqrt(−dt) (the transition std) puts every step on one scale: (log r + b)·s =
    mean(ε·(μ_θ − μ_old)). The gradient flows through μ_θ in both log r and b; s is data.
    """
    if mean.shape != old_mean.shape or mean.ndim < 1:
        raise ValueError(
            "mean and old_mean must have the same shape [N, ...], got "
            f"{tuple(mean.shape)}, {tuple(old_mean.shape)}"
        )
    scale = std.detach().reshape(mean.shape[0], -1)[:, 0]
    return mean_over_non_batch((mean - old_mean.detach()) ** 2) / (2 * scale**2), scale


KL_STD_ERROR = "std must be > 0 everywhere (a deterministic step has no KL)"


def kl_to_reference(mean: Tensor, ref_mean: Tensor, std: Tensor | float, *, check_std: bool = True) -> Tensor:
    """Per-sample mean over non-batch dims of (μ_θ − μ_ref)² / (2·std²); returns [N].

    Source: flow_grpo scripts/train_sd3.py (`kl_loss = ((prev_sample_mean - prev_sample_mean_ref) ** 2)
    .mean(dim=(1, 2, 3), keepdim=True) / (2 * std_dev_t ** 2)`): the KL between two Gaussians of equal std
    reduces to this. flow_grpo passes `std_dev_t` (σ_t, `StepResult.noise_scale`), not the transition
    std σ_t·sqrt(−dt) (`StepResult.std`, the exact per-element KL); the two differ by the factor −dt,
    which is folded into β. `ref_mean` comes from the frozen reference policy and is detached.
    ``check_std=False``: the caller checked std > 0 already (a read of its values, which the trainer makes
    once per batch rather than once per micro-batch).
    """
    if mean.shape != ref_mean.shape or mean.ndim < 1:
        raise ValueError(
            "mean and ref_mean must have the same shape [N, ...], got "
            f"{tuple(mean.shape)} and {tuple(ref_mean.shape)}"
        )
    std = torch.as_tensor(std, dtype=mean.dtype, device=mean.device)
    if check_std and not bool((std > 0).all()):
        raise ValueError(KL_STD_ERROR)
    per_element = (mean - ref_mean.detach()) ** 2 / (2 * std**2)
    if per_element.shape != mean.shape:
        raise ValueError(
            f"std must broadcast to the mean's shape {tuple(mean.shape)}, got {tuple(std.shape)}"
        )
    return per_element if per_element.ndim == 1 else per_element.mean(dim=tuple(range(1, per_element.ndim)))
