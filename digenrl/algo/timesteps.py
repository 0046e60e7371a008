"""Which denoising steps of a trajectory are trained, and which steps the sampler makes stochastic.

Modes (indices i refer to the transition σ_i → σ_{i+1}, 0 <= i < num_steps):
* 'first' (FlowGRPO, scripts/train_sd3.py): steps 0 … K−1 with K = int(N·timestep_fraction) (floor,
  at least 1); 0.99 drops only the last, near-deterministic step.
* 'shuffled' (DanceGRPO, fastvideo/train_grpo_flux.py): a random permutation of the N steps, of which the
  first int(N·timestep_fraction) are trained (floor, at least 1); DanceGRPO draws one permutation per
  sample, so call once per sample. Returned sorted: the order of gradient accumulation does not change
  the update.
* 'fast-window' (FlowGRPO-Fast, flow_grpo sd3_pipeline_with_logprob_fast.py + config
  `sde_window_range = (0, num_steps // 2)`): start = uniform integer in [0, N//2 − window], the window
  [start, start + window) is the only stochastic and the only trained part; all other steps are ODE.
  `timestep_fraction` is validated but unused in this mode.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from digenrl.config import TIMESTEP_SELECTIONS

TRAIN_STEP_MODES = TIMESTEP_SELECTIONS  # algo.timestep_selection (digenrl/config.py)


def _check_mode(mode: str) -> None:
    if mode not in TRAIN_STEP_MODES:
        raise ValueError(f"mode must be one of {TRAIN_STEP_MODES}, got {mode!r}")


def _check_num_steps(num_steps: int) -> None:
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be an int >= 1, got {num_steps!r}")


def select_train_steps(
    num_steps: int,
    fraction: float,
    mode: str,
    generator: torch.Generator | None = None,
    window: int = 2,
) -> Tensor:
    """Sorted int64 indices of the trained steps (see the module docstring for each mode).

    'first' is deterministic; 'shuffled' and 'fast-window' draw from `generator` (a CPU
    torch.Generator), so every rank that seeds it identically picks the same steps.
    """
    _check_mode(mode)
    _check_num_steps(num_steps)
    if not (isinstance(fraction, int | float) and math.isfinite(fraction) and 0 < fraction <= 1):
        raise ValueError(f"timestep_fraction must be in (0, 1], got {fraction!r}")
    count = max(1, int(num_steps * fraction))  # int() = floor for positives, as flow_grpo/DanceGRPO
    if mode == "first":
        return torch.arange(count, dtype=torch.int64)
    if generator is None:
        raise ValueError(f"mode {mode!r} is random: pass a torch.Generator as generator")
    if mode == "shuffled":
        return torch.randperm(num_steps, generator=generator)[:count].sort().values
    half = num_steps // 2
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= half:
        raise ValueError(
            f"window must be an int in [1, num_steps // 2 = {half}] for mode 'fast-window', got {window!r}"
        )
    start = int(torch.randint(0, half - window + 1, (1,), generator=generator).item())
    return torch.arange(start, start + window, dtype=torch.int64)


def sde_step_mask(num_steps: int, train_steps: Tensor, *, mode: str) -> Tensor:
    """Bool [num_steps]: True where the sampler takes the stochastic (SDE) step.

    'fast-window': True only at `train_steps` (ODE elsewhere, FlowGRPO-Fast); 'first'/'shuffled': every
    step is stochastic (FlowGRPO / DanceGRPO sample the whole trajectory with the SDE).
    """
    _check_mode(mode)
    _check_num_steps(num_steps)
    steps = torch.as_tensor(train_steps)
    if steps.ndim != 1 or steps.is_floating_point() or steps.dtype == torch.bool:
        raise ValueError(
            f"train_steps must be a 1-D integer tensor, got shape {tuple(steps.shape)} {steps.dtype}"
        )
    if steps.numel() and not bool(((steps >= 0) & (steps < num_steps)).all()):
        raise ValueError(f"train_steps must lie in [0, {num_steps}), got {steps.tolist()}")
    if mode != "fast-window":
        return torch.ones(num_steps, dtype=torch.bool)
    mask = torch.zeros(num_steps, dtype=torch.bool)
    mask[steps.to(device="cpu", dtype=torch.int64)] = True
    return mask
