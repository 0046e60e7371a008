"""TAG's budget search is one rule (digenrl/rules/schedule.py search_tag_budget): the runtime's
``tag.policy=auto`` (digenrl/sim/predict.py SimPredictor, what digenrl/tag/policy.py is handed), the
simulator and the planner all stop after two budgets in a row that do not improve, ties going to the
smaller budget."""

from __future__ import annotations

import random
from dataclasses import dataclass

from digenrl.config import load_config
from digenrl.costs import DeviceCosts
from digenrl.rules import MAX_TAG_BUDGET, search_tag_budget, tag_budget_limit
from digenrl.runtime.hardware.profiles import load_profile
from digenrl.sim.predict import SimPredictor
from digenrl.sim.simulator import simulate
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
    predictor = SimPredictor.for_run(cfg, profile)
    plan, workload = predictor.plan, predictor.workload
    assert plan.tag and plan.tag_policy == "auto"  # the config's TAG (on by default)
    fragments = plan.num_fragments(workload)
    runtime = predictor.best_budget(costs, fragments)
    searched = simulate(profile, DeviceCosts(profile, costs), workload, plan)
    assert searched.plan.tag_budget(fragments) == runtime.budget
    assert runtime.iteration_s[runtime.budget] == searched.steady_iteration_s


def test_tag_leaves_the_generators_their_share_in_every_iteration():
    """Issue 24's race: with a large weight sync, trainers that are not the sync source start iteration
    k+1 at once; before the rule they claimed every fragment while the generators waited for θ_{k+1}. Now a
    helper claims nothing before the generators hold θ_k, and only what they cannot finish sooner, so every
    generator makes fragments in every iteration (the runtime's rule, digenrl/gap/helper_share.py)."""
    from digenrl.plan import RunPlan, Workload

    profile = load_profile("h200-8")
    costs = toy_costs(step=0.05, unit=0.01, optimizer=0.05, sync_bytes=20 << 30)
    w = Workload(prompts_per_iteration=8, group_size=2, num_steps=8, train_steps=4, cfg=False, iterations=4)
    plan = RunPlan("digenrl", trainers=4, generators=4, tag=True, tag_policy="always", tag_max_fragments=4)
    result = simulate(profile, DeviceCosts(profile, costs), w, plan)
    made = {(s["rank"], s["iteration"]) for s in result.spans if s["phase"] == "generate"}
    assert {(g, k) for g in range(4, 8) for k in range(4)} <= made
    assert any(s["extra"].get("helper") for s in result.spans if s["phase"] == "generate")
