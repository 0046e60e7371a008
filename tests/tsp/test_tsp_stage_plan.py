"""plan_stages: exact min-max contiguous partition, checked against brute force."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from digenrl.tsp.stage_plan import StagePlan, plan_stages


def _brute_force(costs: list[list[float]], extra: float) -> float:
    """min over every placement of S−1 cuts of the max stage time (float64, math.fsum per stage)."""
    stages, steps = len(costs), len(costs[0])
    best = math.inf
    for cuts in itertools.combinations(range(1, steps), stages - 1):
        bounds = (0, *cuts, steps)
        times = [
            math.fsum(costs[s][bounds[s] : bounds[s + 1]]) + (extra if s == stages - 1 else 0.0)
            for s in range(stages)
        ]
        best = min(best, max(times))
    return best


def test_dp_is_optimal_against_brute_force():
    rng = random.Random(2027)
    for _ in range(200):
        stages = rng.randint(1, 4)
        steps = rng.randint(stages, 9)
        costs = [[rng.uniform(0.01, 1.0) for _ in range(steps)] for _ in range(stages)]
        extra = rng.choice([0.0, rng.uniform(0, 2)])
        plan = plan_stages(steps, stages, costs, last_stage_extra_s=extra)
        assert plan.bottleneck_s == pytest.approx(_brute_force(costs, extra), rel=1e-12)
        # the reported stage times are those of the returned boundaries
        for s in range(stages):
            lo, hi = plan.boundaries[s], plan.boundaries[s + 1]
            expected = math.fsum(costs[s][lo:hi]) + (extra if s == stages - 1 else 0.0)
            assert plan.stage_times[s] == pytest.approx(expected, rel=1e-12)
        assert plan.boundaries[0] == 0 and plan.boundaries[-1] == steps
        assert all(lo < hi for lo, hi in itertools.pairwise(plan.boundaries))


def test_uniform_costs_split_evenly_and_decode_shifts_steps_off_the_last_stage():
    rng = random.Random(2028)
    stages = rng.randint(2, 5)
    per_stage = rng.randint(2, 6)
    plan = plan_stages(stages * per_stage, stages, 0.25)
    assert [len(plan.steps(s)) for s in range(stages)] == [per_stage] * stages
    assert plan.imbalance == pytest.approx(1.0)
    heavy = plan_stages(stages * per_stage, stages, 0.25, last_stage_extra_s=0.25 * per_stage)
    assert len(heavy.steps(stages - 1)) < per_stage


def test_slower_device_gets_fewer_steps():
    plan = plan_stages(12, 2, [1.0, 2.0])  # stage 1's device is twice as slow per step
    assert plan.boundaries == (0, 8, 12)
    assert plan.stage_times == (8.0, 8.0)
    assert plan.stage_of_step(7) == 0 and plan.stage_of_step(8) == 1
    assert "steps [0, 8)" in plan.describe() and "imbalance 1.000" in plan.describe()


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_steps"):
        plan_stages(2, 3, 1.0)
    with pytest.raises(ValueError, match="stages"):
        plan_stages(4, 0, 1.0)
    with pytest.raises(ValueError, match="step_cost_s"):
        plan_stages(4, 2, [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="finite"):
        plan_stages(4, 2, -1.0)
    with pytest.raises(ValueError, match="boundaries"):
        StagePlan(boundaries=(0, 3, 3), stage_times=(1.0, 0.0))
