"""Workload arithmetic and its derivation from an experiment config."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from digenrl.config import load_config
from digenrl.plan.workload import Workload, fragment_sizes, split_evenly
from digenrl.sim.schedules.disaggregated import unit_shares
from tests.sim.toy_costs import toy_costs

TINY = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "tiny.yaml"


def test_generation_time_chunks_by_samples_per_forward():
    costs = toy_costs()
    costs.generator_step_points = {"no_cfg": {1: 0.5, 4: 1.0}}
    w = Workload(
        prompts_per_iteration=3, group_size=3, num_steps=5, train_steps=4, cfg=False, samples_per_forward=4
    )
    # 9 samples in forwards of 4, 4, 1: per step 1.0 + 1.0 + 0.5
    assert w.generation_s(costs, 9) == pytest.approx(5 * 2.5)
    assert w.generation_s(costs, 9, steps=2) == pytest.approx(2 * 2.5)
    assert w.samples_per_iteration == 9 and w.units_per_iteration == 36


def test_splits_and_fragments_cover_everything_once():
    rng = random.Random(2027)
    for _ in range(100):
        total, parts = rng.randint(0, 50), rng.randint(1, 7)
        shares = split_evenly(total, parts)
        assert sum(shares) == total and max(shares) - min(shares) <= 1
        prompts, groups = rng.randint(1, 30), rng.randint(1, 8)
        sizes = fragment_sizes(prompts, groups)
        assert sum(sizes) == prompts and all(0 < s <= groups for s in sizes)
        w = Workload(prompts_per_iteration=prompts, group_size=2, num_steps=4, train_steps=3, cfg=False)
        trainers = rng.randint(1, 5)
        samples = [s * w.group_size for s in sizes]
        per_rank = [sum(col) for col in zip(*unit_shares(samples, w, trainers), strict=True)]
        assert sum(per_rank) == w.units_per_iteration and max(per_rank) - min(per_rank) <= 1


def test_workload_from_the_tiny_config():
    w = Workload.from_config(load_config(TINY))
    # tiny.yaml: 4 prompts x 4 samples, 8 steps, fraction 0.99 -> floor(7.92) = 7 trained, guidance 1.0
    assert (w.prompts_per_iteration, w.group_size, w.num_steps, w.train_steps) == (4, 4, 8, 7)
    assert w.cfg is False and w.micro_batch_size == 8 and w.iterations == 20
    guided = Workload.from_config(load_config(TINY, ["sampler.guidance_scale=4.5"]))
    assert guided.cfg is True


def test_bad_workloads_name_the_field():
    with pytest.raises(ValueError, match="train_steps"):
        Workload(prompts_per_iteration=1, group_size=2, num_steps=4, train_steps=5, cfg=False)
    with pytest.raises(ValueError, match="cooldown"):
        Workload(prompts_per_iteration=1, group_size=2, num_steps=4, train_steps=2, cfg=False, iterations=2)
