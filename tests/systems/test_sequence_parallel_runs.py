"""A ``colocated-sync`` run with Ulysses sequence parallelism (trainer.sequence_parallel=2 and
sampler.sequence_parallel=2, tiny Wan on 2 CPU ranks: one group, one data-parallel member) trains on what
the single-process run trains on, makes the same update and evaluates alike (docs/models.md, "Sequence
parallelism")."""

from __future__ import annotations

import pytest

from digenrl.runtime.metrics import read_metrics
from tests.systems.equivalence import assert_same_update
from tests.systems.launcher import run_train

RUN = [
    "system=colocated-sync",
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


def test_sequence_parallel_run_makes_the_single_process_update(tmp_path):
    one, sharded = tmp_path / "one", tmp_path / "sp"
    run_train([*RUN, "profile=cpu-1", f"out_dir={one}"])
    sp = ["profile=cpu-2", "trainer.sequence_parallel=2", "sampler.sequence_parallel=2", f"out_dir={sharded}"]
    run_train([*RUN, *sp], nproc=2)
    # each sample counted once per group (4, not 8); the gradient summed over the group is the full one,
    # equal up to the fp32 noise of a near-zero on-policy loss (as 1 vs 2 data-parallel ranks are)
    assert_same_update(one, sharded, rel=1e-3, reward_abs=1e-6, samples=4, equal=("policy_version",))
    evaluations = [
        [r["eval_reward_mean"] for r in read_metrics(out) if "eval_reward_mean" in r]
        for out in (one, sharded)
    ]
    assert len(evaluations[1]) == 2 and evaluations[1] == pytest.approx(evaluations[0], abs=1e-6)
    assert sorted(p.name for p in (sharded / "samples").iterdir()) == ["policy_v0.png", "policy_v2.png"]
