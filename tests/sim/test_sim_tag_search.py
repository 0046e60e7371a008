"""TAG's budget search is one rule (digenrl/sim/simulator.py search_tag_budget): the runtime's
``tag.policy=auto`` (digenrl/sim/predict.py, what digenrl/tag/policy.py asks), the simulator and the planner
all stop after two budgets in a row that do not improve, ties going to the smaller budget."""

from __future__ import annotations

import random
from dataclasses import dataclass

from digenrl.config import load_config
from digenrl.costs import DeviceCosts
from digenrl.runtime.profiles import load_profile
from digenrl.sim.predict import best_tag_budget, run_plan, run_workload
from digenrl.sim.simulator import MAX_TAG_BUDGET, search_tag_budget, simulate, tag_budget_limit
from tests.sim.toy_costs import toy_costs
from tests.systems.launcher import TINY


@dataclass(frozen=True)
class Rate:
    samples_per_s: float


def test_the_search_stops_after_two_budgets_that_do_not_improve():
    rates = {0: 1.0, 1: 1.5, 2: 1.5, 3: 1.2, 4: 9.0, 5: 9.0}  # 4 would win, but 2 and 3 did not improve
    tried: list[int] = []

    def run(budget: int) -> Rate:
        tried.append(budget)
        return Rate(rates[budget])

    best, results = search_tag_budget(5, run)
    assert best == Rate(1.5) and tried == [0, 1, 2, 3] and sorted(results) == tried  # the tie: budget 1
    assert search_tag_budget(5, lambda budget: None) == (None, {0: None})


def test_the_limit_is_a_trainers_share_or_tag_max_fragments():
    fragments, trainers = random.randint(1, 40), random.randint(1, 5)
    assert tag_budget_limit(fragments, trainers) == min(-(-fragments // trainers), MAX_TAG_BUDGET)
    assert tag_budget_limit(fragments, trainers, max_fragments=3) == min(3, fragments)


def test_the_runtime_and_the_simulator_choose_the_same_budget():
    """What a trainer rank decides with tag.policy=auto is the budget the simulator's own search picks."""
    profile = load_profile("cpu-4")
    unit = random.choice([0.002, 0.01, 0.05])
    costs = toy_costs(step=0.1, unit=unit, optimizer=0.05, device=profile.device_type(0).name)
    cfg = load_config(TINY, ["system=digenrl", "profile=cpu-4", "pools.trainers=2", "pools.generators=2"])
    plan = run_plan(cfg, trainers=2, generators=2, tag_budget=0)
    workload = run_workload(cfg)
    runtime = best_tag_budget(
        cfg, profile, costs, trainers=2, generators=2, num_fragments=plan.num_fragments(workload)
    )
    searched = simulate(profile, DeviceCosts(profile, costs), workload, plan.with_(tag=True, tag_budget=None))
    assert searched.plan.tag_budget == runtime.budget
    assert runtime.iteration_s[runtime.budget] == searched.steady_iteration_s
