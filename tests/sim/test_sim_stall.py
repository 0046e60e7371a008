"""The simulator never hangs: a decision loop that turns without simulated time passing is a schedule bug
and raises (digenrl/sim/des.py StallGuard), and the TAG wait of a trainer in index order ends only on what
the loop can act on (the livelock that held the Wan2.1-14B variance panel of the tables for hours)."""

from __future__ import annotations

import math

import pytest

from digenrl.costs.sample_costs import SampleCostDistribution, SampleVariance
from digenrl.plan import RunPlan
from digenrl.plan.workload import Workload
from digenrl.sim.des import Delay, Simulation, StallGuard
from digenrl.sim.simulator import simulate
from tests.sim.toy_costs import toy_costs


def test_a_trainer_waiting_for_theta_k_is_not_woken_by_a_fragment_it_cannot_take_yet():
    """TCSS and TAG with training in index order, per-prompt generation variance and a slow weight sync:
    at one iteration a later fragment (generated with θ_{k-1}) is in before fragment 0 while the generators
    do not hold θ_k yet. The trainer's TAG wait used to end on any ready fragment; in index order it could
    not take that one, came straight back to the same wait without time passing, and the simulation never
    ended (the Wan2.1-14B variance panel of the tables, on 16 A100s, hung this way). It ends now, with every
    iteration done."""
    costs = toy_costs(step=0.1, unit=0.01, sync_bytes=10**11, fragment_bytes=10**6, unit_bytes=10**5)
    frames = SampleCostDistribution(
        "generate", "discrete", "assumed (test)", values=(0.86, 1.42, 2.08, 2.86), per="prompt"
    )
    workload = Workload(
        prompts_per_iteration=16,
        group_size=2,
        num_steps=4,
        train_steps=2,
        cfg=False,
        micro_batch_size=2,
        variance=SampleVariance("frames", (frames,), seed=1),
        iterations=5,
    )
    plan = RunPlan(
        "digenrl",
        trainers=5,
        generators=3,
        fragment_groups=1,
        train_order="index",
        tag=True,
        tag_policy="always",
        tag_max_fragments=1,
        tcss=True,
        max_staleness=1,
    )
    result = simulate("h200-8", costs, workload, plan)
    assert math.isfinite(result.samples_per_s) and result.samples_per_s > 0
    assert len(result.iteration_end_s) == workload.iterations


def test_a_loop_that_turns_at_one_instant_raises_naming_what_and_its_state():
    sim = Simulation()
    guard = StallGuard(sim, limit=3, what="trainer rank 1, iteration 3")

    def loop():
        for _ in range(3):  # three passes at t = 0, then time moves: the count starts again
            guard.check()
        yield Delay(1.0)
        for _ in range(3):
            guard.check()
        guard.check(pending=[0, 1])  # the fourth pass at t = 1

    sim.spawn(loop(), "loop")
    with pytest.raises(
        RuntimeError, match=r"trainer rank 1, iteration 3 looped 4 times at t=1 s.*pending=\[0, 1\]"
    ):
        sim.run()
