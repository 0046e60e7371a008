"""The one question the runtime asks the simulator: TAG's ``auto`` budget (docs/design.md §3 (TAG)).

A trainer rank of a ``digenrl`` run with ``tag.policy=auto`` turns what it has measured into a
:class:`~digenrl.costs.CostModel` (:mod:`digenrl.tag.policy`) and asks: how long does a steady iteration of
this run's own schedule take with a helper budget of 0, 1, 2, … fragments per trainer rank, and which
budget is best? The answer is the simulator's — the model the planner and the tables use — with their budget
search (:func:`~digenrl.sim.simulator.search_tag_budget`). This module is all of the simulator that the
runtime imports.
"""

from __future__ import annotations

from dataclasses import dataclass

from digenrl.config import Config
from digenrl.costs import CostModel, DeviceCosts
from digenrl.runtime.profiles import HardwareProfile
from digenrl.sim.schedule_plan import SchedulePlan
from digenrl.sim.simulator import SimResult, search_tag_budget, simulate, tag_budget_limit
from digenrl.sim.workload import Workload


@dataclass(frozen=True)
class TagPrediction:
    """The best helper budget and the predicted steady iteration seconds of every budget tried."""

    budget: int
    iteration_s: dict[int, float]


def run_workload(cfg: Config) -> Workload:
    """What an iteration of the run computes, over a short simulated run (1 warm-up, 1 cool-down)."""
    return Workload.from_config(cfg, iterations=4, warmup_iterations=1, cooldown_iterations=1)


def run_plan(cfg: Config, *, trainers: int, generators: int, tag_budget: int) -> SchedulePlan:
    """The run's ``digenrl`` schedule as the simulator's plan, with helper ``tag_budget`` per trainer rank
    (``park_grads`` stays False: a switch measured with ``tag.park_grads`` already holds the parking)."""
    return SchedulePlan(
        "digenrl",
        trainers=trainers,
        generators=generators,
        transport="buffered",
        gap=cfg.gap.enabled,
        fragment_assignment=cfg.gap.assignment,
        train_order=cfg.gap.train_order,
        fragment_groups=cfg.gap.fragment_groups,
        fragment_samples=cfg.gap.fragment_samples,
        tsp_stages=cfg.tsp.stages,
        tag=tag_budget > 0,
        tag_budget=tag_budget,
        tcss=cfg.tcss.enabled,
        tcss_switch=cfg.tcss.switch,
    )


def _simulate(
    cfg: Config, profile: HardwareProfile, costs: CostModel, trainers: int, generators: int, budget: int
) -> SimResult:
    """``costs`` were measured on the device type ``costs.device`` of ``profile``; other types are scaled by
    their ``relative_speed`` (:class:`~digenrl.costs.DeviceCosts`)."""
    device_costs = DeviceCosts(profile, costs, reference_type=costs.device)
    plan = run_plan(cfg, trainers=trainers, generators=generators, tag_budget=budget)
    return simulate(profile, device_costs, run_workload(cfg), plan)


def iteration_s(
    cfg: Config, profile: HardwareProfile, costs: CostModel, *, trainers: int, generators: int, budget: int
) -> float:
    """Predicted steady iteration seconds of the run with helper ``budget`` per trainer rank."""
    return _simulate(cfg, profile, costs, trainers, generators, budget).steady_iteration_s


def best_tag_budget(
    cfg: Config,
    profile: HardwareProfile,
    costs: CostModel,
    *,
    trainers: int,
    generators: int,
    num_fragments: int,
) -> TagPrediction:
    """TAG's budget for the run: the simulator's search (:func:`search_tag_budget`) up to
    ``tag.max_fragments`` (0: a trainer's share of the ``num_fragments`` fragments)."""
    limit = tag_budget_limit(num_fragments, trainers, cfg.tag.max_fragments)
    best, tried = search_tag_budget(limit, lambda b: _simulate(cfg, profile, costs, trainers, generators, b))
    assert best is not None  # a simulation either runs or raises
    return TagPrediction(
        best.plan.tag_budget or 0,
        {b: result.steady_iteration_s for b, result in tried.items() if result is not None},
    )
