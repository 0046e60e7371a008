"""Choose a DigenRL plan for a profile and a cost model: pool split, D × S, fragment size, TAG.

The planner is a search over the simulator (docs/design.md §5, "Simulator and planner"): every
candidate :class:`SchedulePlan` is simulated and ranked by predicted steady-state samples/s. Search space:

- trainer / generator split: ``trainers`` in 1..N−1 (generators take the rest, layout convention:
  trainers first);
- TSP: every S dividing the generator count with S ≤ min(T, ``max_stages``); D = generators / S;
- fragment size F: every divisor of P (the runtime needs equal fragments, ``digenrl/gap/fragments.py``);
  F = P is one fragment, i.e. no streaming;
- TAG off / on (on = the simulator's bubble-triggered budget search);
- TCSS only if allowed (it changes the algorithm: opt-in, docs/design.md §3).

Every other knob (transport, fragment assignment, training order) comes from ``template``, whose
defaults mirror the runtime (``digenrl/systems/digenrl_system.py``).

Pruning is exact with respect to this search: splits are visited in decreasing order of an upper bound
on their throughput, and a split is skipped once its bound cannot beat the current runner-up. The bound
takes the cheapest per-sample generation and per-unit training cost over the profile's device types and
candidate batch sizes, spreads generation over the generators (and the trainers, when TAG may help) and
training over the trainers, and ignores every transfer, sync and dependency — no schedule can be faster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from digenrl.runtime.profiles import HardwareProfile, load_profile
from digenrl.sim.costs import CostModel
from digenrl.sim.device_costs import DeviceCosts
from digenrl.sim.schedule_plan import SchedulePlan
from digenrl.sim.simulator import SimResult, simulate
from digenrl.sim.workload import Workload


@dataclass(frozen=True)
class PlanScore:
    """One simulated candidate."""

    plan: SchedulePlan
    samples_per_s: float
    iteration_s: float
    busy_fraction: Mapping[str, float]

    @classmethod
    def of(cls, result: SimResult) -> PlanScore:
        plan = result.plan
        if plan.tag and not plan.tag_budget:  # the budget search inserted no TAG: it is the plain plan
            plan = plan.with_(tag=False, tag_budget=None)
        return cls(plan, result.samples_per_s, result.steady_iteration_s, dict(result.busy_fraction))

    def describe(self) -> str:
        busy = ", ".join(f"{role} {100 * f:.0f}%" for role, f in sorted(self.busy_fraction.items()))
        rate = f"{self.samples_per_s:.4g} samples/s ({self.iteration_s:.4g} s/it; busy {busy})"
        return f"{rate}: {self.plan.describe()}"


@dataclass
class PlannerResult:
    best: PlanScore
    runner_up: PlanScore | None
    evaluated: list[PlanScore] = field(default_factory=list)
    skipped_splits: list[int] = field(default_factory=list)

    def describe(self) -> str:
        lines = [f"best:      {self.best.describe()}"]
        if self.runner_up is not None:
            lines.append(f"runner-up: {self.runner_up.describe()}")
        lines.append(
            f"({len(self.evaluated)} distinct plans ranked; trainer counts pruned by the bound: "
            f"{self.skipped_splits or 'none'})"
        )
        return "\n".join(lines)


def fragment_options(prompts: int) -> list[int]:
    """Groups per fragment the runtime accepts: the divisors of P."""
    return [f for f in range(1, prompts + 1) if prompts % f == 0]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def throughput_bound(
    costs: DeviceCosts,
    workload: Workload,
    trainers: int,
    generators: int,
    fragments: Sequence[int],
    tag: bool,
) -> float:
    """Samples/s no schedule with this split can exceed (see the module docstring)."""
    types = list(costs.by_type.values())
    # Every batch a generator may run (fragments, the last partial fragment, a whole share) is at most
    # the largest fragment or the whole batch; take the cheapest per-sample cost over all of them.
    largest = max([f * workload.group_size for f in fragments] + [workload.samples_per_iteration])
    gen_per_sample = min(
        (workload.generation_s(c, b) + c.score_s(b)) / b for c in types for b in range(1, largest + 1)
    )
    unit_s = min(
        c.train_micro_batch_s(m, workload.cfg) / m
        for c in types
        for m in range(1, workload.micro_batch_size + 1)
    )
    helpers = trainers if tag else 0
    gen_s = workload.samples_per_iteration * gen_per_sample / (generators + helpers)
    train_s = workload.units_per_iteration * unit_s / trainers
    bound_s = max(gen_s, train_s)
    return workload.samples_per_iteration / bound_s if bound_s > 0 else math.inf


def search_plans(
    profile: HardwareProfile | str,
    costs: CostModel | Mapping[str, CostModel] | DeviceCosts,
    workload: Workload,
    *,
    allow_tcss: bool = False,
    trainer_counts: Sequence[int] | None = None,
    fragment_groups: Sequence[int] | None = None,
    max_stages: int = 8,
    tag_options: Sequence[bool] = (False, True),
    planning_iterations: int = 6,
    template: SchedulePlan | None = None,
) -> PlannerResult:
    """Best and runner-up ``digenrl`` plans by predicted steady-state samples/s.

    ``planning_iterations`` shortens the simulated run (1 warm-up, 1 cool-down, the rest steady). Sync
    schedules are periodic after the first iteration; TCSS can settle into a cycle of a few iterations
    (its prefetch depth alternates), which 4 steady iterations average well enough to rank plans.
    """
    profile = load_profile(profile) if isinstance(profile, str) else profile
    device_costs = costs if isinstance(costs, DeviceCosts) else DeviceCosts(profile, costs)
    template = template or SchedulePlan("digenrl")
    if template.system != "digenrl":
        raise ValueError(f"template.system must be 'digenrl', got {template.system!r}")
    world = profile.world_size
    if world < 2:
        raise ValueError(f"profile '{profile.name}' has {world} device(s); separate pools need at least 2")
    iterations = max(3, planning_iterations)
    workload = replace(workload, iterations=iterations, warmup_iterations=1, cooldown_iterations=1)
    counts = list(trainer_counts) if trainer_counts is not None else list(range(1, world))
    bad = [n for n in counts if not 1 <= n < world]
    if bad:
        raise ValueError(f"trainer_counts {bad} must be in [1, {world - 1}] for profile '{profile.name}'")
    fragments = sorted(set(fragment_groups or fragment_options(workload.prompts_per_iteration)))
    if not fragments or min(fragments) < 1:
        raise ValueError(f"fragment_groups must be positive ints, got {fragment_groups}")
    tcss_options = (False, True) if allow_tcss else (False,)
    bounds = {
        n: throughput_bound(device_costs, workload, n, world - n, fragments, any(tag_options)) for n in counts
    }
    scores: list[PlanScore] = []
    skipped: list[int] = []
    for trainers in sorted(counts, key=lambda n: -bounds[n]):
        ranked = sorted(scores, key=lambda s: -s.samples_per_s)
        if len(ranked) >= 2 and bounds[trainers] <= ranked[1].samples_per_s:
            skipped.append(trainers)
            continue
        generators = world - trainers
        stages = [s for s in _divisors(generators) if s <= min(max_stages, workload.num_steps)]
        for s in stages:
            for f in fragments:
                for tcss in tcss_options:
                    for tag in tag_options:
                        plan = template.with_(
                            trainers=trainers,
                            generators=generators,
                            fragment_groups=f,
                            tsp_stages=s,
                            tag=tag,
                            tag_budget=None,
                            tcss=tcss,
                        )
                        scores.append(PlanScore.of(simulate(profile, device_costs, workload, plan)))
    if not scores:
        raise ValueError("no candidate plan was simulated")
    unique = {score.plan: score for score in scores}  # TAG searched down to 0 = the TAG-off plan
    ranked = sorted(unique.values(), key=lambda s: (-s.samples_per_s, _complexity(s.plan)))
    return PlannerResult(
        best=ranked[0],
        runner_up=ranked[1] if len(ranked) > 1 else None,
        evaluated=ranked,
        skipped_splits=sorted(skipped),
    )


def _complexity(plan: SchedulePlan) -> tuple[int, int, int, int]:
    """Tie-break equal throughput toward the simpler plan: no TAG, no TCSS, fewer stages, bigger fragments."""
    return (int(plan.tag), int(plan.tcss), plan.tsp_stages, -plan.fragment_groups)


def predict_baselines(
    profile: HardwareProfile | str,
    costs: CostModel | Mapping[str, CostModel] | DeviceCosts,
    workload: Workload,
    *,
    planning_iterations: int = 6,
) -> list[PlanScore]:
    """The baselines of docs/design.md §4 on the same profile, each tuned over its own knobs (pool split,
    sub-batches, staleness) the way its authors would run it; best first."""
    profile = load_profile(profile) if isinstance(profile, str) else profile
    device_costs = costs if isinstance(costs, DeviceCosts) else DeviceCosts(profile, costs)
    workload = replace(
        workload, iterations=max(3, planning_iterations), warmup_iterations=1, cooldown_iterations=1
    )
    world = profile.world_size
    candidates: dict[str, list[SchedulePlan]] = {
        "colocated-sync": [SchedulePlan("colocated-sync")],
        "colocated-overlap": [SchedulePlan("colocated-overlap", overlap_sub_batches=j) for j in (None, 2, 4)],
    }
    if world >= 2:
        splits = range(1, world)
        candidates["separate-sync"] = [
            SchedulePlan("separate-sync", trainers=n, generators=world - n) for n in splits
        ]
        candidates["separate-async"] = [
            SchedulePlan("separate-async", trainers=n, generators=world - n, max_staleness=s)
            for n in splits
            for s in (0, 1)
        ]
    best: list[PlanScore] = []
    for plans in candidates.values():
        scores = [PlanScore.of(simulate(profile, device_costs, workload, plan)) for plan in plans]
        best.append(max(scores, key=lambda s: s.samples_per_s))
    return sorted(best, key=lambda s: -s.samples_per_s)
