"""Replay a schedule on a hardware profile from measured per-operation costs (docs/design.md §5).

    from digenrl.costs import CostModel
    from digenrl.plan import RunPlan
    from digenrl.plan import Workload
    from digenrl.sim import simulate
    costs = CostModel.load("experiments/results/costs/h200-sd3.5-medium.json")
    work = Workload(prompts_per_iteration=32, group_size=16, num_steps=10, train_steps=9, cfg=True)
    plan = RunPlan("digenrl", trainers=2, generators=6, fragment_groups=4, tsp_stages=2)
    result = simulate("h200-8", costs, work, plan)
    print(result.describe()); result.write_events("runs/sim_digenrl")   # then summarize_events(...)

The result carries the spans in the real runs' record format, so ``summarize_events``,
``merge_chrome_trace`` and the figure code work unchanged on a simulated run.

Throughput definition (docs/design.md §5: trained samples per second in steady state): iteration k *ends* when
its optimizer step ends; ``iteration_s[k]`` is the time between the ends of k−1 and k (iteration 0 is
measured from t = 0), so overlapping schedules (TCSS, async) are measured by the rate at which they
commit steps. Steady state = iterations ``[w, n − c)`` (w warm-up, c cool-down, see
:class:`~digenrl.plan.workload.Workload`): ``samples_per_s = B · (n − w − c) / (end[n−c−1] − end[w−1])``.
Busy fractions and busy GPU-seconds cover the same window; phase seconds sum spans tagged with steady
iterations.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from digenrl.costs.cost_model import CostModel
from digenrl.costs.device_costs import DeviceCosts
from digenrl.plan import RunPlan
from digenrl.plan.workload import Workload
from digenrl.rules import search_tag_budget, tag_budget_limit
from digenrl.runtime.hardware.profiles import HardwareProfile, load_profile
from digenrl.runtime.observe.event_summary import union_length
from digenrl.runtime.observe.span_phases import is_work_phase
from digenrl.sim.cluster import SimCluster
from digenrl.sim.schedules import SCHEDULES
from digenrl.sim.span_log import SpanLog


@dataclass
class SimResult:
    """What a simulated run predicts. Times in seconds; ``spans`` are real-format span records."""

    plan: RunPlan
    workload: Workload
    iteration_end_s: list[float]
    iteration_s: list[float]
    samples_per_s: float
    busy_fraction: dict[str, float]
    phase_seconds: dict[str, dict[str, float]]
    busy_gpu_s: float
    makespan_s: float
    log: SpanLog
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def bubble_free_samples_per_s(self) -> float:
        """Samples/s of a perfect schedule of the same work: the steady window's busy device-seconds spread
        evenly over every rank (docs/design.md §5, the bubble-free bound)."""
        ranks = len(self.log.roles)
        samples = self.workload.samples_per_iteration * len(self.workload.steady_iterations)
        return samples * ranks / self.busy_gpu_s if self.busy_gpu_s > 0 else math.inf

    @property
    def spans(self) -> list[dict[str, Any]]:
        return self.log.spans

    @property
    def steady_iteration_s(self) -> float:
        """Mean steady-state iteration time (warm-up excluded)."""
        return self.workload.samples_per_iteration / self.samples_per_s

    def records(self) -> list[dict[str, Any]]:
        """Every record (meta lines, spans, iteration markers) as the real per-rank logs hold them."""
        return self.log.records()

    def write_events(self, out_dir: str | Path) -> Path:
        """Write ``out_dir/events/rank<r>.jsonl``; ``summarize_events(out_dir)`` then reads it."""
        return self.log.write(out_dir)

    def results_row(self, model: str, experiment: str = "main") -> dict[str, Any]:
        """A row of the figures' results table (``paper_figures/README.md``), marked ``simulated``."""
        world = len(self.log.roles)
        separate = not self.plan.colocated
        return {
            "experiment": experiment,
            "model": model,
            "system": self.plan.system,
            "gpus": world,
            "generators": self.plan.generators if separate else "",
            "trainers": self.plan.trainers if separate else "",
            "samples_per_s": self.samples_per_s,
            "source": "simulated",
        }

    def describe(self) -> str:
        busy = ", ".join(f"{role} {100 * f:.1f}%" for role, f in sorted(self.busy_fraction.items()))
        lines = [
            f"{self.plan.describe()}",
            f"  {self.samples_per_s:.4g} samples/s steady state, {self.steady_iteration_s:.4g} s/iteration "
            f"(B = {self.workload.samples_per_iteration}, staleness {self.plan.staleness}); busy: {busy}; "
            f"bubble-free bound {self.bubble_free_samples_per_s:.4g} samples/s",
        ]
        for key, value in self.info.items():
            if isinstance(value, list):
                lines.extend(f"  {key}: {item}" for item in value)
            else:
                lines.append(f"  {key}: {value}")
        return "\n".join(lines)


def simulate(
    profile: HardwareProfile | str,
    costs: CostModel | Mapping[str, CostModel] | DeviceCosts,
    workload: Workload,
    plan: RunPlan,
) -> SimResult:
    """Simulate ``plan`` for ``workload`` on ``profile`` (``tag.policy=auto`` searches the budget, up to
    ``tag_max_fragments`` when set: the best predicted throughput wins, ties go to the smaller budget, so
    TAG is inserted only where the cost model predicts a shorter makespan).

    Not modelled, so refused rather than priced as something else: ``asynchrony.max_inflight`` > 1. A
    scorer pool (``pools.scorers``) is priced as scoring on the generators' last stage and a shared device
    (``runtime.share_device``) as one device per rank, each noted in :attr:`SimResult.info`."""
    profile = load_profile(profile) if isinstance(profile, str) else profile
    device_costs = costs if isinstance(costs, DeviceCosts) else DeviceCosts(profile, costs)
    workload = plan.effective_workload(workload)
    plan.check(profile.world_size, workload, profile.relative_speeds, profile.node_of)
    if plan.system == "separate-async" and plan.max_inflight != 1:
        raise ValueError(
            f"the simulator models separate-async with max_inflight 1 (UniRL's), not {plan.max_inflight}"
        )
    if plan.searches_tag_budget:
        limit = tag_budget_limit(plan.num_fragments(workload), plan.trainers, plan.tag_max_fragments)
        best, _ = search_tag_budget(
            limit, lambda b: _simulate_once(profile, device_costs, workload, plan.with_tag_budget(b))
        )
        assert best is not None  # a simulation either runs or raises
        best.info["tag_budget"] = (
            f"searched from 0, chose {best.plan.tag_budget(plan.num_fragments(workload))}"
        )
        return _noted(best, plan)
    return _noted(_simulate_once(profile, device_costs, workload, plan), plan)


def _noted(result: SimResult, plan: RunPlan) -> SimResult:
    """``result`` with what the simulator priced differently from ``plan`` named in its ``info``."""
    if plan.scorers:
        result.info["scorers"] = (
            f"pools.scorers={plan.scorers} not modelled: scoring priced on the generators' last stage"
        )
    if plan.share_device:
        result.info["share_device"] = (
            "runtime.share_device=true not modelled: the ranks share one GPU, priced as one device each"
        )
    return result


def _roles(profile: HardwareProfile, plan: RunPlan) -> dict[int, str]:
    world = profile.world_size
    if plan.colocated:
        return dict.fromkeys(range(world), "colocated")
    roles = dict.fromkeys(plan.trainer_ranks(world), "trainer")
    roles.update(dict.fromkeys(plan.generator_ranks(world), "generator"))
    return roles


def sequence_groups(world: int, plan: RunPlan) -> dict[int, tuple[int, ...]]:
    """Every rank's Ulysses group: N consecutive ranks of its pool (the trainer pool or the colocated ranks
    with ``plan.sequence_parallel``, the generator pool with ``plan.generator_sequence_parallel``), as
    digenrl/runtime/comm/sequence_groups.py ``build_sequence_groups`` forms them."""
    pools = [(plan.trainer_ranks(world), plan.sequence_parallel)]
    if not plan.colocated:
        pools.append((plan.generator_ranks(world), plan.generator_sequence_parallel))
    out = {}
    for ranks, n in pools:
        for first in range(0, len(ranks), n):
            group = ranks[first : first + n]
            out |= dict.fromkeys(group, group)
    return out


def _simulate_once(
    profile: HardwareProfile, costs: DeviceCosts, workload: Workload, plan: RunPlan
) -> SimResult:
    cluster = SimCluster(profile, costs, workload, _roles(profile, plan))
    cluster.trainer_sharding = plan.trainer_sharding
    cluster.sequence_groups = sequence_groups(profile.world_size, plan)
    info = SCHEDULES[plan.system](cluster, plan) or {}
    makespan = cluster.sim.run()
    missing = [k for k in range(workload.iterations) if k not in cluster.iteration_end]
    if missing:
        raise RuntimeError(f"{plan.describe()}: iterations {missing} never finished their optimizer step")
    ends = [cluster.iteration_end[k] for k in range(workload.iterations)]
    iteration_s = [end - (ends[k - 1] if k else 0.0) for k, end in enumerate(ends)]
    steady = workload.steady_iterations
    window_start = ends[steady.start - 1] if steady.start else 0.0
    window_end = ends[steady.stop - 1]
    window = window_end - window_start
    samples_per_s = workload.samples_per_iteration * len(steady) / window if window > 0 else math.inf
    busy_fraction, busy_gpu_s = _busy(cluster.log, window_start, window_end)
    phase_seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for span in cluster.log.spans:
        if span["iteration"] in steady:
            phase_seconds[span["role"]][span["phase"]] += span["t_end"] - span["t_start"]
    return SimResult(
        plan=plan,
        workload=workload,
        iteration_end_s=ends,
        iteration_s=iteration_s,
        samples_per_s=samples_per_s,
        busy_fraction=busy_fraction,
        phase_seconds={role: dict(phases) for role, phases in phase_seconds.items()},
        busy_gpu_s=busy_gpu_s,
        makespan_s=makespan,
        log=cluster.log,
        info=dict(info),
    )


def _busy(log: SpanLog, start: float, end: float) -> tuple[dict[str, float], float]:
    """Per-pool busy fraction (union of work spans per rank, clipped to [start, end]) and busy GPU-s."""
    intervals: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for span in log.spans:
        if is_work_phase(span["phase"]):
            intervals[span["rank"]].append((span["t_start"], span["t_end"]))
    busy = {rank: union_length(intervals.get(rank, []), start, end) for rank in log.roles}
    by_role: dict[str, list[int]] = defaultdict(list)
    for rank, role in log.roles.items():
        by_role[role].append(rank)
    window = end - start
    fraction = {
        role: (sum(busy[r] for r in ranks) / (len(ranks) * window) if window > 0 else 0.0)
        for role, ranks in by_role.items()
    }
    return fraction, sum(busy.values())


def compute_seconds(
    spans: list[dict[str, Any]], phases: tuple[str, ...] = ("generate", "score", "train")
) -> float:
    """Summed duration of the given compute phases over all ranks: the work a schedule performed,
    independent of when (the conservation check between schedules of one workload)."""
    return sum(s["t_end"] - s["t_start"] for s in spans if s["phase"] in phases)
