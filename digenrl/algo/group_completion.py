"""Group completion: a prompt group's advantages once all of its rewards are in, wherever they came from.

A group's G samples may be generated and scored in several places — GAP fragments smaller than a group
(docs/design.md §3 "GAP"), or a baseline that splits a group's samples over ranks — but its group-relative
advantage (r − mean_group) / (std_group + ε) needs every one of its rewards. :class:`GroupCompletion`
collects per-sample rewards keyed by (group id, sample index in the group) in any order and releases a
group the moment its last reward arrives, computed by :func:`digenrl.algo.advantages.group_advantages`
on the group's rewards in sample-index order: the same numbers as normalising the whole batch at once
(``algo.adv_std=group``; flow_grpo ``PerPromptStatTracker.update``), whatever order the rewards came in.

A sample whose ``keep`` is False (a non-finite reward under ``reward.nonfinite_policy=drop-group``,
:func:`digenrl.rewards.nonfinite.check_finite_rewards`) drops its whole group: the group is released with
every sample marked not kept and zero advantages, as :func:`digenrl.systems.phases.assign_advantages` does
for a batch that holds the group whole. A global std (``algo.adv_std=global``) needs the whole batch, so it
is not a per-group completion and is rejected here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from digenrl.algo.advantages import group_advantages


@dataclass(frozen=True)
class CompletedGroup:
    """One released group, every tensor ``[G]`` in sample-index order.

    rewards: float32 as received (0 where not kept). advantages: float32, 0 for a dropped or zero-variance
    group. keep: False for every sample of a dropped group. zero_variance: all rewards equal (no signal).
    """

    group: int
    rewards: Tensor
    advantages: Tensor
    keep: Tensor
    zero_variance: bool

    @property
    def dropped(self) -> bool:
        return not bool(self.keep.any())


class GroupCompletion:
    """Collects rewards keyed by (group, sample index); releases each group's advantages when complete.

    Args:
        group_size: G, the samples of every group (``algo.group_size``).
        clamp, eps: the advantage clamp and std epsilon (``algo.adv_clamp``; see ``group_advantages``).
        std_mode: only ``group`` (see the module docstring).
    """

    def __init__(self, group_size: int, *, clamp: float = 5.0, eps: float = 1e-4, std_mode: str = "group"):
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
        if std_mode != "group":
            raise ValueError(
                f"std_mode={std_mode!r}: group completion releases one group at a time, which needs the "
                "per-group std (algo.adv_std=group); a global std needs the whole batch"
            )
        if not (clamp > 0):
            raise ValueError(f"clamp must be > 0 (math.inf disables it), got {clamp!r}")
        if not (math.isfinite(eps) and eps >= 0):
            raise ValueError(f"eps must be a finite float >= 0, got {eps!r}")
        self.group_size = group_size
        self.clamp = clamp
        self.eps = eps
        self._rewards: dict[int, dict[int, tuple[float, bool]]] = {}  # group -> index -> (reward, keep)
        self._released: dict[int, CompletedGroup] = {}

    def add(
        self,
        group_ids: Iterable[int] | Tensor,
        sample_ids: Iterable[int] | Tensor,
        rewards: Iterable[float] | Tensor,
        keep: Iterable[bool] | Tensor | None = None,
    ) -> list[CompletedGroup]:
        """Record some samples' rewards; returns the groups this call completed (ascending group id).

        A (group, sample index) may arrive once; indices lie in [0, G). A kept reward must be finite."""
        groups = _ints(group_ids, "group_ids")
        indices = _ints(sample_ids, "sample_ids")
        values = [float(r) for r in (rewards.tolist() if isinstance(rewards, Tensor) else rewards)]
        kept = [True] * len(values) if keep is None else [bool(k) for k in _list(keep)]
        if not len(groups) == len(indices) == len(values) == len(kept):
            raise ValueError(
                f"group_ids, sample_ids, rewards and keep must have one entry per sample, got lengths "
                f"{len(groups)}, {len(indices)}, {len(values)}, {len(kept)}"
            )
        touched = set()
        for g, i, r, k in zip(groups, indices, values, kept, strict=True):
            if not 0 <= i < self.group_size:
                raise ValueError(f"sample index {i} of group {g} is outside [0, {self.group_size})")
            if g in self._released or i in self._rewards.get(g, {}):
                raise ValueError(f"the reward of sample {i} of group {g} arrived twice")
            if k and not math.isfinite(r):
                raise ValueError(f"the reward of sample {i} of group {g} is {r} but marked kept")
            self._rewards.setdefault(g, {})[i] = (r, k)
            touched.add(g)
        done = sorted(g for g in touched if len(self._rewards[g]) == self.group_size)
        return [self._release(g) for g in done]

    def complete(self, group: int) -> bool:
        return group in self._released

    def released(self, group: int) -> CompletedGroup:
        """A group already released (KeyError naming what is missing otherwise)."""
        if group not in self._released:
            have = sorted(self._rewards.get(group, {}))
            raise KeyError(
                f"group {group} is not complete: rewards of sample indices {have} of {self.group_size}"
            )
        return self._released[group]

    @property
    def pending(self) -> list[int]:
        """Groups with some but not all rewards in."""
        return sorted(self._rewards)

    def advantages_for(self, group_ids: Tensor, sample_ids: Tensor) -> tuple[Tensor, Tensor]:
        """(advantages float32, keep bool) of the given samples, every group already released."""
        pairs = zip(_ints(group_ids, "group_ids"), _ints(sample_ids, "sample_ids"), strict=True)
        rows = [(self.released(g).advantages[i], self.released(g).keep[i]) for g, i in pairs]
        if not rows:
            return torch.zeros(0), torch.zeros(0, dtype=torch.bool)
        return torch.stack([a for a, _ in rows]), torch.stack([k for _, k in rows])

    def _release(self, group: int) -> CompletedGroup:
        entries = self._rewards.pop(group)
        rewards = torch.tensor([entries[i][0] for i in range(self.group_size)], dtype=torch.float64)
        keep = torch.tensor([entries[i][1] for i in range(self.group_size)])
        if not bool(keep.all()):  # drop-group: the whole group leaves training
            out = CompletedGroup(
                group,
                torch.where(keep, rewards, torch.zeros_like(rewards)).float(),
                torch.zeros(self.group_size),
                torch.zeros(self.group_size, dtype=torch.bool),
                False,
            )
        else:
            ids = torch.zeros(self.group_size, dtype=torch.int64)
            result = group_advantages(rewards, ids, std_mode="group", clamp=self.clamp, eps=self.eps)
            out = CompletedGroup(
                group, rewards.float(), result.advantages, keep, bool(result.zero_variance.all())
            )
        self._released[group] = out
        return out


def _list(values: Iterable | Tensor) -> list:
    return values.tolist() if isinstance(values, Tensor) else list(values)


def _ints(values: Iterable[int] | Tensor, name: str) -> list[int]:
    out = _list(values)
    if any(isinstance(v, bool) or not isinstance(v, int) for v in out):
        raise ValueError(f"{name} must be integers, got {out!r}")
    return out
