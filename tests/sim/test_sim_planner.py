"""The planner: the pruned search finds what the exhaustive one finds; the bound really bounds."""

from __future__ import annotations

import random

from digenrl.runtime.profiles import load_profile
from digenrl.sim.device_costs import DeviceCosts
from digenrl.sim.planner import fragment_options, predict_baselines, search_plans, throughput_bound
from digenrl.sim.workload import Workload
from tests.sim.toy_costs import toy_costs


def _setup():
    rng = random.Random()
    costs = toy_costs(
        step=rng.uniform(0.01, 0.1),
        decode=rng.uniform(0, 0.05),
        unit=rng.uniform(0.005, 0.1),
        optimizer=0.02,
        switch=0.01,
        fragment_bytes=10**6,
        unit_bytes=3 * 10**5,
        sync_bytes=10**6,
    )
    workload = Workload(
        prompts_per_iteration=8, group_size=2, num_steps=4, train_steps=3, cfg=False, micro_batch_size=2
    )
    return load_profile("cpu-4"), costs, workload


def test_pruned_search_matches_exhaustive_and_bound_holds():
    profile, costs, workload = _setup()
    result = search_plans(profile, costs, workload, allow_tcss=True)
    assert result.best.samples_per_s >= result.runner_up.samples_per_s
    exhaustive = [
        search_plans(profile, costs, workload, allow_tcss=True, trainer_counts=[n]).best
        for n in range(1, profile.world_size)
    ]
    assert result.best.samples_per_s == max(s.samples_per_s for s in exhaustive)
    device_costs = DeviceCosts(profile, costs)
    fragments = fragment_options(workload.prompts_per_iteration)
    for score in result.evaluated:
        plan = score.plan
        bound = throughput_bound(device_costs, workload, plan.trainers, plan.generators, fragments, tag=True)
        assert score.samples_per_s <= bound * (1 + 1e-9), plan.describe()
    assert all(not s.plan.tcss for s in search_plans(profile, costs, workload).evaluated)


def test_baselines_are_tuned_and_ranked():
    profile, costs, workload = _setup()
    scores = predict_baselines(profile, costs, workload)
    assert [s.samples_per_s for s in scores] == sorted((s.samples_per_s for s in scores), reverse=True)
    assert {s.plan.system for s in scores} == {
        "colocated-sync",
        "colocated-overlap",
        "separate-sync",
        "separate-async",
    }
