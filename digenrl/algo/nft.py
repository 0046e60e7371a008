"""DiffusionNFT's loss on the forward process: no likelihood, no SDE, the clean sample and its reward only.

Source: Zheng et al. 2025, "DiffusionNFT: Online Diffusion Reinforcement with Forward Process", arXiv
2509.16117; code NVlabs/DiffusionNFT (`scripts/train_nft_sd3.py`, the policy loss of the training loop, and
`config/nft.py` for the defaults), the same loss as verl-omni's `DiffusionNFTLoss`
(verl_omni/trainer/diffusion/diffusion_algos.py). Formulas re-derived and checked against them, not copied.

A training unit is (sample, timestep σ): x_σ = (1 − σ)·x0 + σ·ε with x0 the rollout's clean latent and ε
fresh noise. With v_θ the current velocity and v_old the sampling policy's (detached):

* optimality probability r = clamp(clamp(A, ±A_max)/A_max/2 + 1/2, 0, 1) (A the group advantage, A_max =
  `adv_clip_max`, 5 in the published configs), so r > 1/2 marks a better-than-group sample;
* implicit positive policy v⁺ = β·v_θ + (1 − β)·v_old, implicit negative v⁻ = (1 + β)·v_old − β·v_θ
  (the guidance parameterisation: both move with θ, in opposite directions, by the strength β);
* x̂0⁺ = x_σ − σ·v⁺, x̂0⁻ = x_σ − σ·v⁻, each loss weighted adaptively by the detached mean absolute error
  w = max(mean|x̂0 − x0|, 1e-5): L⁺ = mean((x̂0⁺ − x0)²)/w⁺, L⁻ = mean((x̂0⁻ − x0)²)/w⁻;
* loss per unit = A_max·(r·L⁺ + (1 − r)·L⁻)/β (the published loss multiplies by `adv_clip_max`).

Positive samples pull the implicit positive policy to their x0, negative ones pull the implicit negative
policy there, which pushes v_θ away: reinforcement without a log-probability, so any sampler (the ODE)
generates the data.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from digenrl.algo.sde_step import mean_over_non_batch

#: the adaptive weights' floor (published `.clip(min=1e-5)`)
ADAPTIVE_WEIGHT_MIN = 1e-5


@dataclass
class NFTLossTerms:
    """loss [N] per unit; optimality probability r [N]; the positive and negative losses L⁺, L⁻ [N]."""

    loss: Tensor
    r: Tensor
    positive: Tensor
    negative: Tensor


def optimality_probability(advantages: Tensor, adv_clip_max: float) -> Tensor:
    """r = clamp(clamp(A, ±A_max)/A_max/2 + 1/2, 0, 1) [N] (published `normalized_advantages_clip`)."""
    clipped = advantages.detach().clamp(-adv_clip_max, adv_clip_max)
    return (clipped / adv_clip_max / 2 + 0.5).clamp(0, 1)


def nft_loss(
    velocity: Tensor,
    old_velocity: Tensor,
    noised: Tensor,
    clean: Tensor,
    sigma: Tensor,
    advantages: Tensor,
    *,
    beta: float,
    adv_clip_max: float,
) -> NFTLossTerms:
    """DiffusionNFT's policy loss per unit (module docstring), in float32: ``velocity`` v_θ [N, ...] carries
    the graph; ``old_velocity`` v_old, ``noised`` x_σ, ``clean`` x0 [N, ...], ``sigma`` [N] and
    ``advantages`` [N] are data."""
    if not beta > 0 or not adv_clip_max > 0:
        raise ValueError(f"beta and adv_clip_max must be > 0, got {beta!r}, {adv_clip_max!r}")
    if not (velocity.shape == old_velocity.shape == noised.shape == clean.shape) or velocity.ndim < 2:
        raise ValueError(
            "velocity, old_velocity, noised and clean must share one shape [N, ...], got "
            f"{[tuple(t.shape) for t in (velocity, old_velocity, noised, clean)]}"
        )
    v = velocity.float()
    v_old = old_velocity.detach().float()
    x_t, x0 = noised.detach().float(), clean.detach().float()
    s = sigma.detach().float().reshape(-1, *([1] * (v.ndim - 1)))
    r = optimality_probability(advantages.float(), adv_clip_max)
    positive_x0 = x_t - s * (beta * v + (1 - beta) * v_old)
    negative_x0 = x_t - s * ((1 + beta) * v_old - beta * v)

    def adaptive(pred: Tensor) -> Tensor:
        with torch.no_grad():
            weight = (pred.double() - x0.double()).abs()
            weight = mean_over_non_batch(weight).clamp(min=ADAPTIVE_WEIGHT_MIN).float()
        return mean_over_non_batch((pred - x0) ** 2) / weight

    positive, negative = adaptive(positive_x0), adaptive(negative_x0)
    loss = adv_clip_max * (r * positive + (1 - r) * negative) / beta
    return NFTLossTerms(loss=loss, r=r, positive=positive, negative=negative)


def velocity_kl(velocity: Tensor, ref_velocity: Tensor) -> Tensor:
    """DiffusionNFT's KL surrogate to the reference policy, mean((v_θ − v_ref)²) over non-batch dims [N]
    (published `kl_div`, weighted by `train.beta` = 1e-4 in config/nft.py for SD3.5)."""
    return mean_over_non_batch((velocity.float() - ref_velocity.detach().float()) ** 2)
