"""Choose a plan for a profile and a cost model by simulating the candidates (docs/design.md §5, "Simulator
and planner"), with DigenRL's plan space containing every baseline (docs/design.md §4, "The plan space
contains the baselines").

DigenRL's plan space at a staleness budget s (0: on-policy; 1: TCSS allowed):

- **no dedicated generator** — every GPU generates and trains (0 generators, TAG in both directions): the
  colocated schedules ``colocated-sync``, ``colocated-overlap`` (sub-batches searched) and
  ``colocated-engine`` (the hybrid engine, its states offloaded or both copies resident), with equal work
  per GPU or, on a heterogeneous profile, work proportional to GPU speed;
- **disjoint pools without streaming** — ``separate-sync`` and ``separate-async`` (staleness ≤ s), every
  split;
- **DigenRL's mechanisms** — every split, TSP stages S dividing the generator count (S ≤ ``max_stages``),
  fragment sizes F, TAG off / on (the simulator's budget search), TCSS if s ≥ 1; then, for the best few,
  the transport (buffered / rendezvous), fragment assignment (dynamic / round-robin), training order
  (index / arrival) and GAP off, one knob at a time, kept where they help.

So the best plan is never worse than the best baseline of equal staleness: it is chosen from a superset
(:meth:`Planner.search`; the tables check it). Every candidate first gets the memory knobs it can run
(:func:`digenrl.planning.memory.fit_plan`: micro-batch, activation checkpointing, generator batch, parking);
a candidate nothing fits is rejected with its reason (:attr:`PlannerResult.rejected`).

Pruning is exact with respect to this search (``prune=False`` is the same search without it): splits are
visited in decreasing order of an upper bound on their throughput, and a split is skipped once its bound
cannot beat the current runner-up; within a split, a plan is skipped once its own bound cannot. The
refinement is a heuristic on the overall best plans: the best plan of a split that is not among them is
not refined, so searching one split alone (``trainer_counts=[n]``) can find a better refined plan there.
The bound takes the cheapest per-sample generation and per-unit training cost over the profile's device
types and candidate batch sizes, spreads generation over the generators (and the trainers, when TAG may
help) and training over the trainers, and ignores every transfer, sync, switch, memory limit and
dependency — no schedule can be faster.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from digenrl.config import COLOCATED_SYSTEMS, SYSTEMS
from digenrl.costs.cost_model import CFG_KEYS, CostModel
from digenrl.costs.device_costs import DeviceCosts
from digenrl.plan import RunPlan
from digenrl.plan.sequence_shape import sequence_degrees
from digenrl.plan.workload import Workload
from digenrl.planning.memory import Fit, fit_plan
from digenrl.rules import search_tag_budget, tag_budget_limit
from digenrl.runtime.hardware.profiles import HardwareProfile, load_profile
from digenrl.sim.simulator import SimResult, simulate

#: The baselines of docs/design.md §4 (labels of :meth:`Planner.baselines`): every system but DigenRL.
BASELINES = tuple(system for system in SYSTEMS if system != "digenrl")
#: Knob variants tried on the best few DigenRL plans (field → alternative value).
#: Only knobs the runtime has: the planner hands out runnable plans (:attr:`RunPlan.runnable`).
REFINEMENTS: tuple[tuple[str, object], ...] = (
    ("fragment_assignment", "round-robin"),
    ("train_order", "arrival"),
    ("gap", False),
)


@dataclass(frozen=True)
class PlanScore:
    """One simulated candidate."""

    plan: RunPlan
    samples_per_s: float
    iteration_s: float
    busy_fraction: Mapping[str, float]
    bubble_free_samples_per_s: float = math.inf
    notes: tuple[str, ...] = ()

    @classmethod
    def of(cls, result: SimResult, notes: Iterable[str] = ()) -> PlanScore:
        # a searched budget is the plan's (RunPlan.with_tag_budget: budget 0 is the TAG-off plan)
        return cls(
            result.plan,
            result.samples_per_s,
            result.steady_iteration_s,
            dict(result.busy_fraction),
            result.bubble_free_samples_per_s,
            tuple(notes),
        )

    @property
    def staleness(self) -> int:
        return self.plan.staleness

    def describe(self) -> str:
        busy = ", ".join(f"{role} {100 * f:.0f}%" for role, f in sorted(self.busy_fraction.items()))
        rate = f"{self.samples_per_s:.4g} samples/s ({self.iteration_s:.4g} s/it; busy {busy})"
        memory = f" [{'; '.join(self.notes)}]" if self.notes else ""
        return f"{rate}: {self.plan.describe()}{memory}"


@dataclass
class PlannerResult:
    best: PlanScore
    runner_up: PlanScore | None
    evaluated: list[PlanScore] = field(default_factory=list)
    skipped_splits: list[int] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # plan description → why it cannot run

    def describe(self) -> str:
        lines = [f"best:      {self.best.describe()}"]
        if self.runner_up is not None:
            lines.append(f"runner-up: {self.runner_up.describe()}")
        lines.append(
            f"({len(self.evaluated)} distinct plans ranked; trainer counts pruned by the bound: "
            f"{self.skipped_splits or 'none'}; {len(self.rejected)} rejected for memory)"
        )
        return "\n".join(lines)


def fragment_options(prompts: int) -> list[int]:
    """Groups per fragment the runtime accepts: the divisors of P."""
    return [f for f in range(1, prompts + 1) if prompts % f == 0]


def sub_group_options(group_size: int) -> list[int]:
    """Fragment sizes below a group the planner tries by default: half and a quarter of a group (where
    whole), so a video batch of few groups can still feed every generator and stream early."""
    return [
        s for s in (group_size // 2, group_size // 4) if s >= 1 and group_size % s == 0 and s < group_size
    ]


def fragment_plan_knobs(samples: int, group_size: int) -> dict[str, int]:
    """The plan's fragment knobs for a size in samples: whole groups as ``fragment_groups`` (one spelling
    per plan, as :class:`~digenrl.gap.fragments.FragmentPlan` normalises), else ``fragment_samples``."""
    if samples % group_size == 0:
        return {"fragment_groups": samples // group_size, "fragment_samples": 0}
    return {"fragment_groups": 1, "fragment_samples": samples}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _rates(
    costs: DeviceCosts, workload: Workload, ranks: Sequence[int], batches: Sequence[int]
) -> tuple[float, float]:
    """(samples/s, training units/s) of ``ranks`` working in perfect balance: each rank at its device's
    cheapest per-sample generation over ``batches`` and cheapest per-unit training up to the micro-batch."""
    gen, train = 0.0, 0.0
    per_type: dict[str, tuple[float, float]] = {}
    for rank in ranks:
        cost = costs.for_rank(rank)
        if cost.device not in per_type:
            per_sample = min((workload.generation_s(cost, b) + cost.score_s(b)) / b for b in batches)
            # every micro-batch the memory fit may choose: up to the largest measured one
            largest = max(
                workload.micro_batch_size, max(cost.train_points.get(CFG_KEYS[workload.cfg], {1: 0}))
            )
            per_unit = min(
                cost.train_micro_batch_s(m, workload.cfg, False) / m for m in range(1, largest + 1)
            )
            per_type[cost.device] = (per_sample, per_unit)
        per_sample, per_unit = per_type[cost.device]
        gen += 1 / per_sample if per_sample > 0 else math.inf
        train += 1 / per_unit if per_unit > 0 else math.inf
    return gen, train


def throughput_bound(
    costs: DeviceCosts,
    workload: Workload,
    trainers: int,
    generators: int,
    fragments: Sequence[int],
    tag: bool,
    prefetch: bool = True,
) -> float:
    """Samples/s no schedule with this split can exceed (see the module docstring): generation spread in
    perfect balance over the generators (and the trainers, when TAG may help) at each device's cheapest
    batch, training over the trainers. ``prefetch`` (TCSS may run): a steady window of n iterations may
    have had one iteration's generation done before it started, so only n − 1 iterations' generation is
    sure to fall inside it. ``fragments``: the candidate fragment sizes, in samples."""
    largest = max([*fragments, workload.samples_per_iteration])
    batches = range(1, largest + 1)
    trainer_ranks = range(trainers)
    gen_ranks = range(trainers, trainers + generators)
    gen_rate, _ = _rates(costs, workload, gen_ranks, batches)
    helper_rate, train_rate = _rates(costs, workload, trainer_ranks, batches)
    return _bound(workload, gen_rate + (helper_rate if tag else 0.0), train_rate, prefetch)


def _bound(workload: Workload, samples_per_s: float, units_per_s: float, prefetch: bool) -> float:
    steady = len(workload.steady_iterations)
    gen_s = workload.samples_per_iteration / samples_per_s * ((steady - 1) / steady if prefetch else 1.0)
    train_s = workload.units_per_iteration / units_per_s
    bound_s = max(gen_s, train_s)
    return workload.samples_per_iteration / bound_s if bound_s > 0 else math.inf


def plan_bound(costs: DeviceCosts, workload: Workload, plan: RunPlan) -> float:
    """Samples/s no schedule of this DigenRL ``plan`` can exceed: :func:`throughput_bound` with the batch
    its generators actually run (a fragment, at most ``samples_per_forward`` per forward)."""
    w = plan.effective_workload(workload)
    world = plan.trainers + plan.generators
    batch = [plan.fragment_size(w)]
    gen_rate, _ = _rates(costs, w, plan.generator_ranks(world), batch)
    helper_rate, train_rate = _rates(costs, w, plan.trainer_ranks(world), batch)
    return _bound(w, gen_rate + (helper_rate if plan.tag else 0.0), train_rate, plan.tcss)


class Planner:
    """Scores plans of one workload on one profile: memory fit, then simulation, each plan once."""

    def __init__(
        self,
        profile: HardwareProfile | str,
        costs: CostModel | Mapping[str, CostModel] | DeviceCosts,
        workload: Workload,
        *,
        planning_iterations: int = 6,
        log: Callable[[str], None] | None = None,
        log_every_s: float = 60.0,
    ) -> None:
        """``planning_iterations`` shortens the simulated run (1 warm-up, 1 cool-down, the rest steady).
        Sync schedules are periodic after the first iteration; TCSS can settle into a cycle of a few
        iterations (its prefetch depth alternates), which 4 steady iterations average well enough to rank.
        ``log`` receives a progress line from :meth:`search` at most every ``log_every_s`` seconds (a
        panel of the tables can search for tens of minutes)."""
        self.profile = load_profile(profile) if isinstance(profile, str) else profile
        self.costs = costs if isinstance(costs, DeviceCosts) else DeviceCosts(self.profile, costs)
        iterations = max(3, planning_iterations)
        self.workload = replace(workload, iterations=iterations, warmup_iterations=1, cooldown_iterations=1)
        self.rejected: dict[str, str] = {}  # plan → why nothing fits in memory
        self.invalid: dict[str, str] = {}  # plan → the runtime check it fails
        self._scores: dict[RunPlan, PlanScore | None] = {}
        self._fits: dict[RunPlan, Fit] = {}
        self._log = log
        self._log_every_s = log_every_s
        self._started = self._logged = time.monotonic()

    def _progress(self, line: str) -> None:
        """One progress line, if ``log`` is set and ``log_every_s`` passed since the last one."""
        now = time.monotonic()
        if self._log is not None and now - self._logged >= self._log_every_s:
            self._logged = now
            simulated = sum(score is not None for score in self._scores.values())
            self._log(f"{line}; {simulated} plans simulated, {now - self._started:.0f} s")

    @property
    def world(self) -> int:
        return self.profile.world_size

    @property
    def heterogeneous(self) -> bool:
        return len({self.profile.device_type(r).name for r in range(self.world)}) > 1

    def score(self, plan: RunPlan) -> PlanScore | None:
        """The simulated score of ``plan`` with the memory knobs it can run; None if it cannot run (the
        reason is in :attr:`rejected` / :attr:`invalid`). A TAG plan without a budget searches it: budgets
        0, 1, 2, … per trainer (0 is the TAG-off plan), stopping after two that do not improve, the best
        kept and ties going to the smaller budget — TAG only where it shortens the makespan."""
        if plan in self._scores:
            return self._scores[plan]
        score = self._search_tag_budget(plan) if plan.searches_tag_budget else self._score_exact(plan)
        if self._searches_sharding(plan):
            # trainer.sharding: a full fine-tune across nodes also tries hybrid sharding (shard inside a
            # node, replicate across nodes); the better plan is the score, flat kept on a tie
            hybrid = self.score(plan.with_(trainer_sharding="hybrid"))
            if hybrid is not None and (score is None or hybrid.samples_per_s > score.samples_per_s):
                score = hybrid
        self._scores[plan] = score
        return score

    def _searches_sharding(self, plan: RunPlan) -> bool:
        return (
            plan.trainer_sharding == "flat"
            and self.workload.trainer_mode == "full"
            and self.profile.num_nodes > 1
        )

    def _score_exact(self, plan: RunPlan) -> PlanScore | None:
        if plan in self._scores:
            return self._scores[plan]
        score = None
        try:
            plan.check(self.world, self.workload, self.profile.relative_speeds, self.profile.node_of)
        except ValueError as error:
            self.invalid[plan.describe()] = str(error)
        else:
            fit = self._fit(plan)
            if fit.plan is None:
                self.rejected[plan.describe()] = "; ".join(fit.notes)
            else:
                result = simulate(self.profile, self.costs, self.workload, fit.plan)
                score = PlanScore.of(result, fit.notes)
        self._scores[plan] = score
        return score

    def _fit(self, plan: RunPlan) -> Fit:
        """:func:`fit_plan`, once per memory-relevant shape of a plan (stages, transport, order, TCSS and the
        TAG budget do not change what a rank holds)."""
        key = plan.with_(
            tsp_stages=1,
            transport=None,
            train_order="index",
            tcss=False,
            tag_policy="auto",
            tag_max_fragments=0,
            gap=True,
            fragment_assignment="dynamic",
        )
        if key not in self._fits:
            self._fits[key] = fit_plan(self.profile, self.costs, self.workload, key)
        fit = self._fits[key]
        if fit.plan is None:
            return fit
        knobs = (
            "micro_batch_size",
            "activation_checkpointing",
            "samples_per_forward",
            "train_resident",
            "reward_resident",
        )
        return Fit(plan.with_(**{k: getattr(fit.plan, k) for k in knobs}), fit.notes, fit.checked)

    def _search_tag_budget(self, plan: RunPlan) -> PlanScore | None:
        def run(budget: int) -> PlanScore | None:  # budget 0 is the TAG-off plan (cached)
            return self._score_exact(plan.with_tag_budget(budget))

        limit = tag_budget_limit(plan.num_fragments(self.workload), plan.trainers, plan.tag_max_fragments)
        return search_tag_budget(limit, run)[0]

    # ------------------------------------------------------------------ baselines
    def baseline_plans(self, system: str, max_staleness: int = 0, work_split: str = "equal") -> list[RunPlan]:
        """Every plan of one baseline the way its authors would tune it: pool split, sub-batches,
        staleness (exactly ``max_staleness`` for separate-async)."""
        world = self.world
        if system == "colocated-sync":
            degrees = self.sequence_degrees() if work_split == "equal" else []
            return [RunPlan(system, work_split=work_split, sequence_parallel=n) for n in [1, *degrees]]
        if system == "colocated-engine":  # veRL-Omni's hybrid engine; both copies resident where they fit
            return [RunPlan(system, work_split=work_split, engine_offload=o) for o in (True, False)]
        if system == "colocated-overlap":
            # the runtime's sub-batches (sampler.samples_per_forward, kept by the memory fit unless memory
            # lowers it); overlap_sub_batches is a simulator what-if that run_train.py cannot run, so no
            # table row carries it
            plan = RunPlan(system, work_split=work_split)
            return [plan.with_(samples_per_forward=s) for s in self._overlap_sub_batch_sizes(plan)]
        splits = range(1, world)
        if system == "separate-sync":
            # Ulysses degrees of a video model: the trainer pool's, with the generators whole or sharded alike
            pairs = [(1, 1)] + [(d, g) for d in self.sequence_degrees() for g in (1, d)]
            return [
                RunPlan(
                    system,
                    trainers=n,
                    generators=world - n,
                    sequence_parallel=d,
                    generator_sequence_parallel=g,
                )
                for n in splits
                for d, g in pairs
            ]
        if system == "separate-async":
            return [
                RunPlan(system, trainers=n, generators=world - n, max_staleness=max_staleness) for n in splits
            ]
        raise ValueError(f"unknown baseline {system!r}; choose one of: {', '.join(BASELINES)}")

    def sequence_degrees(self) -> list[int]:
        """Ulysses degrees worth trying for this workload's model (:func:`sequence_degrees`): a video model
        whose activations may not fit one device, sharded over groups inside a node (``colocated-sync``, and
        ``separate-sync``'s trainer pool with its generators whole or sharded alike). Each is scored like
        any plan, so it is chosen only where it fits when N = 1 does not, or runs faster (a larger
        micro-batch, no checkpointing) despite its all-to-alls."""
        if self.workload.trainer_mode != "lora":
            return []
        cost = self.costs.for_rank(0)
        latent = cost.meta.get("latent_shape")
        if latent is None or len(latent) != 4:
            return []
        per_node = max(group.devices_per_node for group in self.profile.nodes)
        return sequence_degrees(cost.model, latent, per_node)

    def _overlap_sub_batch_sizes(self, plan: RunPlan) -> list[int | None]:
        """Sub-batch sizes of ``colocated-overlap`` worth simulating: the workload's (None; one group per
        sub-batch when ``samples_per_forward`` is unset) and G, 2G, 4G samples, each only while the next
        smaller one still cuts the largest rank's share. Smaller sub-batches overlap more scoring with
        generation, larger ones generate faster per sample; one that covers the share is the schedule
        without overlap (what the memory fit chose before it kept the plan's sub-batch)."""
        w = self.workload
        g = w.group_size
        default = (max(1, w.samples_per_forward // g) if w.samples_per_forward else 1) * g
        try:
            shares = plan.colocated_shares(w, self.profile.relative_speeds)
        except ValueError:  # the runtime cannot cut this batch: score() rejects the plan with the reason
            return [None]
        largest = max(share.samples for share in shares)
        sizes = [k * g for k in (1, 2, 4) if k == 1 or k * g // 2 < largest]
        return [None, *(size for size in sizes if size != default)]

    def best_of(self, plans: Iterable[RunPlan]) -> PlanScore | None:
        scores = [s for s in (self.score(p) for p in plans) if s is not None]
        return max(scores, key=lambda s: s.samples_per_s) if scores else None

    def baselines(self, max_staleness: int = 0) -> dict[str, PlanScore | None]:
        """The baselines of docs/design.md §4 on this profile, each tuned over its own knobs, keyed by a
        row label: the four systems at staleness 0, ``separate-async s=1`` when ``max_staleness`` ≥ 1, and
        on a heterogeneous profile the colocated systems a second time with work proportional to GPU
        speed (``… speed-split``). None: no plan of it fits in memory."""
        out: dict[str, PlanScore | None] = {}
        for system in BASELINES:
            out[system] = self.best_of(self.baseline_plans(system))
        if max_staleness >= 1 and self.world >= 2:
            out["separate-async s=1"] = self.best_of(self.baseline_plans("separate-async", 1))
        if self.heterogeneous:
            for system in COLOCATED_SYSTEMS:
                # the fair split (full-size micro-batches, uneven counts) where the backend allows it;
                # full fine-tuning's FSDP2 runs in lockstep (digenrl/data/rank_shares.py)
                split = "speed-lockstep" if self.workload.trainer_mode == "full" else "speed"
                out[f"{system} speed-split"] = self.best_of(self.baseline_plans(system, work_split=split))
        return out

    # ------------------------------------------------------------------ DigenRL's plan space
    def search(
        self,
        *,
        max_staleness: int = 0,
        trainer_counts: Sequence[int] | None = None,
        fragment_groups: Sequence[int] | None = None,
        fragment_samples: Sequence[int] | None = None,
        max_stages: int = 8,
        tag_options: Sequence[bool] = (False, True),
        include_baselines: bool = True,
        refine: int = 1,
        template: RunPlan | None = None,
        prune: bool = True,
    ) -> PlannerResult:
        """The best and runner-up plans of DigenRL's plan space at staleness ≤ ``max_staleness`` (module
        docstring). ``trainer_counts`` restricts the splits (and then leaves the colocated plans out);
        ``include_baselines=False`` searches the mechanisms' plans alone. ``prune=False`` simulates every
        plan (the reference the pruning is tested against)."""
        template = template or RunPlan("digenrl")
        if template.system != "digenrl":
            raise ValueError(f"template.system must be 'digenrl', got {template.system!r}")
        world, w = self.world, self.workload
        if world < 2 and not include_baselines:
            raise ValueError(f"profile '{self.profile.name}' has {world} device(s); separate pools need 2")
        counts = list(trainer_counts) if trainer_counts is not None else list(range(1, world))
        bad = [n for n in counts if not 1 <= n < world]
        if bad:
            raise ValueError(
                f"trainer_counts {bad} must be in [1, {world - 1}] for profile '{self.profile.name}'"
            )
        groups = sorted(set(fragment_groups or fragment_options(w.prompts_per_iteration)))
        if not groups or min(groups) < 1:
            raise ValueError(f"fragment_groups must be positive ints, got {fragment_groups}")
        subs = sub_group_options(w.group_size) if fragment_samples is None else list(fragment_samples)
        if any(s < 1 or w.samples_per_iteration % s for s in subs):
            raise ValueError(
                f"fragment_samples must divide the batch of {w.samples_per_iteration}, got {subs}"
            )
        fragments = sorted({f * w.group_size for f in groups} | set(subs))  # fragment sizes in samples
        scores: list[PlanScore] = []
        if include_baselines:
            if trainer_counts is None:
                for score in self.baselines(max_staleness).values():
                    if score is not None and score.staleness <= max_staleness:
                        scores.append(score)
            else:
                for system in ("separate-sync", "separate-async"):
                    for s in range(0, min(max_staleness, 1) + 1) if system == "separate-async" else (0,):
                        plans = [p for p in self.baseline_plans(system, s) if p.trainers in counts]
                        scores += [x for x in (self.score(p) for p in plans) if x is not None]
        tcss_options = (False, True) if max_staleness >= 1 else (False,)
        bounds = {
            n: throughput_bound(self.costs, w, n, world - n, fragments, any(tag_options), max_staleness >= 1)
            for n in counts
        }
        skipped: list[int] = []
        mechanism_scores: list[PlanScore] = []
        for visited, trainers in enumerate(sorted(counts, key=lambda n: -bounds[n]), 1):
            ranked = sorted(scores + mechanism_scores, key=lambda s: -s.samples_per_s)
            if prune and len(ranked) >= 2 and bounds[trainers] <= ranked[1].samples_per_s:
                skipped.append(trainers)
                continue
            generators = world - trainers
            stages = [s for s in _divisors(generators) if s <= min(max_stages, w.num_steps)]
            for s in stages:
                for f in fragments:
                    for tcss in tcss_options:
                        for tag in tag_options:
                            plan = template.with_(
                                trainers=trainers,
                                generators=generators,
                                **fragment_plan_knobs(f, w.group_size),
                                tsp_stages=s,
                                tag=tag,
                                tag_policy="auto",
                                tag_max_fragments=0,
                                tcss=tcss,
                            )
                            if prune and self._beaten(plan, scores + mechanism_scores):
                                continue
                            score = self.score(plan)
                            if score is not None:
                                mechanism_scores.append(score)
            best = max((x.samples_per_s for x in scores + mechanism_scores), default=0.0)
            self._progress(
                f"staleness ≤ {max_staleness}: split {trainers} trainers : {generators} generators searched "
                f"({visited} of {len(counts)} splits, {len(skipped)} pruned by the bound), best {best:.4g} "
                "samples/s"
            )
        mechanism_scores += self._refine(mechanism_scores, refine)
        scores += mechanism_scores
        if not scores:
            reasons = "; ".join(f"{k}: {v}" for k, v in list(self.rejected.items())[:3])
            raise ValueError(f"no candidate plan can run on '{self.profile.name}' ({reasons})")
        unique = {score.plan: score for score in scores}  # TAG searched down to 0 = the TAG-off plan
        ranked = sorted(unique.values(), key=lambda s: (-s.samples_per_s, _complexity(s.plan)))
        return PlannerResult(
            best=ranked[0],
            runner_up=ranked[1] if len(ranked) > 1 else None,
            evaluated=ranked,
            skipped_splits=sorted(skipped),
            rejected=dict(self.rejected),
        )

    def _beaten(self, plan: RunPlan, scores: list[PlanScore]) -> bool:
        """Whether ``plan``'s bound cannot beat the current runner-up (then simulating it cannot change the
        best two)."""
        if len(scores) < 2:
            return False
        second = sorted((s.samples_per_s for s in scores), reverse=True)[1]
        return plan_bound(self.costs, self.workload, plan) <= second

    def _refine(self, scores: list[PlanScore], top: int) -> list[PlanScore]:
        """One knob at a time on the ``top`` best mechanism plans (:data:`REFINEMENTS`); keeps every score."""
        out: list[PlanScore] = []
        best = sorted({s.plan: s for s in scores}.values(), key=lambda s: -s.samples_per_s)[:top]
        for score in best:
            current = score
            for name, value in REFINEMENTS:
                if getattr(current.plan, name) == value:
                    continue
                base = (
                    current.plan.with_(tag_policy="auto", tag_max_fragments=0)
                    if current.plan.tag
                    else current.plan
                )
                trial = self.score(base.with_(**{name: value}))
                if trial is not None:
                    out.append(trial)
                    if trial.samples_per_s > current.samples_per_s * (1 + 1e-9):
                        current = trial
        return out


def _complexity(plan: RunPlan) -> tuple[int, ...]:
    """Tie-break equal throughput toward the simpler plan: a baseline, no TAG, no TCSS, fewer stages, bigger
    fragments (whole groups before split ones)."""
    return (
        int(plan.system == "digenrl"),
        int(plan.tag),
        int(plan.tcss),
        plan.tsp_stages,
        int(plan.fragment_samples > 0),  # whole groups before split ones
        -plan.fragment_groups,
        -plan.fragment_samples,
    )


def search_plans(
    profile: HardwareProfile | str,
    costs: CostModel | Mapping[str, CostModel] | DeviceCosts,
    workload: Workload,
    *,
    max_staleness: int = 0,
    planning_iterations: int = 6,
    **options,
) -> PlannerResult:
    """Best and runner-up plans of DigenRL's plan space (:meth:`Planner.search`; ``options`` are its
    keyword arguments)."""
    planner = Planner(profile, costs, workload, planning_iterations=planning_iterations)
    return planner.search(max_staleness=max_staleness, **options)


def predict_baselines(
    profile: HardwareProfile | str,
    costs: CostModel | Mapping[str, CostModel] | DeviceCosts,
    workload: Workload,
    *,
    max_staleness: int = 1,
    planning_iterations: int = 6,
) -> list[PlanScore]:
    """The baselines of docs/design.md §4 on the same profile, each tuned over its own knobs (pool split,
    sub-batches, staleness, memory knobs); best first (:meth:`Planner.baselines`)."""
    planner = Planner(profile, costs, workload, planning_iterations=planning_iterations)
    scores = [s for s in planner.baselines(max_staleness).values() if s is not None]
    return sorted(scores, key=lambda s: -s.samples_per_s)
