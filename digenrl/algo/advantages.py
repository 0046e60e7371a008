"""Group-relative advantages (GRPO) and the cross-rank reward gather they need.

A prompt's group of samples may be generated on several ranks, so rewards are gathered before they
are normalised (flow_grpo scripts/train_sd3.py gathers, then `PerPromptStatTracker.update`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from digenrl.config import ADV_STD_MODES

STD_MODES = ADV_STD_MODES  # algo.adv_std (digenrl/config.py)


@dataclass
class AdvantageResult:
    """Per-sample outputs, all [N].

    advantages: float32, clamped; exactly 0 for samples of a zero-variance group.
    zero_variance: True where the sample's group has identical rewards (no learning signal: such
        samples may be dropped, as flow_grpo does for all-zero advantages).
    group_mean, group_std: float32 statistics of the sample's own group (population std), reported in
        both std modes; in 'global' mode the divisor is the whole batch's std instead.
    """

    advantages: Tensor
    zero_variance: Tensor
    group_mean: Tensor
    group_std: Tensor


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    std_mode: str = "group",
    clamp: float = 5.0,
    eps: float = 1e-4,
) -> AdvantageResult:
    """A = clamp((r − mean_group) / (std + eps), −clamp, clamp) with population std (ddof 0).

    Source: flow_grpo/stat_tracking.py `PerPromptStatTracker.update` (np.std, + 1e-4; `global_std=True`
    divides by the std of all gathered rewards, which FlowGRPO's SD3/FLUX configs use) and the
    `adv_clip_max = 5` clamp in scripts/train_sd3.py. Groups are identified by `group_ids` (any int64
    labels, in any order, of any sizes); computed in float64. A zero-variance group gets exactly 0
    rather than a rounding residue from its mean.
    """
    if std_mode not in STD_MODES:
        raise ValueError(f"std_mode must be one of {STD_MODES}, got {std_mode!r}")
    if not (clamp > 0):
        raise ValueError(f"clamp must be > 0 (math.inf disables it), got {clamp!r}")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite float >= 0, got {eps!r}")
    if rewards.ndim != 1 or rewards.numel() == 0:
        raise ValueError(f"rewards must be a non-empty 1-D tensor [N], got shape {tuple(rewards.shape)}")
    if group_ids.shape != rewards.shape:
        raise ValueError(
            f"group_ids must have the rewards' shape {tuple(rewards.shape)}, got {tuple(group_ids.shape)}"
        )
    if group_ids.is_floating_point() or group_ids.is_complex() or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got dtype {group_ids.dtype}")
    r = rewards.detach().to(torch.float64)
    if not bool(torch.isfinite(r).all()):
        raise ValueError("rewards must be finite, got NaN or inf")

    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max()) + 1

    def per_group_sum(values: Tensor) -> Tensor:
        return torch.zeros(num_groups, dtype=torch.float64, device=r.device).index_add_(0, inverse, values)

    counts = per_group_sum(torch.ones_like(r))
    mean = (per_group_sum(r) / counts)[inverse]
    deviation = r - mean
    std = torch.sqrt(per_group_sum(deviation**2) / counts)[inverse]
    group_max = torch.full((num_groups,), -math.inf, dtype=torch.float64, device=r.device)
    group_min = torch.full((num_groups,), math.inf, dtype=torch.float64, device=r.device)
    group_max = group_max.scatter_reduce(0, inverse, r, reduce="amax")
    group_min = group_min.scatter_reduce(0, inverse, r, reduce="amin")
    zero_variance = (group_max == group_min)[inverse]

    scale = std if std_mode == "group" else r.std(unbiased=False).expand_as(r)
    advantages = torch.where(zero_variance, torch.zeros_like(r), deviation / (scale + eps))
    advantages = advantages.clamp(-clamp, clamp)
    return AdvantageResult(
        advantages=advantages.to(torch.float32),
        zero_variance=zero_variance,
        group_mean=mean.to(torch.float32),
        group_std=std.to(torch.float32),
    )


def gather_rewards(
    rewards: Tensor, group_ids: Tensor, group: dist.ProcessGroup | None = None
) -> tuple[Tensor, Tensor]:
    """Concatenate every rank's (rewards, group_ids) in rank order; identity without torch.distributed.

    Local sizes may differ: sizes are all-gathered first, then each rank's data, padded to the largest
    size, travels in one all_gather (rewards as float64 bit patterns next to the int64 ids, so both move
    in a single collective and come back bit-exact). Tensors must live on the backend's device (CUDA for
    NCCL, CPU for gloo). Must be called by every rank of `group` (default: the world).
    """
    if rewards.ndim != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must be 1-D tensors of equal length, got {tuple(rewards.shape)} "
            f"and {tuple(group_ids.shape)}"
        )
    if not (dist.is_available() and dist.is_initialized()):
        return rewards, group_ids
    world_size = dist.get_world_size(group)
    if world_size == 1:
        return rewards, group_ids

    device = rewards.device
    local_size = torch.tensor([rewards.numel()], dtype=torch.int64, device=device)
    sizes = [torch.empty_like(local_size) for _ in range(world_size)]
    dist.all_gather(sizes, local_size, group=group)
    counts = [int(s.item()) for s in sizes]
    max_count = max(counts)

    packed = torch.zeros(max_count, 2, dtype=torch.int64, device=device)
    packed[: rewards.numel(), 0] = rewards.detach().to(torch.float64).view(torch.int64)
    packed[: rewards.numel(), 1] = group_ids.to(device=device, dtype=torch.int64)
    gathered = [torch.empty_like(packed) for _ in range(world_size)]
    dist.all_gather(gathered, packed, group=group)
    rows = torch.cat([g[:n] for g, n in zip(gathered, counts, strict=True)])
    all_rewards = rows[:, 0].contiguous().view(torch.float64).to(rewards.dtype)
    all_group_ids = rows[:, 1].contiguous().to(group_ids.dtype)
    return all_rewards, all_group_ids
