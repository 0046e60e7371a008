"""Classifier-free guidance on velocities, with one fixed batch order for the doubled forward.

Order convention [unconditional; conditional] along dim 0, as diffusers' SD3/FLUX pipelines and
flow_grpo (scripts/train_sd3.py `compute_log_prob`: `noise_pred.chunk(2)` → uncond, text) use it.
Rollout and training must apply the same guidance the same way, or the first PPO ratio is not 1.
"""

from __future__ import annotations

from torch import Tensor, cat


def apply_cfg(v_cond: Tensor, v_uncond: Tensor, scale: float) -> Tensor:
    """Guided velocity v_u + w·(v_c − v_u) (Ho & Salimans 2022), in the inputs' dtype like diffusers."""
    if v_cond.shape != v_uncond.shape:
        raise ValueError(
            "v_cond and v_uncond must have the same shape, got "
            f"{tuple(v_cond.shape)} and {tuple(v_uncond.shape)}"
        )
    return v_uncond + scale * (v_cond - v_uncond)


def double_for_cfg(x: Tensor) -> Tensor:
    """[x; x] along dim 0, so one forward computes the unconditional and the conditional branch."""
    return cat([x, x], dim=0)


def split_cfg_output(v: Tensor) -> tuple[Tensor, Tensor]:
    """(v_uncond, v_cond) from a doubled forward's output laid out [uncond; cond]."""
    if v.shape[0] % 2:
        raise ValueError(f"a doubled CFG batch must have an even size, got {v.shape[0]}")
    v_uncond, v_cond = v.chunk(2, dim=0)
    return v_uncond, v_cond
