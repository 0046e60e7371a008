"""The simulator prices what the runtime does: micro-batches packed across fragments as the runtime's
UnitPacker packs them, switches charged only for the bytes they move, FSDP2 full fine-tuning sharded,
costs carried to unmeasured configurations by counted FLOPs."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace

import pytest

from digenrl.costs.device_costs import DeviceCosts
from digenrl.gap.unit_packer import UnitPacker
from digenrl.plan import RunPlan
from digenrl.plan.workload import Workload
from digenrl.planning.memory import RankLoad, rank_memory
from digenrl.runtime.hardware.profiles import load_profile
from digenrl.sim.cluster import SimCluster
from digenrl.sim.simulator import simulate
from digenrl.sim.training import SimPacker, fsdp_gather_s, micro_batch_s
from tests.gap.test_gap_unit_sharding import _synthetic
from tests.sim.toy_costs import toy_costs

H200_8 = load_profile("h200-8")
#: a training micro-batch costs nearly as much at 1 unit as at 4 (docs: GAP packs units for this reason)
CONCAVE = {1: 0.40, 2: 0.45, 4: 0.50, 8: 0.90}


def _concave_costs(**kw):
    costs = toy_costs(**kw)
    costs.train_points = {"cfg": dict(CONCAVE), "no_cfg": dict(CONCAVE)}
    costs.forget()
    return costs


def test_sim_packer_trains_the_micro_batches_the_runtime_unit_packer_trains():
    """Feed the same shards to the runtime's UnitPacker and to SimPacker: the simulator's seconds are those
    of the micro-batches the runtime forms (full ones of micro_batch_size as units arrive, the rest at the
    end), and the whole stream costs what training it in one batch costs."""
    rng = random.Random(2027)
    costs = _concave_costs()
    for _ in range(10):
        mb = rng.choice([2, 4, 8])
        w = Workload(
            prompts_per_iteration=4, group_size=2, num_steps=4, train_steps=1, cfg=False, micro_batch_size=mb
        )
        cluster = SimCluster(H200_8, DeviceCosts(H200_8, costs), w, dict.fromkeys(range(8), "trainer"))
        trained: list[int] = []
        runtime = UnitPacker(trained.append, mb, enabled=True)
        sim = SimPacker(cluster, 0, (0, 1))
        simulated = 0.0
        for _ in range(rng.randint(1, 8)):
            shard = replace(_synthetic(rng.randint(1, 7), 1, 4, shared_steps=True), iteration=0)
            runtime.add(shard)
            simulated += sim.add(shard.batch_size)
        runtime.flush()
        simulated += sim.flush()
        sizes = [batch.batch_size for batch in trained]
        # PolicyTrainer.accumulate cuts each packed batch into micro-batches of at most mb
        expected = sum(n // mb * CONCAVE[mb] + costs.train_units_s(n % mb, mb, False) for n in sizes)
        assert all(n % mb == 0 for n in sizes[:-1])  # only the flushed rest is a partial micro-batch
        assert simulated == pytest.approx(expected)
        assert simulated == pytest.approx(costs.train_units_s(sum(sizes), mb, False))


def test_gap_keeps_the_micro_batch_full_across_fragments():
    """One-group fragments over 4 trainers leave each trainer 3 units per fragment; the simulated train
    time per iteration is still that of full micro-batches (the old per-fragment rule cost far more)."""
    costs = _concave_costs(step=0.01)
    w = Workload(
        prompts_per_iteration=8,
        group_size=4,
        num_steps=4,
        train_steps=3,
        cfg=False,
        micro_batch_size=4,
        iterations=3,
    )
    result = simulate(H200_8, costs, w, RunPlan("digenrl", trainers=4, generators=2, fragment_groups=1))
    per_rank = defaultdict(float)
    for s in result.spans:
        if s["phase"] == "train" and s["iteration"] == 1:
            per_rank[s["rank"]] += s["t_end"] - s["t_start"]
    units = w.units_per_iteration // 4  # 96 units over 4 trainers, 3 of each fragment
    assert per_rank and all(
        v == pytest.approx(costs.train_units_s(units, 4, False)) for v in per_rank.values()
    )
    unpacked = w.prompts_per_iteration * costs.train_units_s(3, 4, False)  # a micro-batch of 3 per fragment
    assert all(v < 0.8 * unpacked for v in per_rank.values())


def _switches(result):
    return [s for s in result.spans if s["phase"] == "tag_switch"]


def test_a_tag_switch_moves_nothing_unless_gradients_are_parked_and_pending():
    """The runtime's TAG switch synchronises the device; with tag.park_grads it also moves the pending
    gradients — and at the head of an iteration none are pending."""
    sync = random.uniform(0.001, 0.01)
    costs = toy_costs(step=0.1, unit=0.01, switch=sync, grad_bytes=64 * 10**9)
    w = Workload(
        prompts_per_iteration=12,
        group_size=2,
        num_steps=6,
        train_steps=4,
        cfg=False,
        micro_batch_size=2,
        iterations=4,
    )
    plan = RunPlan("digenrl", trainers=2, generators=2, tag=True, tag_policy="always", tag_max_fragments=3)
    plain = simulate(H200_8, costs, w, plan)
    assert _switches(plain) and all(
        s["extra"]["bytes"] == 0 and s["t_end"] - s["t_start"] == pytest.approx(sync)
        for s in _switches(plain)
    )
    parked = simulate(H200_8, costs, w, plan.with_(park_grads=True))
    copy_s = 64 * 10**9 / (H200_8.links.host_device_gbps * 1e9)
    moved = [s for s in _switches(parked) if s["extra"]["bytes"]]
    still = [s for s in _switches(parked) if not s["extra"]["bytes"]]
    assert still, "the first switch of an iteration has no pending gradient to move"
    assert all(s["t_end"] - s["t_start"] == pytest.approx(sync + copy_s) for s in moved)
    assert parked.samples_per_s <= plain.samples_per_s


def test_colocated_phases_move_nothing_with_the_runtime_defaults():
    costs = toy_costs(step=0.05, unit=0.01, optimizer_bytes=10**10)
    w = Workload(prompts_per_iteration=4, group_size=2, num_steps=4, train_steps=2, cfg=False, iterations=3)
    resident = simulate("cpu-2", costs, w, RunPlan("colocated-sync"))
    assert not [s for s in resident.spans if s["phase"] == "residency"]
    parked = simulate("cpu-2", costs, w, RunPlan("colocated-sync", train_resident=False))
    moves = [s for s in parked.spans if s["phase"] == "residency"]  # as the runtime logs them
    assert {(s["extra"]["role"], s["extra"]["kind"]) for s in moves} == {
        ("train", "offload"),
        ("train", "onload"),
    }
    assert len(moves) == 2 * 2 * w.iterations  # park before generating, back before the step; 2 ranks
    assert parked.steady_iteration_s > resident.steady_iteration_s


def test_full_fine_tuning_is_sharded_and_gathers_the_weights():
    """FSDP2: each micro-batch takes the longer of its compute and three ring passes of the weights; the
    optimizer steps a shard; trainer memory holds 1/n of weights, gradients and moments."""
    costs = replace(toy_costs(step=0.05, unit=0.001, optimizer=0.8), param_bytes=24 * 10**9)
    w = Workload(
        prompts_per_iteration=8, group_size=2, num_steps=4, train_steps=2, cfg=False, trainer_mode="full"
    )
    profile = load_profile("h800-32")
    cluster = SimCluster(profile, DeviceCosts(profile, costs), w, dict.fromkeys(range(32), "trainer"))
    inside, across = tuple(range(8)), tuple(range(16))
    gather = fsdp_gather_s(cluster, inside, costs.param_bytes)
    assert gather == pytest.approx(7 / 8 * 24e9 / (profile.links.intra_node_gbps * 1e9))
    assert fsdp_gather_s(cluster, across, costs.param_bytes) > 4 * gather  # the ring crosses the network
    assert micro_batch_s(cluster, 0, inside, 4) == pytest.approx(3 * gather)
    assert micro_batch_s(cluster, 0, (0,), 4) == pytest.approx(costs.train_micro_batch_s(4, False))
    full = replace(costs, grad_bytes=costs.param_bytes, optimizer_bytes=2 * costs.param_bytes)
    full.meta["trainer_mode"] = "full"
    one = rank_memory(
        profile,
        0,
        replace(full, train_peak_bytes={"no_cfg": {1: 100 * 10**9}}),
        RankLoad("t", True, False, 1, shards=1),
        False,
    )
    eight = rank_memory(
        profile,
        0,
        replace(full, train_peak_bytes={"no_cfg": {1: 100 * 10**9}}),
        RankLoad("t", True, False, 1, shards=8),
        False,
    )
    assert one.peak - eight.peak == pytest.approx(7 / 8 * 4 * 24e9)


def test_costs_are_carried_by_counted_flops_with_the_measured_efficiency():
    from digenrl.costs import extrapolation

    base = replace(
        toy_costs(step=0.2, unit=0.5, decode=0.1),
        model="tiny-wan",
        source="measured",
        meta={"frames": 5, "train_steps_per_sample": 1},
        generator_peak_bytes={"no_cfg": {1: 2 * 10**9}},
        train_peak_bytes={"no_cfg": {1: 3 * 10**9}},
    )
    measured = extrapolation.model_facts("tiny-wan", 5)
    target = extrapolation.model_facts("tiny-wan", 9)
    longer = extrapolation.reshape(base, 9)
    ratio = target["forward_flops"] / measured["forward_flops"]
    assert ratio > 1 and longer.source == "extrapolated from toy" and longer.meta["frames"] == 9
    assert longer.generator_step_s(1, False) == pytest.approx(base.generator_step_s(1, False) * ratio)
    assert longer.train_micro_batch_s(1, False) == pytest.approx(base.train_micro_batch_s(1, False) * ratio)
    assert longer.latent_bytes_per_sample == target["latent_bytes"]
    assert "reshape" in longer.meta["derivation"][0]
    other = extrapolation.carry_to_model(base, "tiny-hunyuan-video")
    assert other.model == "tiny-hunyuan-video" and other.meta["reference_model"] == "tiny-wan"
    assert set(other.generator_step_points) == {"no_cfg"}  # guidance-distilled: no CFG pass
    full = extrapolation.full_finetune(base)
    assert full.meta["trainer_mode"] == "full" and full.grad_bytes == base.param_bytes
    assert full.train_micro_batch_s(1, False) == pytest.approx(
        base.train_micro_batch_s(1, False) + base.generator_step_s(1, False)
    )
    no_cfg = replace(
        base,
        generator_step_points={"no_cfg": {1: 0.2, 2: 0.3}},
        train_points={"no_cfg": base.train_points["no_cfg"]},
    )
    cfg = extrapolation.with_cfg_training(no_cfg)
    assert cfg.generator_step_s(1, True) == pytest.approx(0.3)  # the CFG step is one forward of 2B
    assert cfg.train_micro_batch_s(1, True) == pytest.approx(base.train_micro_batch_s(1, False) + 0.1)
    assert len(cfg.meta["derivation"]) == 1 and "CFG training" in cfg.meta["derivation"][0]
