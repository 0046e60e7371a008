"""One denoising transition x_σ → x_σ' of a flow-matching model, with the log-probability of the result.

Convention: x_σ = (1 − σ)·x0 + σ·ε, the model predicts the velocity v ≈ ε − x0, the sampler walks a
decreasing grid (see `digenrl.algo.sigmas`) and dt = σ' − σ < 0. A stochastic step is Gaussian,
x' ~ N(μ, s²·I), so every transition has a log-probability that the policy-gradient loss can
recompute under new weights.

Sources (formulas re-derived and checked against, not copied):
* FlowGRPO, Liu et al. 2025, arXiv 2505.05470 (eq. for the reverse SDE with σ_t = a·sqrt(t/(1 − t)))
  and its code flow_grpo/diffusers_patch/sd3_sde_with_logprob.py (`sde_step_with_logprob`,
  `sde_type` 'sde' and 'cps').
* DanceGRPO, Xue et al. 2025, fastvideo/train_grpo_flux.py (`flux_step` with `sde_solver=True`).

Everything is computed in float32 whatever the model dtype: flow_grpo casts to fp32 because the mean
overflows/loses precision in bf16, and the rollout and the training recomputation must agree to the
bit for the first PPO ratio to be exactly 1. For that, also store the sampled `prev_sample` in float32
(a bf16-rounded sample gives a different log-prob when recomputed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

SDE_TYPES = ("sde", "cps")

# float32 rounding of shift·1/(1 + (shift − 1)·1) leaves σ_0 at 1 ± 1 ulp for some shifts (diffusers' and
# DanceGRPO's grids alike, e.g. shift 1.7337); such a σ is treated as exactly 1.
SIGMA_ONE_ATOL = 1e-6

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclass
class StepResult:
    """Result of one transition; all tensors float32.

    prev_sample: x' [B, ...] (the given one when recomputing, the drawn one when sampling).
    log_prob: [B], log-density of x' averaged (mean, not sum) over all non-batch dims.
    mean: μ [B, ...]; carries the autograd graph to the velocity.
    std: the transition's Gaussian std s, shape [B, 1, ..., 1] (broadcastable to the sample).
    noise_scale: the reference's `std_dev_t`, shape [B, 1, ..., 1]: σ_t for 'sde' (std = σ_t·sqrt(−dt)),
        η for DanceGRPO (std = η·sqrt(−dt)), and equal to std for 'cps'. flow_grpo's KL penalty divides
        by noise_scale² (scripts/train_sd3.py), so pass this to `kl_to_reference` to match its β.
    """

    prev_sample: Tensor
    log_prob: Tensor
    mean: Tensor
    std: Tensor
    noise_scale: Tensor


def mean_over_non_batch(t: Tensor) -> Tensor:
    """[B, ...] → [B], the mean over every other dim (the log-densities' and losses' per-sample mean)."""
    # Tensor.mean(dim=()) would reduce over everything, so a 1-D [B] input needs its own branch.
    return t if t.ndim == 1 else t.mean(dim=tuple(range(1, t.ndim)))


def _as_fp32(name: str, t: Tensor) -> Tensor:
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    return t.to(torch.float32)


def _per_sample(name: str, value: float | Tensor, sample: Tensor) -> Tensor:
    """A python float / 0-d tensor / [B] tensor as float32 of shape [B, 1, ..., 1] on sample's device."""
    t = torch.as_tensor(value, dtype=torch.float32, device=sample.device)
    batch = sample.shape[0]
    if t.ndim == 0:
        t = t.expand(batch)
    elif tuple(t.shape) != (batch,):
        raise ValueError(f"{name} must be a float or a tensor of shape [{batch}], got shape {tuple(t.shape)}")
    return t.reshape(batch, *([1] * (sample.ndim - 1)))


def check_sigma_pairs(sigma: Tensor, sigma_next: Tensor) -> None:
    """Raise unless 0 <= σ' < σ <= 1 (+ rounding) for every transition (elementwise, any equal shapes): what
    every step's formulas assume. It reads the values, a host sync for device tensors, so a caller that runs
    many steps (the rollout engine, the trainer) checks its grid or batch once and passes
    ``sigmas_checked=True`` to each step."""
    if not bool(
        ((sigma > 0) & (sigma <= 1 + SIGMA_ONE_ATOL) & (sigma_next >= 0) & (sigma_next < sigma)).all()
    ):
        raise ValueError(
            f"sigma/sigma_next must satisfy 0 <= sigma_next < sigma <= 1 (+{SIGMA_ONE_ATOL} rounding), "
            f"got sigma={sigma.flatten().tolist()} sigma_next={sigma_next.flatten().tolist()}"
        )


def _prepare(
    velocity: Tensor,
    sample: Tensor,
    sigma: float | Tensor,
    sigma_next: float | Tensor,
    sigmas_checked: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    v = _as_fp32("velocity", velocity)
    x = _as_fp32("sample", sample)
    if v.shape != x.shape or x.ndim < 1:
        raise ValueError(
            "velocity and sample must have the same shape [B, ...], got "
            f"{tuple(v.shape)} and {tuple(x.shape)}"
        )
    s = _per_sample("sigma", sigma, x)
    s_next = _per_sample("sigma_next", sigma_next, x)
    if not sigmas_checked:
        check_sigma_pairs(s, s_next)
    return v, x, s, s_next


def _check_noise_level(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite float >= 0, got {value!r}")


def _resolve_sampling(
    noise: Tensor | None, prev_sample: Tensor | None, x: Tensor, *, deterministic: bool
) -> tuple[Tensor | None, Tensor | None]:
    """Exactly one of noise (draw x') / prev_sample (score a given x'); noise is optional if deterministic."""
    if noise is not None and prev_sample is not None:
        raise ValueError("pass either noise (to sample) or prev_sample (to score a given sample), not both")
    if noise is None and prev_sample is None and not deterministic:
        raise ValueError("a stochastic step needs noise (to sample) or prev_sample (to score a given sample)")
    if noise is not None:
        noise = _as_fp32("noise", noise)
        if noise.shape != x.shape:
            raise ValueError(f"noise must have the sample's shape {tuple(x.shape)}, got {tuple(noise.shape)}")
    if prev_sample is not None:
        prev_sample = _as_fp32("prev_sample", prev_sample)
        if prev_sample.shape != x.shape:
            raise ValueError(
                f"prev_sample must have the sample's shape {tuple(x.shape)}, got {tuple(prev_sample.shape)}"
            )
    return noise, prev_sample


def _deterministic_result(
    x: Tensor, v: Tensor, s: Tensor, s_next: Tensor, prev_sample: Tensor | None
) -> StepResult:
    """Zero noise: the step is the Euler ODE step exactly; a point mass has no density, so log_prob = 0."""
    mean = x + (s_next - s) * v
    zeros = torch.zeros_like(s)
    return StepResult(
        prev_sample=mean if prev_sample is None else prev_sample,
        log_prob=torch.zeros(x.shape[0], dtype=torch.float32, device=x.device),
        mean=mean,
        std=zeros,
        noise_scale=zeros,
    )


def _gaussian_result(
    mean: Tensor, std: Tensor, noise_scale: Tensor, noise: Tensor | None, prev_sample: Tensor | None
) -> StepResult:
    if prev_sample is None:
        assert noise is not None  # guaranteed by _resolve_sampling for a stochastic step
        prev_sample = mean + std * noise
    # Gradient flows through the mean only: x' is data (flow_grpo detaches prev_sample the same way).
    log_density = -((prev_sample.detach() - mean) ** 2) / (2 * std**2) - torch.log(std) - _LOG_SQRT_2PI
    return StepResult(prev_sample, mean_over_non_batch(log_density), mean, std, noise_scale)


def _drift_mean(x: Tensor, v: Tensor, s: Tensor, dt: Tensor, noise_scale: Tensor) -> Tensor:
    """μ = x + dt·[v + g²/(2σ)·(x + (1 − σ)·v)]: Euler drift plus the score correction of the reverse SDE.

    With the flow-matching score ∇log p(x) = −(x + (1 − σ)·v)/σ, this is FlowGRPO's eq. (reverse SDE with
    diffusion g) and DanceGRPO's `flux_step` (g = η) written in one form.
    """
    return x + dt * (v + noise_scale**2 / (2 * s) * (x + (1 - s) * v))


def flow_sde_step(
    velocity: Tensor,
    sample: Tensor,
    sigma: float | Tensor,
    sigma_next: float | Tensor,
    *,
    noise_level: float,
    sde_type: str = "sde",
    noise: Tensor | None = None,
    prev_sample: Tensor | None = None,
    sigma_max: float | None = None,
    sigmas_checked: bool = False,
) -> StepResult:
    """FlowGRPO's stochastic step x_σ → x_σ' with its log-probability (flow_grpo `sde_step_with_logprob`).

    Args:
        velocity, sample: [B, ...] any rank and dtype (computed in float32).
        sigma, sigma_next: current/next grid value, a float or a per-sample tensor [B]; 0 <= σ' < σ <= 1.
        noise_level: a (0.7 SD3, 0.9 FLUX, 1.2 Qwen-Image in FlowGRPO's configs). 0 gives the Euler ODE
            step exactly (noise may then be omitted), std = 0 and log_prob = 0 (no density exists).
        sde_type: 'sde' (FlowGRPO) or 'cps' (coefficients-preserving sampling, FlowGRPO's `sde_type='cps'`).
        noise: ε ~ N(0, I) of the sample's shape; sample x' = μ + std·ε.
        prev_sample: instead of sampling, score this given x' (training recomputation).
        sigma_max: the grid's σ_1. Only used by 'sde' where σ = 1: σ/(1 − σ) is infinite there, and flow_grpo
            replaces the denominator by 1 − σ_1 (`torch.where(sigma == 1, sigma_max, sigma)` with
            `sigma_max = self.sigmas[1]`). Required if any σ == 1 and noise_level > 0. Unlike the
            reference's exact `== 1`, σ within SIGMA_ONE_ATOL of 1 counts as 1: a float32 σ_0 of 1 − 1 ulp
            would otherwise give σ_t ≈ 4000·a, and 1 + 1 ulp a NaN.
        sigmas_checked: the caller ran :func:`check_sigma_pairs` on these values already (once for a grid
            or a batch), so the step skips its own check, a host read of the sigmas every step.

    'sde': σ_t = a·sqrt(σ/(1 − σ)), μ = x + dt·[v + σ_t²/(2σ)·(x + (1 − σ)v)], std = σ_t·sqrt(−dt),
    log_prob = mean over non-batch dims of log N(x'; μ, std²) (full density, constants included; the
    mean rather than the sum keeps it O(1), which is why clip ranges of 1e-4 work).
    'cps': σ_t = σ'·sin(a·π/2), x̂0 = x − σv, x̂1 = x + (1 − σ)v, μ = (1 − σ')·x̂0 + sqrt(σ'² − σ_t²)·x̂1
    (evaluated as σ'·cos(aπ/2), which the reference's sqrt form loses to cancellation near a = 1; a ≤ 1),
    std = σ_t, and, as in the reference, the simplified log_prob = −mean((x' − μ)²): constants and the
    1/(2σ_t²) factor are dropped. It is not a normalised density, so exp(logp_θ − logp_old) is a
    surrogate ratio rather than a likelihood ratio; FlowGRPO trains on it as is (same at ratio = 1).
    """
    if sde_type not in SDE_TYPES:
        raise ValueError(f"sde_type must be one of {SDE_TYPES}, got {sde_type!r}")
    _check_noise_level("noise_level", noise_level)
    if sde_type == "cps" and noise_level > 1:
        raise ValueError(f"noise_level for sde_type 'cps' must be in [0, 1], got {noise_level!r}")
    v, x, s, s_next = _prepare(velocity, sample, sigma, sigma_next, sigmas_checked)
    noise, prev_sample = _resolve_sampling(noise, prev_sample, x, deterministic=noise_level == 0)
    if noise_level == 0:
        return _deterministic_result(x, v, s, s_next, prev_sample)

    dt = s_next - s
    if sde_type == "sde":
        at_one = s >= 1 - SIGMA_ONE_ATOL
        if sigma_max is None:
            if bool(at_one.any()):
                raise ValueError(
                    "sigma == 1 makes sigma/(1 - sigma) infinite: pass sigma_max (the grid's sigma_1), "
                    "as flow_grpo substitutes 1 - sigma_1 for the denominator there"
                )
            denominator = 1 - s
        else:
            if not 0 < sigma_max < 1:
                raise ValueError(f"sigma_max (the grid's sigma_1) must be in (0, 1), got {sigma_max!r}")
            denominator = 1 - torch.where(at_one, torch.full_like(s, sigma_max), s)
        noise_scale = noise_level * torch.sqrt(s / denominator)
        mean = _drift_mean(x, v, s, dt, noise_scale)
        return _gaussian_result(mean, noise_scale * torch.sqrt(-dt), noise_scale, noise, prev_sample)

    # 'cps'
    noise_scale = s_next * math.sin(noise_level * math.pi / 2)
    x0_hat = x - s * v
    x1_hat = x + (1 - s) * v
    # sqrt(σ'² − σ_t²) written as σ'·cos(aπ/2): equal for a in [0, 1], without float32 cancellation as a → 1.
    mean = x0_hat * (1 - s_next) + x1_hat * (s_next * math.cos(noise_level * math.pi / 2))
    if prev_sample is None:
        assert noise is not None
        prev_sample = mean + noise_scale * noise
    log_prob = mean_over_non_batch(-((prev_sample.detach() - mean) ** 2))
    return StepResult(prev_sample, log_prob, mean, noise_scale, noise_scale)


def dance_step(
    velocity: Tensor,
    sample: Tensor,
    sigma: float | Tensor,
    sigma_next: float | Tensor,
    *,
    eta: float,
    noise: Tensor | None = None,
    prev_sample: Tensor | None = None,
    sigmas_checked: bool = False,
) -> StepResult:
    """DanceGRPO's stochastic step: FlowGRPO's drift with a constant η (0.3 image, 0.25 HunyuanVideo).

    μ = x + dt·[v + η²/(2σ)·(x + (1 − σ)v)], std = η·sqrt(σ − σ') (DanceGRPO `flux_step`, where the same
    drift is written as Euler plus −½η²·score·dσ with score = −(x − x̂0(1 − σ))/σ²).

    log_prob: the mean over non-batch dims of the full Gaussian log-density, as in `flow_sde_step`.
    DanceGRPO also averages over dims (not sums), but its `- log(std) - log(sqrt(2π))` sits on a separate
    statement and is discarded, so its value is only −(x' − μ)²/(2·std²). The dropped terms do not depend
    on the weights, so log-ratios, PPO ratios and gradients are identical; only the logged value differs.
    eta = 0 gives the Euler step exactly, with log_prob = 0. ``sigmas_checked``: as in `flow_sde_step`.
    """
    _check_noise_level("eta", eta)
    v, x, s, s_next = _prepare(velocity, sample, sigma, sigma_next, sigmas_checked)
    noise, prev_sample = _resolve_sampling(noise, prev_sample, x, deterministic=eta == 0)
    if eta == 0:
        return _deterministic_result(x, v, s, s_next, prev_sample)
    dt = s_next - s
    noise_scale = torch.full_like(s, eta)
    mean = _drift_mean(x, v, s, dt, noise_scale)
    return _gaussian_result(mean, noise_scale * torch.sqrt(-dt), noise_scale, noise, prev_sample)


def euler_step(velocity: Tensor, sample: Tensor, sigma: float | Tensor, sigma_next: float | Tensor) -> Tensor:
    """Deterministic flow ODE step x + (σ' − σ)·v in float32 (evaluation sampler).

    Same arithmetic as diffusers' `FlowMatchEulerDiscreteScheduler.step` (`sample + dt * model_output`
    after upcasting the sample to float32); here the velocity is upcast too.
    """
    v, x, s, s_next = _prepare(velocity, sample, sigma, sigma_next)
    return x + (s_next - s) * v


def dpm_solver_2m_step(
    velocity: Tensor,
    sample: Tensor,
    sigma: float,
    sigma_next: float,
    *,
    prev_x0: Tensor | None = None,
    prev_sigma: float | None = None,
) -> tuple[Tensor, Tensor]:
    """One DPM-Solver++(2M) ODE step (midpoint form) of a flow model, in float32; returns (x', x̂0).

    MixGRPO-Flash's solver after the SDE window (Li et al. 2025, arXiv 2507.21802, Sec. "MixGRPO-Flash";
    Tencent-Hunyuan/MixGRPO `fastvideo/utils/sampling_utils.py`, `dpm_step` with `dpm_algorithm_type=
    "dpmsolver++"`, `dpm_solver_order=2`, `dpm_solver_type="midpoint"`), written for flow matching:
    α = 1 − σ, x̂0 = x − σ·v, λ = log(α/σ), h = λ' − λ (DPM-Solver++, Lu et al. 2022, arXiv 2211.01095,
    eq. for the 2M update; diffusers' `DPMSolverMultistepScheduler.multistep_dpm_solver_second_order_update`).
    The first-order part (σ'/σ)·x + (α' − σ'·α/σ)·x̂0 equals the Euler step x + (σ' − σ)·v exactly; the
    second order adds ½·(α' − σ'·α/σ)·D1 with D1 = (x̂0 − x̂0_prev)/r, r = h_prev / h, from the previous
    step's prediction ``prev_x0`` at ``prev_sigma``. Without a previous prediction, from σ = 1 (λ = −∞) or
    into σ' = 0 (the final step, first order as diffusers' `lower_order_final`) the step is Euler's.
    The sigmas are python floats (one step of the whole batch): the order decision and λ need no device
    read.
    """
    sigma, sigma_next = float(sigma), float(sigma_next)
    v, x, _, _ = _prepare(velocity, sample, sigma, sigma_next)
    x0 = x - sigma * v
    out = x + (sigma_next - sigma) * v
    second_order = (
        prev_x0 is not None
        and prev_sigma is not None
        and sigma_next > 0
        and prev_sigma < 1 - SIGMA_ONE_ATOL
        and sigma < prev_sigma
    )
    if second_order:

        def lam(value: float) -> float:
            return math.log((1 - value) / value)

        h = lam(sigma_next) - lam(sigma)
        r = (lam(sigma) - lam(float(prev_sigma))) / h
        d1 = (x0 - prev_x0.float()) / r
        out = out + 0.5 * ((1 - sigma_next) - sigma_next * (1 - sigma) / sigma) * d1
    return out, x0
