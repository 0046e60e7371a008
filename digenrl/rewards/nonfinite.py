"""What to do when a reward comes back NaN or ±inf (``reward.nonfinite_policy``).

A single non-finite reward poisons the group mean/std used for GRPO advantages
(A = (r − mean_group) / (std + 1e-4), flow_grpo stat_tracking.py) and hence the whole group's gradient,
so it must never reach the advantage computation silently. Two policies:

* ``"abort"``: raise :class:`NonFiniteRewardError` naming every offending sample (index, prompt, value).
* ``"drop-group"``: keep training but drop every sample of each affected prompt group (a partial group
  would have a biased baseline). The offending rewards are replaced by 0.0 in the returned tensor so that
  masked sums stay finite (NaN · 0 is NaN); callers must apply ``keep_mask``.

Either way each offending sample is logged (``logging`` warning/error with index, prompt and value).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from digenrl.config import NONFINITE_POLICIES
from digenrl.rewards.base import NonFiniteRewardError

logger = logging.getLogger(__name__)

NonFinitePolicy = Literal["drop-group", "abort"]


def _group_tensor(group_ids: Tensor | Sequence[int], size: int, device: torch.device) -> Tensor:
    groups = torch.as_tensor(group_ids, device=device)
    if groups.shape != (size,) or groups.is_floating_point() or groups.is_complex():
        raise ValueError(
            f"group_ids must be {size} integer ids (one per reward), got shape {tuple(groups.shape)} "
            f"and dtype {groups.dtype}"
        )
    return groups


def describe_nonfinite(rewards: Tensor, prompts: Sequence[str]) -> list[str]:
    """One line per non-finite reward: ``sample <i> (prompt <p!r>): reward=<v>``."""
    bad = torch.nonzero(~torch.isfinite(rewards)).flatten().tolist()
    return [f"sample {i} (prompt {prompts[i]!r}): reward={rewards[i].item()}" for i in bad]


def check_finite_rewards(
    rewards: Tensor,
    prompts: Sequence[str],
    group_ids: Tensor | Sequence[int],
    policy: NonFinitePolicy,
) -> tuple[Tensor, Tensor]:
    """Apply ``policy`` to non-finite entries of ``rewards`` ``[B]``.

    Returns ``(rewards, keep_mask)``: ``keep_mask`` is a bool ``[B]`` tensor (all True when every reward is
    finite). Under ``"drop-group"`` all samples sharing a ``group_ids`` value with a non-finite reward are
    False and the non-finite entries are set to 0.0. Under ``"abort"`` a non-finite reward raises
    :class:`NonFiniteRewardError`.
    """
    if policy not in NONFINITE_POLICIES:
        raise ValueError(f"reward.nonfinite_policy must be one of {list(NONFINITE_POLICIES)}, got {policy!r}")
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if len(prompts) != rewards.shape[0]:
        raise ValueError(f"prompts has length {len(prompts)} but rewards has {rewards.shape[0]} entries")
    groups = _group_tensor(group_ids, rewards.shape[0], rewards.device)
    finite = torch.isfinite(rewards)
    if bool(finite.all()):
        return rewards, torch.ones_like(finite)

    details = describe_nonfinite(rewards, prompts)
    if policy == "abort":
        header = f"{len(details)} non-finite reward(s) (reward.nonfinite_policy='abort'): "
        message = header + "; ".join(details)
        logger.error(message)
        raise NonFiniteRewardError(message)

    bad_groups = torch.unique(groups[~finite])
    keep_mask = ~torch.isin(groups, bad_groups)
    for line in details:
        logger.warning("non-finite reward, dropping its group: %s", line)
    logger.warning(
        "reward.nonfinite_policy='drop-group': dropped %d group(s) %s = %d of %d samples",
        bad_groups.numel(),
        bad_groups.tolist(),
        int((~keep_mask).sum()),
        rewards.shape[0],
    )
    return torch.where(finite, rewards, torch.zeros_like(rewards)), keep_mask
