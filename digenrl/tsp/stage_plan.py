"""TSP stage boundaries: which contiguous range of denoising steps each pipeline stage owns
(docs/design.md §3 "TSP").

Time-step parallelism shards the T sequential denoising steps of a fragment over S generator GPUs:
stage s owns steps ``[b_s, b_{s+1})``, receives the fragment's latent from stage s−1, runs its steps and
passes the latent on; the last stage also decodes and scores. In a pipeline the steady-state rate is set
by the slowest stage, so the boundaries should minimise the *maximum* stage time, where stage s's time
is the sum of its steps' costs on its own device (heterogeneous pools: a slower GPU gets fewer steps)
plus, for the last stage, the decode + score cost.

:func:`plan_stages` solves that exactly: minimising the bottleneck of a partition of a sequence into S
contiguous non-empty parts is the classic "linear partition" problem, solved by dynamic programming
over (stages used, steps covered) in O(S·T²) (Skiena, *The Algorithm Design Manual*, §8.5 "The Partition
Problem"); here each stage has its own per-step costs, which the same recurrence handles. T ≤ ~100 and
S ≤ ~8 in practice, so the exact DP costs microseconds. Pure Python, no dependencies: the runtime's TSP
plan and the simulator both use it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StagePlan:
    """Contiguous step ranges per stage and their predicted times (seconds per fragment).

    ``boundaries`` has S+1 entries: stage s owns steps ``range(boundaries[s], boundaries[s+1])``;
    ``boundaries[0] == 0`` and ``boundaries[-1] == num_steps``.
    """

    boundaries: tuple[int, ...]
    stage_times: tuple[float, ...]
    last_stage_extra_s: float = 0.0

    def __post_init__(self) -> None:
        b = self.boundaries
        if len(b) < 2 or b[0] != 0 or any(lo >= hi for lo, hi in itertools.pairwise(b)):
            raise ValueError(f"StagePlan.boundaries must rise strictly from 0, got {b}")
        if len(self.stage_times) != len(b) - 1:
            raise ValueError(
                f"StagePlan.stage_times has {len(self.stage_times)} entries for {len(b) - 1} stages"
            )

    @property
    def num_stages(self) -> int:
        return len(self.boundaries) - 1

    @property
    def num_steps(self) -> int:
        return self.boundaries[-1]

    def steps(self, stage: int) -> range:
        """The denoising step indices stage ``stage`` runs."""
        if not 0 <= stage < self.num_stages:
            raise ValueError(f"stage must be in [0, {self.num_stages}), got {stage}")
        return range(self.boundaries[stage], self.boundaries[stage + 1])

    def stage_of_step(self, step: int) -> int:
        """The stage that runs denoising step ``step``."""
        if not 0 <= step < self.num_steps:
            raise ValueError(f"step must be in [0, {self.num_steps}), got {step}")
        return next(s for s in range(self.num_stages) if step < self.boundaries[s + 1])

    @property
    def bottleneck_s(self) -> float:
        """The slowest stage's time: the pipeline emits one fragment per this many seconds."""
        return max(self.stage_times)

    @property
    def imbalance(self) -> float:
        """max / mean stage time (1.0 = perfectly balanced)."""
        mean = sum(self.stage_times) / self.num_stages
        return self.bottleneck_s / mean if mean > 0 else 1.0

    def describe(self) -> str:
        parts = []
        for s in range(self.num_stages):
            lo, hi = self.boundaries[s], self.boundaries[s + 1]
            extra = " +decode/score" if s == self.num_stages - 1 and self.last_stage_extra_s > 0 else ""
            parts.append(f"stage {s}: steps [{lo}, {hi}) {1e3 * self.stage_times[s]:.3f} ms{extra}")
        return (
            f"StagePlan({self.num_stages} stages, {self.num_steps} steps): "
            + " | ".join(parts)
            + f" | bottleneck {1e3 * self.bottleneck_s:.3f} ms, imbalance {self.imbalance:.3f}"
        )


def _cost_matrix(
    num_steps: int, stages: int, step_cost_s: float | Sequence[float] | Sequence[Sequence[float]]
) -> list[list[float]]:
    """Normalise ``step_cost_s`` to an S × T matrix: cost of step t when run by stage s's device."""
    if isinstance(step_cost_s, int | float) and not isinstance(step_cost_s, bool):
        rows = [[float(step_cost_s)] * num_steps for _ in range(stages)]
    elif isinstance(step_cost_s, Sequence) and len(step_cost_s) == stages:
        if all(isinstance(c, int | float) and not isinstance(c, bool) for c in step_cost_s):
            rows = [[float(c)] * num_steps for c in step_cost_s]  # one per-step cost per stage device
        elif all(isinstance(row, Sequence) and len(row) == num_steps for row in step_cost_s):
            rows = [[float(c) for c in row] for row in step_cost_s]
        else:
            raise ValueError(
                f"step_cost_s must be a number, {stages} numbers (one per stage device) or a "
                f"{stages} x {num_steps} matrix"
            )
    else:
        raise ValueError(
            f"step_cost_s must be a number, {stages} numbers (one per stage device) or a "
            f"{stages} x {num_steps} matrix, got {step_cost_s!r}"
        )
    for row in rows:
        for c in row:
            if not math.isfinite(c) or c < 0:
                raise ValueError(f"step_cost_s entries must be finite and >= 0, got {c!r}")
    return rows


def plan_stages(
    num_steps: int,
    stages: int,
    step_cost_s: float | Sequence[float] | Sequence[Sequence[float]],
    last_stage_extra_s: float = 0.0,
) -> StagePlan:
    """Boundaries minimising the maximum stage time over all contiguous partitions (exact DP).

    Args:
        num_steps: T denoising steps (T >= stages: every stage owns at least one step).
        stages: S pipeline stages.
        step_cost_s: seconds per step — one number (uniform), one number per stage (the per-step cost
            on that stage's device), or an S × T matrix (cost of step t on stage s's device, e.g. when
            steps differ in cost).
        last_stage_extra_s: the last stage's decode + score time per fragment.

    Ties (several partitions with the same bottleneck) keep, at every DP cell, the smallest cut.
    """
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages must be an int >= 1, got {stages!r}")
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < stages:
        raise ValueError(f"num_steps must be an int >= stages ({stages}), got {num_steps!r}")
    if not (math.isfinite(last_stage_extra_s) and last_stage_extra_s >= 0):
        raise ValueError(f"last_stage_extra_s must be finite and >= 0, got {last_stage_extra_s!r}")
    costs = _cost_matrix(num_steps, stages, step_cost_s)
    prefix = []
    for row in costs:
        acc = [0.0]
        for c in row:
            acc.append(acc[-1] + c)
        prefix.append(acc)

    def stage_time(s: int, lo: int, hi: int) -> float:
        extra = last_stage_extra_s if s == stages - 1 else 0.0
        return prefix[s][hi] - prefix[s][lo] + extra

    inf = math.inf
    # best[s][j]: minimal bottleneck placing steps [0, j) on stages 0..s (s+1 stages, each non-empty);
    # cut[s][j]: the first step of stage s in that optimum.
    best = [[inf] * (num_steps + 1) for _ in range(stages)]
    cut = [[0] * (num_steps + 1) for _ in range(stages)]
    for j in range(1, num_steps + 1):
        best[0][j] = stage_time(0, 0, j)
    for s in range(1, stages):
        for j in range(s + 1, num_steps + 1):
            for i in range(s, j):
                value = max(best[s - 1][i], stage_time(s, i, j))
                if value < best[s][j]:
                    best[s][j], cut[s][j] = value, i
    bounds = [num_steps]
    for s in range(stages - 1, 0, -1):
        bounds.append(cut[s][bounds[-1]])
    bounds.append(0)
    boundaries = tuple(reversed(bounds))
    times = tuple(stage_time(s, boundaries[s], boundaries[s + 1]) for s in range(stages))
    return StagePlan(boundaries=boundaries, stage_times=times, last_stage_extra_s=float(last_stage_extra_s))
