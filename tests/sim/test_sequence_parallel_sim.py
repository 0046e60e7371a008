"""Ulysses sequence parallelism in the cost model, the memory model and the planner
(digenrl/plan/sequence_shape.py, digenrl/sim/training.py, digenrl/planning/memory.py): per-rank compute
1/N of the group's samples plus the all-to-alls of the activations over the intra-node link, activations
1/N per rank, and a long Wan2.1-14B clip that fits no H100 alone is planned with sequence parallelism."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from digenrl.config import load_config
from digenrl.costs import extrapolation
from digenrl.costs.cost_model import CostModel
from digenrl.costs.device_costs import DeviceCosts
from digenrl.models.sequence_parallel import context_parallel_plan
from digenrl.models.specs import MODEL_SPECS, get_family
from digenrl.plan import RunPlan
from digenrl.plan.sequence_shape import SEQUENCE_SHAPES, sequence_degrees
from digenrl.plan.workload import Workload
from digenrl.planning.memory import check_plan
from digenrl.planning.planner import Planner
from digenrl.runtime.hardware.profiles import load_profile
from digenrl.sim.simulator import simulate

REPO = Path(__file__).resolve().parents[2]
H200 = load_profile("h200-8")
WAN = CostModel.load(REPO / "experiments/results/costs/h200-wan2.1-14b.json")  # measured at 33 frames
W = Workload(
    prompts_per_iteration=8,
    group_size=4,
    num_steps=20,
    train_steps=1,
    cfg=False,
    micro_batch_size=1,
    activation_checkpointing=True,
    iterations=3,
)
KNOBS = {"micro_batch_size": 1, "activation_checkpointing": True}


def test_sequence_shapes_are_the_specs_and_only_planned_models_have_one():
    for name, spec in MODEL_SPECS.items():
        plan = context_parallel_plan(spec.transformer_class)
        if name not in SEQUENCE_SHAPES:
            assert not (spec.is_video and plan), f"{name} can be sharded but has no sequence shape"
            continue
        shape, config = SEQUENCE_SHAPES[name], spec.transformer_config
        assert plan, name
        assert shape.heads == config["num_attention_heads"]
        assert shape.hidden == config["num_attention_heads"] * config["attention_head_dim"]
        assert shape.blocks == config["num_layers"]
        assert shape.patch == get_family(spec.family).patch_size(config)
    assert "hunyuan-video" not in SEQUENCE_SHAPES  # diffusers 0.42 has no context-parallel plan for it


def test_exchange_bytes_by_hand():
    shape = SEQUENCE_SHAPES["wan2.1-14b"]
    tokens = shape.tokens(WAN.meta["latent_shape"])
    assert tokens == 9 * 30 * 52
    # one forward pass of one sample over N = 4: 40 blocks x 6 all-to-alls, each sending 3/4 of the rank's
    # quarter of the tokens x 5120 bf16 values
    assert shape.exchange_bytes(1, tokens, 4, 1) == pytest.approx(40 * 6 * (tokens / 4 * 5120 * 2) * 3 / 4)
    assert shape.exchange_bytes(3, tokens, 4, 2) == pytest.approx(6 * shape.exchange_bytes(1, tokens, 4, 1))
    assert shape.exchange_bytes(1, tokens, 1, 1) == 0
    # 40 heads, 14040 tokens, 8 devices a node: 2, 4 and 8 (not 3, 5, 6, 7)
    assert sequence_degrees("wan2.1-14b", WAN.meta["latent_shape"], 8) == [2, 4, 8]
    assert sequence_degrees("wan2.1-1.3b", WAN.meta["latent_shape"], 8) == [2, 4]  # 12 heads
    assert sequence_degrees("hunyuan-video", WAN.meta["latent_shape"], 8) == []


def test_a_rank_computes_half_its_groups_samples_and_pays_the_all_to_alls():
    one = simulate(H200, WAN, W, RunPlan("colocated-sync", **KNOBS))
    two = simulate(H200, WAN, W, RunPlan("colocated-sync", sequence_parallel=2, **KNOBS))
    tokens = 9 * 30 * 52
    # each rank of a group generates the group's 8 samples at half the compute, plus per step one forward's
    # all-to-alls: 40 blocks x 6, each sending half of the rank's half of 8 x 14040 x 5120 bf16 at 450 GB/s
    exchange = 40 * 6 * (8 * tokens / 2 * 5120 * 2) / 2 / 450e9
    per_rank = 20 * (WAN.generator_step_s(8, False) / 2 + exchange)
    assert two.phase_seconds["colocated"]["generate"] / 8 == pytest.approx(per_rank, rel=1e-9)
    assert one.phase_seconds["colocated"]["generate"] / 8 == pytest.approx(
        20 * WAN.generator_step_s(4, False)
    )
    # training: 8 units of one sample, each half the compute plus forward, backward and recomputation
    train = 8 * (
        WAN.train_micro_batch_s(1, False, True) / 2 + 3 * 40 * 6 * (tokens / 2 * 5120 * 2) / 2 / 450e9
    )
    assert two.phase_seconds["colocated"]["train"] / 8 == pytest.approx(train, rel=1e-9)
    # memory: a rank holds half of each sample's activations
    act = {
        n: check_plan(
            H200, DeviceCosts(H200, WAN), W, RunPlan("colocated-sync", sequence_parallel=n, **KNOBS)
        )[0]
        for n in (1, 2)
    }
    assert act[2].parts["train: activations"] == pytest.approx(act[1].parts["train: activations"] / 2)


def test_separate_sync_groups_generate_and_train_their_members_share():
    plan = RunPlan(
        "separate-sync", trainers=4, generators=4, sequence_parallel=2, generator_sequence_parallel=2, **KNOBS
    )
    result = simulate(H200, WAN, W, plan)
    tokens = 9 * 30 * 52
    one_pass = 40 * 6 * (tokens / 2 * 5120 * 2) / 2 / 450e9  # one sample's all-to-alls, N = 2
    # 32 samples over 2 generator groups: each of the 4 generator ranks generates 16 at half the compute
    generate = 20 * (WAN.generator_step_s(16, False) / 2 + 16 * one_pass)
    assert result.phase_seconds["generator"]["generate"] / 4 == pytest.approx(generate, rel=1e-9)
    # each of the 4 trainer ranks trains its group's 16 units (forward, backward, recomputation)
    train = 16 * (WAN.train_micro_batch_s(1, False, True) / 2 + 3 * one_pass)
    assert result.phase_seconds["trainer"]["train"] / 4 == pytest.approx(train, rel=1e-9)
    # only a group's first rank ships: 2 fragments, each to the 4 trainer ranks
    sends = [s for s in result.spans if s["phase"] == "transfer" and s["iteration"] == 1]
    assert len(sends) == 8 and {s["rank"] for s in sends} == {4, 6}


def test_the_plan_is_the_configs_and_is_refused_where_the_runtime_cannot_run_it():
    cfg = load_config(REPO / "experiments/configs/tiny.yaml")
    cfg.system, cfg.profile = "colocated-sync", "cpu-2"
    cfg.trainer.sequence_parallel = cfg.sampler.sequence_parallel = 2
    plan = RunPlan.from_config(cfg, load_profile("cpu-2"))
    assert plan.sequence_parallel == 2 and "sequence parallel 2" in plan.describe()
    items = plan.config_items()
    assert items["trainer.sequence_parallel"] == items["sampler.sequence_parallel"] == 2
    assert RunPlan.from_config(plan.to_config(cfg), load_profile("cpu-2")) == plan
    with pytest.raises(ValueError, match="runs under system=colocated-sync"):
        RunPlan("colocated-overlap", sequence_parallel=2).check(8, W)
    separate = RunPlan("separate-sync", trainers=4, generators=4, generator_sequence_parallel=2)
    separate.check(8, W)
    assert separate.config_items()["sampler.sequence_parallel"] == 2
    assert "trainer.sequence_parallel" not in separate.config_items()
    with pytest.raises(ValueError, match="generator_sequence_parallel=4 does not divide the pool's 6 ranks"):
        RunPlan("separate-sync", trainers=2, generators=6, generator_sequence_parallel=4).check(8, W)
    with pytest.raises(ValueError, match="does not divide the pool's 6 ranks"):
        RunPlan("colocated-sync", sequence_parallel=4).check(6, W)
    with pytest.raises(ValueError, match="span nodes"):
        RunPlan("colocated-sync", sequence_parallel=4).check(8, W, node_of=lambda rank: rank // 2)


@pytest.mark.slow  # carrying the measured 33-frame file to 193 frames counts FLOPs on meta models (~1 min)
def test_a_long_wan_clip_that_fits_no_h100_is_planned_with_sequence_parallelism():
    h100 = load_profile("h100-8")
    costs = extrapolation.reshape(WAN, 193)  # a 12 s clip at 16 fps: 49 latent frames, 76440 tokens
    factor = 1 / h100.gpu_types["h100"].relative_speed
    planner = Planner(h100, costs.scaled(factor, factor, "h100"), replace(W, micro_batch_size=1))
    baselines = planner.baselines()
    rejected = planner.rejected[RunPlan("colocated-sync").describe()]
    assert "does not fit even at micro-batch 1 with activation checkpointing" in rejected
    best = baselines["colocated-sync"]
    assert best is not None and best.plan.sequence_parallel >= 2, best
    # the separate pools' trainers do not fit alone either: the best split shards them
    separate = baselines["separate-sync"]
    assert separate is not None and separate.plan.sequence_parallel >= 2, separate
