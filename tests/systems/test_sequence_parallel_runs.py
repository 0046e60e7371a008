"""Runs with Ulysses sequence parallelism (tiny Wan, CPU ranks) train on what the single-process run trains
on, make the same update and evaluate alike (docs/models.md, "Sequence parallelism"): ``colocated-sync``
with trainer.sequence_parallel=2 and sampler.sequence_parallel=2 on 2 ranks (one group, one data-parallel
member), and ``separate-sync`` on 2 trainers + 2 generators with both pools sharded 2 ways (two groups
forming at once, each pool one member)."""

from __future__ import annotations

from pathlib import Path

import pytest

from digenrl.runtime.observe.metrics import read_metrics
from tests.systems.equivalence import assert_same_update
from tests.systems.launcher import run_train

RUN = [
    "model.name=tiny-wan",
    "iterations=2",
    "seed=0",
    "algo.prompts_per_iteration=2",
    "algo.group_size=2",
    "sampler.num_steps=4",
    "trainer.micro_batch_size=2",
    "eval.every=2",  # evaluation of v0 and of the final policy, shared out over the data group
    "eval.num_steps=2",
    "eval.num_prompts=2",
]
SHARDED = ["trainer.sequence_parallel=2", "sampler.sequence_parallel=2"]


@pytest.fixture(scope="module")
def one(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one")
    run_train([*RUN, "system=colocated-sync", "profile=cpu-1", f"out_dir={out}"])
    return out


def assert_same_run(one: Path, sharded: Path) -> None:
    """Each sample counted once per group (4, not 8); the gradient summed over the group is the full one,
    equal up to the fp32 noise of a near-zero on-policy loss (as 1 vs 2 data-parallel ranks are); both
    evaluations score what the single process scores, and rank 0 alone wrote their grids."""
    assert_same_update(one, sharded, rel=1e-3, reward_abs=1e-6, samples=4, equal=("policy_version",))
    evaluations = [
        [r["eval_reward_mean"] for r in read_metrics(out) if "eval_reward_mean" in r]
        for out in (one, sharded)
    ]
    assert len(evaluations[1]) == 2 and evaluations[1] == pytest.approx(evaluations[0], abs=1e-6)
    assert sorted(p.name for p in (sharded / "samples").iterdir()) == ["policy_v0.png", "policy_v2.png"]


def test_colocated_sequence_parallel_run_makes_the_single_process_update(one, tmp_path):
    sharded = tmp_path / "colocated"
    run_train([*RUN, "system=colocated-sync", "profile=cpu-2", *SHARDED, f"out_dir={sharded}"], nproc=2)
    assert_same_run(one, sharded)


def test_separate_sync_with_both_pools_sharded_makes_the_single_process_update(one, tmp_path):
    sharded = tmp_path / "separate"
    pools = ["system=separate-sync", "profile=cpu-4", "pools.trainers=2", "pools.generators=2"]
    run_train([*RUN, *pools, *SHARDED, f"out_dir={sharded}"], nproc=4)
    assert_same_run(one, sharded)
