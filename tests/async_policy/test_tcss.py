"""TCSS's planned switch: which version a fragment is generated with is a function of its index, the
configuration and the checkpoints, never of timing (digenrl/async_policy/tcss.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from digenrl.async_policy.tcss import StalenessBound, StalenessError, resolve_switch
from digenrl.config import ConfigError, load_config
from tests.gap.test_gap_unit_sharding import _synthetic


def test_fragments_below_the_switch_use_the_previous_version_and_the_rest_their_own():
    bound = StalenessBound(1, checkpoint_every=3, iterations=8, switch=2)
    assert [bound.version_of(0, f) for f in range(4)] == [0, 0, 0, 0]  # nothing older than θ_0
    assert [bound.version_of(1, f) for f in range(4)] == [0, 0, 1, 1]
    assert [bound.version_of(3, f) for f in range(4)] == [3, 3, 3, 3]  # after a checkpoint: on-policy
    assert [bound.version_of(4, f) for f in range(4)] == [3, 3, 4, 4]
    resumed = dataclasses.replace(bound, start=5)  # a resumed process holds only the checkpointed θ_5
    assert [resumed.version_of(5, f) for f in range(4)] == [5, 5, 5, 5]
    assert [resumed.version_of(7, f) for f in range(4)] == [6, 6, 7, 7]
    on_policy = StalenessBound(0, iterations=8)  # TCSS off
    assert all(on_policy.version_of(k, f) == k for k in range(8) for f in range(4))
    assert on_policy.planned and bound.planned


def test_the_timing_switch_has_no_plan_and_keeps_the_oldest_version_rule():
    timing = StalenessBound(1, checkpoint_every=2, iterations=6, switch=None)
    assert not timing.planned
    assert [timing.oldest_version(k) for k in range(5)] == [0, 0, 2, 2, 4]
    with pytest.raises(ValueError, match="timing"):
        timing.version_of(1, 0)
    assert timing.switch_at(2) == 0  # an on-policy iteration needs no plan


@pytest.mark.parametrize(
    ("value", "fragments", "expected"),
    [("auto", 8, 8), ("auto", 2, 2), ("timing", 8, None), ("0", 8, 0), ("3", 8, 3), ("8", 8, 8)],
)
def test_resolve_switch(value, fragments, expected):
    assert resolve_switch(value, fragments) == expected


@pytest.mark.parametrize("value", ["9", "-1", "later", "2.5", ""])
def test_a_bad_switch_names_the_key_and_the_range(value):
    with pytest.raises(ConfigError, match=r"tcss\.switch=.* \[0, 8\]"):
        resolve_switch(value, 8)


def test_from_config_resolves_auto_and_leaves_tcss_off_on_policy():
    cfg = load_config(None, ["system=digenrl", "tcss=true", "iterations=5"])
    auto = StalenessBound.from_config(cfg, 6)
    assert auto.switch == 6 and [auto.version_of(2, f) for f in range(6)] == [1] * 6
    cfg = load_config(None, ["system=digenrl", "tcss=true", "tcss.switch=timing"])
    assert not StalenessBound.from_config(cfg, 6).planned
    off = StalenessBound.from_config(load_config(None, ["system=digenrl"]), 6)
    assert off.lag == 0 and off.version_of(3, 0) == 3


def _shard(iteration: int, version: int):
    batch = _synthetic(4, 2, 4, shared_steps=True)
    batch.iteration = iteration
    batch.policy_version = torch.full((4,), version)
    return batch


def test_a_fragment_generated_with_another_version_than_the_plan_is_refused():
    bound = StalenessBound(1, iterations=8, switch=2)
    assert bound.check_fragment(_shard(3, 2), trainer_version=3, fragment=1, rank=0) == 1
    assert bound.check_fragment(_shard(3, 3), trainer_version=3, fragment=2, rank=0) == 0
    with pytest.raises(StalenessError, match=r"fragment 2 of iteration 3 .* binds it to version 3"):
        bound.check_fragment(_shard(3, 2), trainer_version=3, fragment=2, rank=0)  # stale, but not planned
    with pytest.raises(StalenessError, match="binds it to version 2"):
        bound.check_fragment(_shard(3, 3), trainer_version=3, fragment=0, rank=0)
    timing = dataclasses.replace(bound, switch=None)  # any version within the lag
    assert timing.check_fragment(_shard(3, 2), trainer_version=3, fragment=2, rank=0) == 1
