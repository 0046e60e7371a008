"""TspLayout rank arithmetic, balanced stage boundaries against brute force (uniform, measured and
heterogeneous devices), start-up validation, and a real pipeline run through the stage workers."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from digenrl.config import ConfigError
from digenrl.runtime.comm.control_plane import ControlPlane
from digenrl.runtime.hardware.profiles import load_profile
from digenrl.runtime.observe.events import EventLogger, load_events
from digenrl.tsp.pipeline import TspLayout, plan_tsp
from digenrl.tsp.stage_worker import InFlight, StageWorker

from .fixtures import PROMPTS, make_config, make_engine
from .test_tsp_engine_split import assert_identical


def _random_layout() -> TspLayout:
    stages, pipelines = random.randint(1, 4), random.randint(1, 4)
    first = random.randint(0, 5)
    return TspLayout(tuple(range(first, first + stages * pipelines)), stages)


def test_every_rank_has_one_place_and_neighbours_chain_each_pipeline():
    for _ in range(20):
        layout = _random_layout()
        s, d = layout.stages, layout.num_pipelines
        assert d * s == len(layout.generator_ranks)
        places = {(layout.pipeline_of(r), layout.stage_of(r)) for r in layout.generator_ranks}
        assert places == set(itertools.product(range(d), range(s)))
        for p in range(d):
            ranks = layout.pipeline_ranks(p)
            assert list(ranks) == list(range(ranks[0], ranks[0] + s))  # consecutive ranks
            chain = [ranks[0]]
            while layout.next_rank(chain[-1]) is not None:
                chain.append(layout.next_rank(chain[-1]))
            assert tuple(chain) == ranks
            assert layout.prev_rank(ranks[0]) is None
            assert all(layout.prev_rank(b) == a for a, b in itertools.pairwise(ranks))
            assert layout.is_first_stage(ranks[0]) and layout.is_last_stage(ranks[-1])
        assert layout.first_stage_ranks == tuple(layout.rank_of(p, 0) for p in range(d))
        assert layout.last_stage_ranks == tuple(layout.rank_of(p, s - 1) for p in range(d))


def test_one_stage_is_plain_data_parallelism():
    layout = TspLayout((4, 5, 6), 1)
    assert layout.num_pipelines == 3
    assert all(layout.next_rank(r) is None and layout.prev_rank(r) is None for r in (4, 5, 6))
    assert plan_tsp(layout, 7).steps_of(5) == range(0, 7)


def test_layout_and_plan_errors_name_the_keys():
    with pytest.raises(
        ConfigError, match=r"tsp\.stages=4 does not divide .* 6 ranks .*pools\.generators.*\[1, 2, 3, 6\]"
    ):
        TspLayout(tuple(range(6)), 4)
    with pytest.raises(ConfigError, match=r"tsp\.stages must be an int >= 1"):
        TspLayout((0, 1), 0)
    with pytest.raises(ValueError, match="generator_ranks"):
        TspLayout((0, 0), 1)
    layout = TspLayout(tuple(range(4)), 4)
    with pytest.raises(ConfigError, match=r"tsp\.stages=4 exceeds sampler\.num_steps=3"):
        plan_tsp(layout, 3)
    with pytest.raises(ConfigError, match=r"tsp\.boundaries=\[0, 2, 2, 4, 6\] gives stage\(s\) \[1\] no"):
        plan_tsp(layout, 6, boundaries=[0, 2, 2, 4, 6])
    with pytest.raises(ConfigError, match=r"tsp\.boundaries must be 5 ints from 0"):
        plan_tsp(layout, 6, boundaries=[0, 2, 6])
    with pytest.raises(ValueError, match="step_cost_s has 2 entries"):
        plan_tsp(layout, 6, [1.0, 2.0])
    with pytest.raises(ValueError, match="not a generator rank"):
        layout.stage_of(9)


def _brute_force_bottleneck(costs: list[list[float]], extra: float) -> float:
    """min over all contiguous non-empty partitions of the max stage time (float64, enumerated)."""
    s, t = len(costs), len(costs[0])
    best = float("inf")
    for cuts in itertools.combinations(range(1, t), s - 1):
        b = [0, *cuts, t]
        times = [sum(costs[i][b[i] : b[i + 1]]) + (extra if i == s - 1 else 0.0) for i in range(s)]
        best = min(best, max(times))
    return best


def test_balanced_boundaries_are_optimal_for_measured_step_costs():
    for _ in range(10):
        stages, t = random.randint(1, 4), random.randint(4, 10)
        layout = TspLayout(tuple(range(stages * 2)), stages)
        per_step = [random.uniform(0.01, 0.1) for _ in range(t)]
        extra = random.uniform(0.0, 0.2)
        plan = plan_tsp(layout, t, per_step, last_stage_extra_s=extra)
        expected = _brute_force_bottleneck([per_step] * stages, extra)
        for p in range(2):
            sp = plan.plan_of(p)
            assert sp.boundaries[0] == 0 and sp.boundaries[-1] == t and sp.num_stages == stages
            assert sp.bottleneck_s == pytest.approx(expected, rel=1e-12)
        covered = [i for r in layout.generator_ranks[:stages] for i in plan.steps_of(r)]
        assert covered == list(range(t))  # the stages of a pipeline tile the steps in order


def test_uniform_cost_with_decode_gives_the_last_stage_fewer_steps():
    layout = TspLayout((0, 1), 2)
    plan = plan_tsp(layout, 10, 0.05, last_stage_extra_s=0.2)  # decode + score = 4 steps' worth
    assert plan.steps_of(0) == range(0, 7) and plan.steps_of(1) == range(7, 10)
    assert plan.bottleneck_s == pytest.approx(0.35)


def test_heterogeneous_pipeline_gives_the_slow_gpu_fewer_steps():
    """hetero-h100-a100-16: ranks 0-7 are H100s (relative speed 0.9), 8-15 A100s (0.32). Generator ranks
    7..10 in 2 stages give pipeline 0 = (H100 rank 7, A100 rank 8) and pipeline 1 = (A100, A100)."""
    profile = load_profile("hetero-h100-a100-16")
    layout = TspLayout((7, 8, 9, 10), 2)
    t, cost = 12, 0.044
    plan = plan_tsp(layout, t, cost, profile=profile)
    mixed, slow = plan.plan_of(0), plan.plan_of(1)
    speeds = [0.9, 0.32]
    expected = _brute_force_bottleneck([[cost / v] * t for v in speeds], 0.0)
    assert mixed.bottleneck_s == pytest.approx(expected, rel=1e-12)
    assert len(plan.steps_of(7)) > len(plan.steps_of(8))  # the H100 stage runs more steps
    assert slow.boundaries == (0, 6, 12)  # equal devices split evenly
    assert plan.relative_speeds == (0.9, 0.32, 0.32, 0.32)
    text = plan.describe()
    assert "pipeline 0: rank 7 (x0.9) steps [0, " in text and "rank 8 (x0.32)" in text


def test_fixed_boundaries_keep_the_split_and_predict_its_times():
    layout = TspLayout((0, 1, 2), 3)
    plan = plan_tsp(
        layout, 6, [1.0, 1.0, 2.0, 2.0, 3.0, 3.0], boundaries=[0, 2, 4, 6], last_stage_extra_s=1.0
    )
    assert plan.plan_of(0).stage_times == (2.0, 4.0, 7.0)
    assert plan.steps_of(1) == range(2, 4)


def test_stage_workers_reproduce_generate_and_refuse_a_misrouted_fragment(tmp_path):
    cfg = make_config("sampler.guidance_scale=4.5", f"seed={random.randint(0, 999)}")
    engine = make_engine(cfg)
    t = engine.sampler.num_steps
    layout = TspLayout((3, 4, 5), 3)
    plan = plan_tsp(layout, t, [random.uniform(0.5, 1.5) for _ in range(t)], last_stage_extra_s=1.0)
    prompts, ids = PROMPTS[:2], [0, 1]
    whole = engine.generate(prompts, ids, iteration=2, policy_version=1)
    store = torch.distributed.HashStore()

    def worker(rank: int) -> StageWorker:
        plane = ControlPlane(store, rank, "generator")
        events = EventLogger(tmp_path, rank, "generator", 0.0)
        return StageWorker(engine, plan, rank, plane, events, device=torch.device("cpu"), timeout_s=5.0)

    tags = {"iteration": 2, "fragment": 0, "policy_version": 1}
    fragment = InFlight(engine.start(prompts, ids, iteration=2, policy_version=1), tags)
    with pytest.raises(ValueError, match=r"rank 4 runs steps \[\d+, \d+\) but fragment 0 .* steps_done=0"):
        worker(4).run(fragment)
    rank: int | None = layout.first_stage_ranks[0]
    while rank is not None:
        fragment = worker(rank).run(fragment)
        rank = layout.next_rank(rank)
    batch = fragment.batch
    assert_identical(batch, whole)
    assert fragment.tags["steps_s"] > 0  # the stages' seconds, summed (the trainers' TAG policy reads them)
    generated = [r for r in load_events(tmp_path) if r.get("phase") == "generate"]  # rank order: 3, 4, 5
    steps = [plan.steps_of(rank) for rank in (3, 4, 5)]
    assert [r["extra"]["steps"] for r in generated] == [[s.start, s.stop] for s in steps]
    assert torch.equal(batch.final_latents, whole.final_latents)
    assert "3 generator ranks = 1 pipeline(s) x 3 stage(s)" in layout.describe()
