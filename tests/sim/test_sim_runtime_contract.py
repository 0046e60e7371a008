"""The simulator and the runtime share one contract: the same schedule names, the same fragment plan and
fragment → pipeline mapping, the same rank placement and stage boundaries, the same unit shards."""

from __future__ import annotations

import random

import pytest

from digenrl.config import SYSTEMS
from digenrl.costs.device_costs import DeviceCosts
from digenrl.gap.fragments import FragmentPlan
from digenrl.gap.unit_sharding import shard_units
from digenrl.plan import RunPlan, Workload
from digenrl.runtime.hardware.profiles import load_profile
from digenrl.sim import simulate
from digenrl.sim.cluster import SimCluster
from digenrl.sim.schedules.disaggregated import handoff_bytes, stage_plan_for, unit_shares
from digenrl.systems import available_systems
from digenrl.tsp.pipeline import TspLayout, plan_tsp
from tests.gap.test_gap_unit_sharding import _synthetic
from tests.sim.toy_costs import toy_costs

H200_8 = load_profile("h200-8")


def test_schedule_names_match():
    assert sorted(SYSTEMS) == available_systems()


def test_both_map_fragments_to_the_same_pipelines_and_stages():
    rng = random.Random(2027)
    for _ in range(8):
        stages = rng.choice([1, 2])
        pipelines = rng.randint(1, 3)
        groups, fragments = rng.randint(1, 2), rng.randint(1, 6)
        # a fragment need not hold a unit for every trainer, and may hold half a group (1 of 2 samples)
        trainers = rng.randint(1, 8 - stages * pipelines)
        split = rng.random() < 0.5
        generators = stages * pipelines
        w = Workload(
            prompts_per_iteration=groups * fragments,
            group_size=2,
            num_steps=4,
            train_steps=3,
            cfg=False,
            iterations=3,
        )
        plan = RunPlan(
            "digenrl",
            trainers=trainers,
            generators=generators,
            fragment_groups=1 if split else groups,
            fragment_samples=1 if split else 0,
            tsp_stages=stages,
            fragment_assignment="round-robin",
        )
        result = simulate(H200_8, toy_costs(step=rng.uniform(0.01, 0.1)), w, plan)
        runtime_plan = FragmentPlan(
            w.prompts_per_iteration,
            1 if split else groups,
            pipelines,
            "round-robin",
            group_size=2,
            sample_size=1 if split else 0,
        )
        layout = TspLayout(tuple(range(trainers, trainers + generators)), stages)
        assert plan.fragment_plan(w) == runtime_plan
        for span in result.spans:
            if span["phase"] != "generate":
                continue
            pipeline = runtime_plan.pipeline_of(span["fragment"])
            assert span["rank"] == layout.rank_of(pipeline, span["extra"]["stage"]), span
        # the runtime's group completion (FragmentStream.rewards_ready): a fragment trains only after every
        # fragment sharing a group with it was scored
        scored = {(s["iteration"], s["fragment"]): s["t_end"] for s in result.spans if s["phase"] == "score"}
        for span in result.spans:
            if span["phase"] == "train" and span.get("fragment") is not None:
                k, f = span["iteration"], span["fragment"]
                waits = runtime_plan.fragments_of_groups(f)
                assert all(scored[(k, g)] <= span["t_start"] + 1e-9 for g in waits), span


def test_both_balance_stages_alike_and_cut_the_same_unit_shards():
    rng = random.Random(2028)
    for _ in range(10):
        steps, stages = rng.randint(2, 9), rng.randint(1, 3)
        stages = min(stages, steps)
        costs = toy_costs(step=rng.uniform(0.01, 0.2), decode=rng.uniform(0, 0.3))
        w = Workload(prompts_per_iteration=4, group_size=2, num_steps=steps, train_steps=1, cfg=False)
        cluster = SimCluster(H200_8, DeviceCosts(H200_8, costs), w, dict.fromkeys(range(8), "generator"))
        ranks = tuple(range(stages))
        sim_plan = stage_plan_for(cluster, ranks, 2)
        runtime = plan_tsp(
            TspLayout(ranks, stages),
            steps,
            w.step_s(costs, 2),
            last_stage_extra_s=costs.score_s(2),
            profile=H200_8,  # relative speed 1: the reference device
        )
        assert runtime.plan_of(0).boundaries == sim_plan.boundaries
    for _ in range(10):
        fragments, groups, k, trainers = (
            rng.randint(1, 5),
            rng.randint(1, 3),
            rng.randint(1, 4),
            rng.randint(1, 7),
        )
        w = Workload(
            prompts_per_iteration=fragments * groups, group_size=2, num_steps=8, train_steps=k, cfg=False
        )
        expected = unit_shares([groups * 2] * fragments, w, trainers)  # sizes in samples
        for f in range(fragments):
            batch = _synthetic(groups * 2, k, 8, shared_steps=True)
            shards = shard_units(batch, trainers, offset=f * batch.num_units)
            assert [s.batch_size for s in shards] == expected[f]
        per_rank = [sum(col) for col in zip(*expected, strict=True)]
        assert max(per_rank) - min(per_rank) <= 1


def test_a_helper_fragment_is_a_generate_span_marked_helper_in_both():
    w = Workload(prompts_per_iteration=8, group_size=2, num_steps=6, train_steps=4, cfg=False, iterations=4)
    plan = RunPlan("digenrl", trainers=2, generators=2, tag=True, tag_policy="always", tag_max_fragments=1)
    result = simulate(H200_8, toy_costs(step=0.1, unit=0.01), w, plan)
    helpers = [s for s in result.spans if s["phase"] == "generate" and s["extra"].get("helper")]
    assert helpers and {result.log.roles[s["rank"]] for s in helpers} == {"trainer"}
    assert {s["phase"] for s in result.spans} >= {"generate", "score", "train", "optimizer", "tag_switch"}


def test_both_share_a_colocated_batch_alike():
    """The simulator's colocated ranks get the runtime's shares (digenrl/data/rank_shares.py): a cut group
    on equal devices, samples and micro-batch size by speed on the heterogeneous CPU profile."""
    from digenrl.config import load_config
    from digenrl.systems.colocated_sync import colocated_shares
    from tests.systems.launcher import TINY

    for profile, split, world in (("cpu-4", "equal", 4), ("cpu-2-hetero", "speed", 2), ("cpu-2", "equal", 2)):
        overrides = [f"profile={profile}", "system=colocated-sync", "algo.prompts_per_iteration=1"]
        cfg = load_config(TINY, [*overrides, f"colocated.split={split}"])
        plan = RunPlan("colocated-sync", work_split=split)
        sim = plan.colocated_shares(Workload.from_config(cfg), load_profile(profile).relative_speeds)
        assert colocated_shares(cfg, RunPlan.from_config(cfg, load_profile(profile))) == sim
        costs = toy_costs(step=0.1, unit=0.01)
        if split == "speed":
            costs = DeviceCosts(load_profile(profile), costs, reference_type="cpu-slow")
        result = simulate(profile, costs, Workload.from_config(cfg), plan)
        trained = {s["rank"] for s in result.spans if s["phase"] == "train"}
        assert trained == set(range(world))


def test_a_colocated_plan_runs_where_groups_are_fewer_than_ranks():
    """16 prompt groups of 8 on 32 GPUs (the h800-32 video rows): half a group per rank."""
    w = Workload(prompts_per_iteration=16, group_size=8, num_steps=4, train_steps=2, cfg=False)
    for system in ("colocated-sync", "colocated-overlap"):
        result = simulate("h800-32", toy_costs(step=0.1, unit=0.01), w, RunPlan(system))
        assert result.samples_per_s > 0


def test_split_groups_need_the_runtimes_buffered_sends():
    """A trainer holding a split group's fragment waits for the rest of its rewards; with rendezvous sends
    the producer would wait for that trainer to receive the next fragment first."""
    w = Workload(prompts_per_iteration=2, group_size=4, num_steps=4, train_steps=3, cfg=False)
    plan = RunPlan("digenrl", trainers=2, generators=1, fragment_samples=2)
    plan.check(3, w)
    with pytest.raises(ValueError, match="split a group need buffered sends"):
        plan.with_(transport="rendezvous").check(3, w)
    with pytest.raises(ValueError, match=r"gap\.fragment_samples=3 does not divide"):
        plan.with_(fragment_samples=3).check(3, w)
    # sharded (FSDP2) trainers need a unit of every fragment, as the runtime's check_gap_config says
    full = Workload(
        prompts_per_iteration=2, group_size=4, num_steps=4, train_steps=3, cfg=False, trainer_mode="full"
    )
    with pytest.raises(ValueError, match="fewer than 3 sharded"):
        plan.with_(trainers=3).check(4, full)


def test_a_tsp_hand_off_is_priced_at_the_bytes_the_runtime_ships():
    """A stage hands on the current latent and the whole preallocated record (RolloutEngine.start), at
    every stage; the simulator prices it so (issue 33: it counted only the steps done)."""
    from dataclasses import replace

    from digenrl.perf.measure_costs import wire_bytes
    from digenrl.runtime.comm.transfer import batch_to_tensors
    from tests.tsp.fixtures import PROMPTS, make_config, make_engine

    engine = make_engine(make_config("sampler.num_steps=4", "algo.group_size=2"))
    wire = wire_bytes(engine.generate(PROMPTS[:1], [0], iteration=0, policy_version=0))
    cost = replace(
        toy_costs(step=0.1),
        fragment_bytes_per_sample=wire["per_sample"],
        latent_bytes_per_sample=wire["latent"],
        cond_bytes_per_sample=wire["cond"],
    )
    started = engine.start(PROMPTS[:1], [0], iteration=0, policy_version=0)
    for steps in (1, 3):  # early and late in the trajectory: the same bytes
        in_flight = engine.advance(started, steps)
        shipped = sum(t.numel() * t.element_size() for t in batch_to_tensors(in_flight)[1])
        assert handoff_bytes(cost, in_flight.batch_size) == pytest.approx(shipped, rel=0.02), steps
