"""The baselines share a prompt group's samples over ranks when groups are fewer than ranks (colocated
ranks, digenrl/data/rank_shares.py; separate generators, one fragment of P·G / generators samples each),
and colocated systems with ``colocated.split=speed`` share samples and micro-batch size by the profile's
device speeds; either way the update is the whole-group, equal-split run's on the same data and seed.

Every sample's noise is keyed by its (group, index), so the trajectories are the same whichever rank
generates them; advantages are computed after every rank's rewards are gathered; per-unit weights are
global. The runs therefore agree up to fp32 batch-composition noise (the forward batches differ).
"""

from __future__ import annotations

import json

import pytest
import torch

from digenrl.config import ConfigError, load_config
from digenrl.trainer.checkpoint import full_trainer_state, load_latest_checkpoint
from digenrl.validation import validate_config
from tests.systems.equivalence import assert_same_update
from tests.systems.launcher import TINY, run_train

# one prompt group of 4 samples per iteration: 2 ranks each get half of it
COMMON = ["iterations=2", "seed=3", "algo.prompts_per_iteration=1", "checkpoint_every=1"]
VARIANTS = {
    "whole-group": (["system=colocated-sync", "profile=cpu-1"], 0),
    "split-group": (["system=colocated-sync", "profile=cpu-2"], 2),
    "split-group-overlap": (["system=colocated-overlap", "profile=cpu-2"], 2),
    # cpu-2-hetero declares rank 0 twice as fast as rank 1: 3 samples against 1, both at the full micro-batch
    "speed": (["system=colocated-sync", "profile=cpu-2-hetero", "colocated.split=speed"], 2),
    # the hybrid engine (generation copy, re-shard, states offloaded while generating) with the same split
    "speed-engine": (["system=colocated-engine", "profile=cpu-2-hetero", "colocated.split=speed"], 2),
    # the lockstep rule: 3 samples at micro-batch 3 against 1 at 1, the same number of steps
    "speed-lockstep": (
        ["system=colocated-sync", "profile=cpu-2-hetero", "colocated.split=speed-lockstep"],
        2,
    ),
    # 2 generators make half a group each; advantages over the rewards gathered on the generator pool
    "split-group-separate": (
        ["system=separate-sync", "profile=cpu-4", "pools.trainers=2", "pools.generators=2"],
        4,
    ),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("colocated-split")
    for name, (overrides, nproc) in VARIANTS.items():
        run_train([*COMMON, *overrides, f"out_dir={root / name}"], nproc=nproc)
    return {name: root / name for name in VARIANTS}


def _spans(out_dir, rank: int, phase: str) -> list[int]:
    """The ``samples`` of each ``phase`` span of ``rank``."""
    lines = (out_dir / "events" / f"rank{rank}.jsonl").read_text().splitlines()
    return [s["samples"] for s in map(json.loads, lines) if s.get("type") == "span" and s["phase"] == phase]


def _train_samples(out_dir, rank: int) -> list[int]:
    return _spans(out_dir, rank, "train")


@pytest.mark.parametrize(
    "variant",
    ["split-group", "split-group-overlap", "speed", "speed-engine", "speed-lockstep", "split-group-separate"],
)
def test_same_update_as_the_whole_group_run(runs, variant):
    assert_same_update(
        runs["whole-group"], runs[variant], rel=1e-5, samples=4, ratio_abs=1e-5, equal=("train_units",)
    )
    wa = full_trainer_state(load_latest_checkpoint(runs["whole-group"]))["model"]
    wb = full_trainer_state(load_latest_checkpoint(runs[variant]))["model"]
    assert wa.keys() == wb.keys() and wa
    # Adam divides each gradient element by its running RMS, so an element whose gradient is near fp32 noise
    # moves by a visible share of lr (0.01 in tiny.yaml) on batch-composition noise: the bound is 1 % of one
    # step (measured: 1.5e-6 for the split group, 1.6e-5 for the speed split's 3 + 1 micro-batches).
    for name, tensor in wa.items():
        torch.testing.assert_close(wb[name], tensor, rtol=0, atol=1e-4, msg=name)


def test_each_rank_trains_its_share(runs):
    separate = runs["split-group-separate"]
    for generator in (2, 3):
        assert _spans(separate, generator, "generate") == [2, 2]  # half a group each iteration
    assert _train_samples(runs["split-group"], 0) == _train_samples(runs["split-group"], 1) == [2, 2]
    for variant in ("speed", "speed-lockstep"):
        assert _train_samples(runs[variant], 0) == [3, 3]  # the declared-faster rank
        assert _train_samples(runs[variant], 1) == [1, 1]


@pytest.mark.parametrize(
    ("overrides", "world", "needle"),
    [
        (
            ["system=colocated-sync", "algo.group_size=3", "algo.prompts_per_iteration=1"],
            2,
            "colocated.split=equal",
        ),
        (
            ["system=colocated-sync", "algo.group_size=2", "algo.prompts_per_iteration=1"],
            4,
            "colocated.split=equal",
        ),
        (
            ["system=separate-sync", "colocated.split=speed", "pools.trainers=1", "pools.generators=1"],
            2,
            "colocated.split",
        ),
        (["system=colocated-sync", "colocated.split=fastest"], 1, "colocated.split"),
        # the fair split's uneven micro-batch counts under FSDP2's lockstep collectives
        (["system=colocated-sync", "colocated.split=speed", "trainer.mode=full"], 2, "speed-lockstep"),
        # a rank that would get no sample, hence no micro-batch
        (
            [
                "system=colocated-sync",
                "colocated.split=speed",
                "algo.group_size=2",
                "algo.prompts_per_iteration=1",
            ],
            4,
            "at least one sample",
        ),
    ],
)
def test_a_batch_that_cannot_be_shared_fails_at_startup_naming_the_key(overrides, world, needle):
    profile = {1: "cpu-1", 2: "cpu-2", 4: "cpu-4"}[world]
    with pytest.raises(ConfigError, match=needle):
        validate_config(load_config(TINY, [f"profile={profile}", *overrides]), world_size=world)
