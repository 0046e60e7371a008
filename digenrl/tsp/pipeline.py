"""TSP — time-step parallelism: the generator pool as D data-parallel pipelines × S denoising stages.

docs/design.md §3 (TSP): a sample's T denoising steps are sequential, but different samples are independent,
so the steps are sharded over generator GPUs as pipeline stages. Stage s of a pipeline owns steps
``[b_s, b_{s+1})``: it receives a fragment's in-flight rollout (a :class:`TrajectoryBatch` with
``steps_done = b_s``) from stage s−1, runs its steps with :meth:`RolloutEngine.advance`, and passes the
batch on; the last stage decodes and scores. Each GAP fragment is one pipeline micro-batch.
``tsp.stages = 1`` is plain data parallelism (every generator rank is a one-stage pipeline).

Rank placement. The generator pool (in the order the run layout lists it) is cut into D = |pool| / S
runs of S *consecutive* ranks; pipeline p is the p-th run and its stage s is the run's s-th rank.
Consecutive ranks share a node (torchrun fills nodes in rank order), so each stage hop crosses NVLink
rather than the network whenever S divides the GPUs per node.

Boundaries. In steady state a pipeline emits one fragment per *bottleneck* stage time, so each
pipeline's boundaries minimise its slowest stage (:func:`digenrl.tsp.stage_plan.plan_stages`, exact
DP). The time of step t on stage s is ``step_cost_s[t] / relative_speed`` of the stage's device (the
hardware profile's H200-relative speed, :mod:`digenrl.runtime.hardware.profiles`), and the last stage also
pays the decode + score cost scaled the same way. Pipelines on different device types get different
boundaries. Uniform step costs are fine for DiT samplers (every step is one forward of the same shape);
pass measured per-step costs when they differ (e.g. CFG only on some steps).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from digenrl.config import ConfigError
from digenrl.runtime.hardware.profiles import HardwareProfile
from digenrl.tsp.stage_plan import StagePlan, plan_stages

STAGES_KEY = "tsp.stages"
BOUNDARIES_KEY = "tsp.boundaries"  # fixed boundaries (ablation); None = balanced
POOL_KEY = "pools.generators"
NUM_STEPS_KEY = "sampler.num_steps"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class TspLayout:
    """Which generator rank is which stage of which pipeline (pure data, identical on every rank)."""

    generator_ranks: tuple[int, ...]  # the generator pool, in layout order
    stages: int  # S (tsp.stages)

    def __post_init__(self) -> None:
        ranks = tuple(self.generator_ranks)
        object.__setattr__(self, "generator_ranks", ranks)
        if not ranks or not all(_is_int(r) and r >= 0 for r in ranks) or len(set(ranks)) != len(ranks):
            raise ValueError(f"generator_ranks must be distinct global ranks >= 0, got {ranks!r}")
        s = self.stages
        if not _is_int(s) or s < 1:
            raise ConfigError(f"{STAGES_KEY} must be an int >= 1, got {s!r}")
        if len(ranks) % s:
            divisors = [d for d in range(1, len(ranks) + 1) if len(ranks) % d == 0]
            raise ConfigError(
                f"{STAGES_KEY}={s} does not divide the generator pool of {len(ranks)} ranks ({POOL_KEY}, or "
                f"the world size when colocated): the pool must split into equal pipelines; "
                f"choose {STAGES_KEY} in {divisors}"
            )

    @property
    def num_pipelines(self) -> int:
        """D data-parallel pipelines."""
        return len(self.generator_ranks) // self.stages

    def pipeline_ranks(self, pipeline: int) -> tuple[int, ...]:
        """The S ranks of ``pipeline``, stage 0 first."""
        self._check_pipeline(pipeline)
        return self.generator_ranks[pipeline * self.stages : (pipeline + 1) * self.stages]

    def rank_of(self, pipeline: int, stage: int) -> int:
        if not _is_int(stage) or not 0 <= stage < self.stages:
            raise ValueError(f"stage must be an int in [0, {self.stages}), got {stage!r}")
        return self.pipeline_ranks(pipeline)[stage]

    def pipeline_of(self, rank: int) -> int:
        return self._position(rank) // self.stages

    def stage_of(self, rank: int) -> int:
        return self._position(rank) % self.stages

    def next_rank(self, rank: int) -> int | None:
        """The rank that receives ``rank``'s fragments; None for a last stage (it decodes and scores)."""
        p, s = self.pipeline_of(rank), self.stage_of(rank)
        return None if s == self.stages - 1 else self.rank_of(p, s + 1)

    def prev_rank(self, rank: int) -> int | None:
        """The rank ``rank`` receives fragments from; None for a first stage (it starts rollouts)."""
        p, s = self.pipeline_of(rank), self.stage_of(rank)
        return None if s == 0 else self.rank_of(p, s - 1)

    def is_first_stage(self, rank: int) -> bool:
        return self.stage_of(rank) == 0

    def is_last_stage(self, rank: int) -> bool:
        return self.stage_of(rank) == self.stages - 1

    @property
    def first_stage_ranks(self) -> tuple[int, ...]:
        """Per pipeline, the rank that starts its fragments."""
        return tuple(self.rank_of(p, 0) for p in range(self.num_pipelines))

    @property
    def last_stage_ranks(self) -> tuple[int, ...]:
        """Per pipeline, the rank that decodes, scores and ships its finished fragments."""
        return tuple(self.rank_of(p, self.stages - 1) for p in range(self.num_pipelines))

    def check_num_steps(self, num_steps: int) -> None:
        """Every stage needs at least one denoising step."""
        if not _is_int(num_steps) or num_steps < 1:
            raise ConfigError(f"{NUM_STEPS_KEY} must be an int >= 1, got {num_steps!r}")
        if self.stages > num_steps:
            raise ConfigError(
                f"{STAGES_KEY}={self.stages} exceeds {NUM_STEPS_KEY}={num_steps}: every stage must own at "
                f"least one denoising step; choose {STAGES_KEY} <= {num_steps}"
            )

    def describe(self) -> str:
        lines = [
            f"TSP: {len(self.generator_ranks)} generator ranks = {self.num_pipelines} pipeline(s) "
            f"x {self.stages} stage(s)"
        ]
        for p in range(self.num_pipelines):
            lines.append(f"  pipeline {p}: ranks {' -> '.join(str(r) for r in self.pipeline_ranks(p))}")
        return "\n".join(lines)

    def _position(self, rank: int) -> int:
        try:
            return self.generator_ranks.index(rank)
        except ValueError:
            raise ValueError(f"rank {rank!r} is not a generator rank {list(self.generator_ranks)}") from None

    def _check_pipeline(self, pipeline: int) -> None:
        if not _is_int(pipeline) or not 0 <= pipeline < self.num_pipelines:
            raise ValueError(f"pipeline must be an int in [0, {self.num_pipelines}), got {pipeline!r}")


@dataclass(frozen=True)
class TspPlan:
    """A layout with the stage boundaries of each of its pipelines."""

    layout: TspLayout
    stage_plans: tuple[StagePlan, ...]  # one per pipeline
    relative_speeds: tuple[float, ...]  # per generator rank (layout order): what the balancing assumed
    # step costs were measured seconds (False: nominal unit costs, balanced by device speed alone)
    measured: bool = True

    def __post_init__(self) -> None:
        layout = self.layout
        if len(self.stage_plans) != layout.num_pipelines:
            raise ValueError(
                f"{len(self.stage_plans)} stage plans for {layout.num_pipelines} pipelines; need one each"
            )
        if len(self.relative_speeds) != len(layout.generator_ranks):
            raise ValueError("relative_speeds needs one entry per generator rank")
        steps = {plan.num_steps for plan in self.stage_plans}
        if len(steps) != 1:
            raise ValueError(f"all pipelines must cover the same number of steps, got {sorted(steps)}")
        for p, plan in enumerate(self.stage_plans):
            if plan.num_stages != layout.stages:
                raise ValueError(f"pipeline {p} has {plan.num_stages} stages, the layout {layout.stages}")

    @property
    def num_steps(self) -> int:
        return self.stage_plans[0].num_steps

    def plan_of(self, pipeline: int) -> StagePlan:
        self.layout._check_pipeline(pipeline)
        return self.stage_plans[pipeline]

    def steps_of(self, rank: int) -> range:
        """The denoising steps generator ``rank`` runs for every fragment of its pipeline."""
        return self.stage_plans[self.layout.pipeline_of(rank)].steps(self.layout.stage_of(rank))

    @property
    def bottleneck_s(self) -> float:
        """Predicted seconds per fragment of the slowest pipeline's slowest stage."""
        return max(plan.bottleneck_s for plan in self.stage_plans)

    def describe(self) -> str:
        """A start-up summary: per pipeline, each stage's rank, device speed, steps and predicted time."""
        layout = self.layout
        lines = [
            f"TSP: {len(layout.generator_ranks)} generator ranks = {layout.num_pipelines} pipeline(s) "
            f"x {layout.stages} stage(s), {self.num_steps} steps"
        ]
        for p, plan in enumerate(self.stage_plans):
            parts = []
            for s in range(layout.stages):
                rank = layout.rank_of(p, s)
                speed = self.relative_speeds[layout.generator_ranks.index(rank)]
                steps = plan.steps(s)
                extra = " +decode/score" if s == layout.stages - 1 and plan.last_stage_extra_s > 0 else ""
                cost = f" {1e3 * plan.stage_times[s]:.3f} ms{extra}" if self.measured else ""
                parts.append(f"rank {rank} (x{speed:g}) steps [{steps.start}, {steps.stop}){cost}")
            bottleneck = f" | bottleneck {1e3 * plan.bottleneck_s:.3f} ms" if self.measured else ""
            lines.append(f"  pipeline {p}: " + " | ".join(parts) + bottleneck)
        if not self.measured:
            lines.append("  (no measured step costs: stages balanced by device speed, equal cost per step)")
        return "\n".join(lines)


def plan_tsp(
    layout: TspLayout,
    num_steps: int,
    step_cost_s: float | Sequence[float] | None = None,
    *,
    last_stage_extra_s: float = 0.0,
    profile: HardwareProfile | None = None,
    boundaries: Sequence[int] | None = None,
) -> TspPlan:
    """Stage boundaries for every pipeline of ``layout``.

    Args:
        num_steps: T denoising steps (``sampler.num_steps`` resolved).
        step_cost_s: seconds of one step on a reference device (relative speed 1.0, an H200): one number
            (uniform) or T numbers (measured per step); None = unmeasured, a nominal 1 s per step (the
            plan then balances by device speed alone and says so in :meth:`TspPlan.describe`).
        last_stage_extra_s: decode + score seconds per fragment on the reference device.
        profile: the hardware profile; each stage's costs are divided by its device's
            ``relative_speed``. None: all devices equal.
        boundaries: fixed boundaries ``[0, b_1, …, T]`` for every pipeline (``tsp.boundaries``, e.g. an
            ablation with an even split) instead of the balanced ones; stage times are still predicted.
    """
    layout.check_num_steps(num_steps)
    measured = step_cost_s is not None
    step_cost_s = 1.0 if step_cost_s is None else step_cost_s
    if isinstance(step_cost_s, int | float) and not isinstance(step_cost_s, bool):
        per_step = [float(step_cost_s)] * num_steps
    else:
        per_step = [float(c) for c in step_cost_s]
        if len(per_step) != num_steps:
            raise ValueError(f"step_cost_s has {len(per_step)} entries; need one number or {num_steps}")
    if not all(math.isfinite(c) and c >= 0 for c in per_step):
        raise ValueError(f"step_cost_s entries must be finite and >= 0, got {per_step}")
    if not (math.isfinite(last_stage_extra_s) and last_stage_extra_s >= 0):
        raise ValueError(f"last_stage_extra_s must be finite and >= 0, got {last_stage_extra_s!r}")
    fixed = None if boundaries is None else check_boundaries(boundaries, layout.stages, num_steps)
    speeds = tuple(
        profile.device_type(r).relative_speed if profile is not None else 1.0 for r in layout.generator_ranks
    )
    plans = []
    for p in range(layout.num_pipelines):
        stage_speed = [speeds[layout.generator_ranks.index(r)] for r in layout.pipeline_ranks(p)]
        costs = [[c / v for c in per_step] for v in stage_speed]
        extra = last_stage_extra_s / stage_speed[-1]
        if fixed is None:
            plans.append(plan_stages(num_steps, layout.stages, costs, extra))
        else:
            times = tuple(
                sum(costs[s][fixed[s] : fixed[s + 1]]) + (extra if s == layout.stages - 1 else 0.0)
                for s in range(layout.stages)
            )
            plans.append(StagePlan(boundaries=fixed, stage_times=times, last_stage_extra_s=extra))
    return TspPlan(layout=layout, stage_plans=tuple(plans), relative_speeds=speeds, measured=measured)


def check_boundaries(boundaries: Sequence[int], stages: int, num_steps: int) -> tuple[int, ...]:
    b = tuple(boundaries)
    if len(b) != stages + 1 or not all(_is_int(x) for x in b) or b[0] != 0 or b[-1] != num_steps:
        raise ConfigError(
            f"{BOUNDARIES_KEY} must be {stages + 1} ints from 0 to {NUM_STEPS_KEY}={num_steps} "
            f"({STAGES_KEY}={stages} stages), got {list(b)}"
        )
    empty = [s for s in range(stages) if b[s + 1] <= b[s]]
    if empty:
        raise ConfigError(
            f"{BOUNDARIES_KEY}={list(b)} gives stage(s) {empty} no denoising step; boundaries must rise "
            f"strictly"
        )
    return b
