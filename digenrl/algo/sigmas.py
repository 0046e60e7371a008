"""Noise-level (sigma) grids for flow-matching samplers.

Flow-matching convention used throughout `digenrl.algo`: x_σ = (1 − σ)·x0 + σ·ε, and a sampler walks a
decreasing grid σ_0 = 1 > σ_1 > … > σ_N = 0 (N steps, N + 1 values). Three grids exist in the
public references and they are *not* the same, so each has its own function:

* `flow_sigmas`: exactly what diffusers' `FlowMatchEulerDiscreteScheduler(shift=s).set_timesteps(N)`
  produces, which is what FlowGRPO's SD3 pipeline samples on (flow_grpo/diffusers_patch/
  sd3_pipeline_with_logprob.py calls the stock scheduler). It is **not** shift(linspace(1, 0, N + 1)):
  diffusers spaces N values linearly between σ_max = 1 and the training grid's smallest sigma
  σ_min = shift(1 / num_train_timesteps), shifts them (so σ_min is shifted twice), then appends 0.
  Consequently σ_{N−1} is tiny (≈ 0.0089 for shift 3, N = 10) and the last step is nearly
  deterministic — the reason FlowGRPO trains with timestep_fraction 0.99 (drop the last step).
* `dance_sigmas`: DanceGRPO's grid, shift(linspace(1, 0, N + 1)) (fastvideo/train_grpo_flux.py,
  `sd3_time_shift`), whose last step runs from shift(1/N) to 0.
* `dynamic_shift_sigmas`: FLUX's resolution-dependent exponential shift of linspace(1, 1/N, N) with
  a terminal 0 (diffusers FluxPipeline `calculate_shift` + scheduler `time_shift`, exponential type).

The grids reproduce their sources bit for bit, float32 rounding included: for some non-integer shifts
(about 6% of shifts drawn from [0.5, 6] for `flow_sigmas`, e.g. 1.7337) σ_0 comes out as 1 ± 1 ulp rather
than 1, in diffusers too. Shift 1, 3 and the FLUX dynamic shift give exactly 1; the SDE steps in
`digenrl.algo.sde_step` treat any σ within 1e-6 of 1 as 1.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor


def _check_num_steps(num_steps: int) -> None:
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be an int >= 1, got {num_steps!r}")


def _check_shift(shift: float) -> None:
    if not (math.isfinite(shift) and shift > 0):
        raise ValueError(f"shift must be a finite float > 0, got {shift!r}")


def shift_sigmas(sigmas: Tensor, shift: float) -> Tensor:
    """Static SD3 timestep shift σ' = s·σ / (1 + (s − 1)·σ), computed in the tensor's dtype.

    Source: SD3 paper (Esser et al. 2024, eq. 23) as implemented in diffusers'
    `FlowMatchEulerDiscreteScheduler` (`shift * sigmas / (1 + (shift - 1) * sigmas)`). Maps 0 → 0 and
    1 → 1 and, for s > 1, spends more steps at high noise.
    """
    _check_shift(shift)
    return shift * sigmas / (1 + (shift - 1) * sigmas)


def flow_sigmas(num_steps: int, shift: float = 1.0, *, num_train_timesteps: int = 1000) -> Tensor:
    """The float32 grid [σ_0 = 1, …, σ_{N−1}, 0] (length N + 1) of diffusers' flow-match Euler scheduler.

    Reproduces bit for bit `FlowMatchEulerDiscreteScheduler(shift=shift,
    num_train_timesteps=num_train_timesteps).set_timesteps(num_steps).sigmas` (diffusers 0.3x–0.42,
    scheduling_flow_match_euler_discrete.py): the constructor builds the training grid t/T_train,
    t = T_train … 1, shifted in float32, whose ends give σ_max (= 1) and σ_min = shift(1/T_train);
    `set_timesteps` then takes numpy float64 linspace(σ_max, σ_min, N), shifts it again, casts to
    float32 and appends a terminal 0. See the module docstring for how it differs from
    shift(linspace(1, 0, N + 1)) (use `dance_sigmas` for that grid).
    """
    _check_num_steps(num_steps)
    _check_shift(shift)
    if (
        isinstance(num_train_timesteps, bool)
        or not isinstance(num_train_timesteps, int)
        or num_train_timesteps < 1
    ):
        raise ValueError(f"num_train_timesteps must be an int >= 1, got {num_train_timesteps!r}")
    # Ends of the training grid, computed with the same float32 torch ops as the scheduler's __init__.
    train_ends = torch.tensor([float(num_train_timesteps), 1.0], dtype=torch.float32) / num_train_timesteps
    train_ends = shift * train_ends / (1 + (shift - 1) * train_ends)
    sigma_max, sigma_min = train_ends[0].item(), train_ends[1].item()
    # set_timesteps: float64 numpy linspace over timesteps, back to sigmas, static shift, float32.
    t = np.linspace(sigma_max * num_train_timesteps, sigma_min * num_train_timesteps, num_steps)
    grid = t / num_train_timesteps
    grid = shift * grid / (1 + (shift - 1) * grid)
    sigmas = torch.from_numpy(grid).to(torch.float32)
    return torch.cat([sigmas, torch.zeros(1, dtype=torch.float32)])


def dance_sigmas(num_steps: int, shift: float) -> Tensor:
    """DanceGRPO's float32 grid σ = s·t / (1 + (s − 1)·t), t = linspace(1, 0, N + 1) (length N + 1).

    Source: DanceGRPO fastvideo/train_grpo_flux.py (`sigma_schedule = sd3_time_shift(shift,
    torch.linspace(1, 0, sampling_steps + 1))`).
    """
    _check_num_steps(num_steps)
    return shift_sigmas(torch.linspace(1, 0, num_steps + 1, dtype=torch.float32), shift)


def flux_time_shift_mu(
    image_seq_len: int,
    base_seq_len: int = 256,
    max_seq_len: int = 4096,
    base_shift: float = 0.5,
    max_shift: float = 1.15,
) -> float:
    """FLUX's resolution-dependent shift parameter μ, linear in the packed image token count.

    Source: diffusers pipelines/flux/pipeline_flux.py `calculate_shift` (defaults = FLUX.1 scheduler
    config). For FLUX the image sequence length is (H/16)·(W/16) (8× VAE, 2×2 packing), e.g. 1024 at 512².
    """
    if image_seq_len < 1:
        raise ValueError(f"image_seq_len must be >= 1, got {image_seq_len!r}")
    if max_seq_len == base_seq_len:
        raise ValueError(f"max_seq_len must differ from base_seq_len, both are {base_seq_len!r}")
    slope = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    intercept = base_shift - slope * base_seq_len
    return image_seq_len * slope + intercept


def dynamic_shift_sigmas(num_steps: int, mu: float) -> Tensor:
    """FLUX grid: exponential time shift e^μ / (e^μ + (1/t − 1)) of t = linspace(1, 1/N, N), plus a 0.

    Reproduces bit for bit diffusers' FluxPipeline (`sigmas = np.linspace(1.0, 1 / num_inference_steps,
    num_inference_steps)`) followed by `FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    .set_timesteps(sigmas=sigmas, mu=mu)` (cast to float32, `_time_shift_exponential` with exponent 1,
    terminal 0 appended). Returns float32, length N + 1.
    """
    _check_num_steps(num_steps)
    if not math.isfinite(mu):
        raise ValueError(f"mu must be finite, got {mu!r}")
    t = np.linspace(1.0, 1 / num_steps, num_steps).astype(np.float32)
    exp_mu = math.exp(mu)
    grid = exp_mu / (exp_mu + (1 / t - 1) ** 1.0)
    sigmas = torch.from_numpy(np.asarray(grid, dtype=np.float32))
    return torch.cat([sigmas, torch.zeros(1, dtype=torch.float32)])


def stretch_to_terminal(sigmas: Tensor, shift_terminal: float) -> Tensor:
    """Rescale a grid [σ_0, …, σ_{N−1}, 0] so that its last non-zero sigma equals ``shift_terminal``.

    Source: diffusers scheduling_flow_match_euler_discrete.py `stretch_shift_to_terminal`
    (1 − z, scaled so that its last entry is 1 − shift_terminal), used by Qwen-Image's scheduler
    config (`shift_terminal = 0.02`). The terminal 0 is kept.
    """
    if not 0.0 <= shift_terminal < 1.0:
        raise ValueError(f"shift_terminal must be in [0, 1), got {shift_terminal!r}")
    body = sigmas[:-1].to(torch.float32)
    one_minus = 1.0 - body
    stretched = 1.0 - one_minus / (one_minus[-1] / (1.0 - shift_terminal))
    return torch.cat([stretched, sigmas[-1:].to(torch.float32)])
