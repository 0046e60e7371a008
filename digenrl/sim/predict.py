"""The one question the runtime asks the simulator: TAG's ``auto`` budget (docs/design.md §3 (TAG)).

A trainer rank of a ``digenrl`` run with ``tag.policy=auto`` turns what it has measured into a
:class:`~digenrl.costs.CostModel` (:mod:`digenrl.tag.policy`) and asks: how long does a steady iteration of
this run's own plan (:meth:`~digenrl.plan.RunPlan.from_config`) take with a helper budget of 0, 1, 2, …
fragments per trainer rank, and which budget is best? The answer is the simulator's — the model the planner
and the tables use — with their budget search (:func:`~digenrl.rules.search_tag_budget`).

``tag/`` never imports this module: the system hands a :class:`SimPredictor` to TAG's policy
(:class:`digenrl.tag.policy.TagPredictor`), and only when ``tag.policy=auto``.
"""

from __future__ import annotations

from dataclasses import dataclass

from digenrl.config import Config
from digenrl.costs import CostModel, DeviceCosts
from digenrl.plan import RunPlan
from digenrl.plan.workload import Workload
from digenrl.rules import TagPrediction, search_tag_budget, tag_budget_limit
from digenrl.runtime.hardware.profiles import HardwareProfile
from digenrl.sim.simulator import SimResult, simulate


def run_workload(cfg: Config) -> Workload:
    """What an iteration of the run computes, over a short simulated run (1 warm-up, 1 cool-down)."""
    return Workload.from_config(cfg, iterations=4, warmup_iterations=1, cooldown_iterations=1)


@dataclass(frozen=True)
class SimPredictor:
    """Predicts a run's steady iteration by helper budget: its ``plan`` on ``profile`` for ``workload``."""

    plan: RunPlan
    profile: HardwareProfile
    workload: Workload

    @classmethod
    def for_run(cls, cfg: Config, profile: HardwareProfile, plan: RunPlan | None = None) -> SimPredictor:
        """``cfg``'s run on ``profile``: its ``plan`` (a system's own; default the config's on the whole
        profile) with the config's workload."""
        return cls(plan or RunPlan.from_config(cfg, profile), profile, run_workload(cfg))

    @property
    def cfg_pass(self) -> bool:
        return self.workload.cfg

    @property
    def num_steps(self) -> int:
        return self.workload.num_steps

    def plan_with(self, budget: int) -> RunPlan:
        """The run's plan with helper ``budget`` per trainer rank (``park_grads`` off: a switch measured with
        ``tag.park_grads`` already holds the parking)."""
        return self.plan.with_tag_budget(budget).with_(park_grads=False)

    def simulate(self, costs: CostModel, budget: int) -> SimResult:
        """``costs`` were measured on the device type ``costs.device`` of the profile; other types are
        scaled by their ``relative_speed`` (:class:`~digenrl.costs.DeviceCosts`)."""
        device_costs = DeviceCosts(self.profile, costs, reference_type=costs.device)
        return simulate(self.profile, device_costs, self.workload, self.plan_with(budget))

    def iteration_s(self, costs: CostModel, budget: int) -> float:
        """Predicted steady iteration seconds of the run with helper ``budget`` per trainer rank."""
        return self.simulate(costs, budget).steady_iteration_s

    def best_budget(self, costs: CostModel, num_fragments: int) -> TagPrediction:
        """TAG's budget for the run: the simulator's search up to ``tag.max_fragments`` (0: a trainer's
        share of the ``num_fragments`` fragments)."""
        limit = tag_budget_limit(num_fragments, self.plan.trainers, self.plan.tag_max_fragments)
        best, tried = search_tag_budget(limit, lambda b: self.simulate(costs, b))
        assert best is not None  # a simulation either runs or raises
        return TagPrediction(
            best.plan.tag_budget(num_fragments),
            {b: result.steady_iteration_s for b, result in tried.items() if result is not None},
        )
