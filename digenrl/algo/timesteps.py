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

MixGRPO (`algo.name=mixgrpo`; Li et al. 2025, "MixGRPO: Unlocking Flow-based GRPO Efficiency with Mixed
ODE-SDE", arXiv 2507.21802; code Tencent-Hunyuan/MixGRPO, `fastvideo/train_grpo_flux.py` with its
`GRPOTrainingStates`, script `scripts/finetune/finetune_flux_grpo_MixGRPO.sh`): a window of w consecutive
steps is the only stochastic and the only trained part, ODE elsewhere, and the window moves over the
iterations (:func:`mix_window_steps`). The published script samples 25 steps with w = 4
(`group_size=4`), moves the window by s = 1 step (`prog_overlap_step=1`) every τ = 25 iterations
(`iters_per_group=25`, `sample_strategy="progressive"`) and starts over at step 0 after the last position
(`--roll_back`). Here the window always holds w steps (the published state clips the window at index
`sampling_steps − 2`, so its last positions train fewer); every position [start, start + w) lies inside
the T steps, so w = T makes every step stochastic and trained: FlowGRPO with `timestep_fraction = 1`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from digenrl.config import MIX_SCHEDULES, TIMESTEP_SELECTIONS, AlgoConfig

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


#: modes whose trained steps are the only stochastic ones: FlowGRPO-Fast's window and MixGRPO's
WINDOWED_MODES = ("fast-window", "mixgrpo")


@dataclass(frozen=True)
class MixWindow:
    """MixGRPO's sliding SDE window (module docstring): ``size`` steps, moved by ``stride`` steps every
    ``shift_interval`` iterations ('progressive') or placed uniformly at random each iteration ('random',
    the published `sample_strategy="random"`)."""

    size: int
    stride: int = 1
    shift_interval: int = 25
    schedule: str = "progressive"

    @classmethod
    def from_config(cls, algo: AlgoConfig) -> MixWindow:
        return cls(algo.mix_window, algo.mix_stride, algo.mix_shift_interval, algo.mix_schedule)

    def start(self, num_steps: int, iteration: int, generator: torch.Generator | None = None) -> int:
        """The first step of the window in ``iteration`` (0-based) of a ``num_steps``-step rollout.

        'progressive': the k = iteration // shift_interval-th position of a sweep 0, s, 2s, … over the
        P = num_steps − size + 1 possible starts, starting over at 0 after the last one that fits (the
        published `--roll_back`): start = (k mod (⌊(P − 1) / s⌋ + 1))·s. 'random': uniform over the P starts,
        drawn from ``generator`` (seeded by the iteration, so every rank agrees).
        """
        _check_num_steps(num_steps)
        if not 1 <= self.size <= num_steps:
            raise ValueError(f"window size must be in [1, num_steps = {num_steps}], got {self.size}")
        if self.stride < 1 or self.shift_interval < 1:
            raise ValueError(
                f"stride and shift_interval must be >= 1, got {self.stride}, {self.shift_interval}"
            )
        if iteration < 0:
            raise ValueError(f"iteration must be >= 0, got {iteration}")
        positions = num_steps - self.size + 1
        if self.schedule == "progressive":
            sweep = (positions - 1) // self.stride + 1
            return (iteration // self.shift_interval) % sweep * self.stride
        if self.schedule == "random":
            if generator is None:
                raise ValueError("schedule 'random' draws the window: pass a torch.Generator")
            return int(torch.randint(0, positions, (1,), generator=generator).item())
        raise ValueError(f"schedule must be one of {MIX_SCHEDULES}, got {self.schedule!r}")

    def steps(self, num_steps: int, iteration: int, generator: torch.Generator | None = None) -> Tensor:
        """Sorted int64 indices of the window's steps in ``iteration``: the stochastic and trained ones."""
        start = self.start(num_steps, iteration, generator)
        return torch.arange(start, start + self.size, dtype=torch.int64)


def sde_step_mask(num_steps: int, train_steps: Tensor, *, mode: str) -> Tensor:
    """Bool [num_steps]: True where the sampler takes the stochastic (SDE) step.

    'fast-window' / 'mixgrpo': True only at `train_steps` (ODE elsewhere: FlowGRPO-Fast, MixGRPO);
    'first'/'shuffled': every step is stochastic (FlowGRPO / DanceGRPO sample the whole trajectory with the
    SDE); 'diffusionnft': none (DiffusionNFT trains on the forward process, so its rollout is the ODE).
    """
    if mode not in ("mixgrpo", "diffusionnft"):
        _check_mode(mode)
    _check_num_steps(num_steps)
    steps = torch.as_tensor(train_steps)
    if steps.ndim != 1 or steps.is_floating_point() or steps.dtype == torch.bool:
        raise ValueError(
            f"train_steps must be a 1-D integer tensor, got shape {tuple(steps.shape)} {steps.dtype}"
        )
    if steps.numel() and not bool(((steps >= 0) & (steps < num_steps)).all()):
        raise ValueError(f"train_steps must lie in [0, {num_steps}), got {steps.tolist()}")
    if mode == "diffusionnft":
        return torch.zeros(num_steps, dtype=torch.bool)
    if mode not in WINDOWED_MODES:
        return torch.ones(num_steps, dtype=torch.bool)
    mask = torch.zeros(num_steps, dtype=torch.bool)
    mask[steps.to(device="cpu", dtype=torch.int64)] = True
    return mask
