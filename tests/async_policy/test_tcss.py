"""TCSS's planned switch: which version a fragment is generated with is a function of its index, the
configuration and the checkpoints, never of timing (digenrl/async_policy/tcss.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from digenrl.async_policy.tcss import StalenessBound, StalenessError
from digenrl.config import ConfigError, load_config
from digenrl.plan import RunPlan
from digenrl.rules import resolve_switch
from digenrl.runtime.hardware.profiles import load_profile
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


def test_from_plan_resolves_auto_and_leaves_tcss_off_on_policy():
    profile = load_profile("cpu-2")
    cfg = load_config(None, ["system=digenrl", "tcss=true", "iterations=5"])
    auto = StalenessBound.from_plan(RunPlan.from_config(cfg, profile), 6)
    assert auto.switch == 6 and [auto.version_of(2, f) for f in range(6)] == [1] * 6
    cfg = load_config(None, ["system=digenrl", "tcss=true", "tcss.switch=timing"])
    assert not StalenessBound.from_plan(RunPlan.from_config(cfg, profile), 6).planned
    off = StalenessBound.from_plan(RunPlan.from_config(load_config(None, ["system=digenrl"]), profile), 6)
    assert off.lag == 0 and off.version_of(3, 0) == 3
    # separate-async: its max_staleness, no switch; separate-sync: on-policy
    lagged = RunPlan.from_config(
        load_config(None, ["system=separate-async", "asynchrony.max_staleness=1"]), profile
    )
    assert StalenessBound.from_plan(lagged, 2).lag == 1 and StalenessBound.from_plan(lagged, 2).switch is None
    assert StalenessBound.from_plan(RunPlan("separate-sync"), 2).lag == 0


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


def test_a_fragment_mixing_versions_is_refused_whatever_the_bound():
    mixed = _shard(3, 3)
    mixed.policy_version = torch.tensor([3, 3, 2, 3])
    for bound in (StalenessBound(0, iterations=8), StalenessBound(1, iterations=8, switch=None)):
        with pytest.raises(
            StalenessError, match=r"rank 5: fragment 1 of iteration 3 mixes policy versions \[2, 3\]"
        ):
            bound.check_fragment(mixed, trainer_version=3, fragment=1, rank=5)


@pytest.mark.parametrize(
    ("lag", "generated", "trainer", "staleness"),
    [(0, 2, 3, 1), (1, 1, 3, 2), (1, 4, 3, -1), (0, 4, 3, -1)],  # too stale, or newer than the trainer
)
def test_a_fragment_outside_the_lag_is_refused_naming_versions_and_the_allowed_range(
    lag, generated, trainer, staleness
):
    bound = StalenessBound(lag, iterations=8, switch=None)  # no plan: only the lag is checked
    assert not bound.allows(staleness)
    message = rf"generated by policy version {generated} and reached the trainer at version {trainer} "
    message += rf"\(staleness {staleness}; allowed 0\.\.{lag}\)"
    with pytest.raises(StalenessError, match=message):
        bound.check_fragment(_shard(3, generated), trainer_version=trainer, fragment=0, rank=0)


def test_separate_async_bound_allows_its_lag_without_a_plan():
    bound = StalenessBound(1, checkpoint_every=0, iterations=8)  # asynchrony.max_staleness=1
    assert not bound.planned and bound.head_only(3) == 0
    assert [
        bound.check_fragment(_shard(3, v), trainer_version=3, fragment=f, rank=0) for f, v in ((0, 2), (1, 3))
    ] == [1, 0]
    assert [bound.allows(s) for s in (-1, 0, 1, 2)] == [False, True, True, False]


def test_after_a_checkpoint_nothing_stale_is_in_flight():
    """The iteration after a checkpoint (and a resumed process's first) drains: its oldest allowed version is
    its own, so a fragment still generated with the previous θ is refused there and accepted a step later."""
    bound = StalenessBound(1, checkpoint_every=2, iterations=8, switch=3)
    assert [bound.oldest_version(k) for k in range(7)] == [0, 0, 2, 2, 4, 4, 6]
    assert [bound.head_only(k) for k in range(5)] == [0, 3, 0, 3, 0]  # TAG helpers claim at or above it
    drained = r"fragment 0 of iteration 4 was generated by policy version 3, older than the iteration allows"
    with pytest.raises(StalenessError, match=drained):
        bound.check_fragment(_shard(4, 3), trainer_version=4, fragment=0, rank=0)
    assert bound.check_fragment(_shard(5, 4), trainer_version=5, fragment=0, rank=0) == 1
    resumed = dataclasses.replace(bound, start=5)
    assert resumed.oldest_version(5) == 5 and resumed.head_only(5) == 0
    with pytest.raises(StalenessError, match=r"version 4, older than the iteration allows \(version 5"):
        resumed.check_fragment(_shard(5, 4), trainer_version=5, fragment=0, rank=0)
    timing = dataclasses.replace(bound, switch=None)  # no plan, but the drain holds all the same
    with pytest.raises(StalenessError, match="older than the iteration allows"):
        timing.check_fragment(_shard(4, 3), trainer_version=4, fragment=2, rank=0)
    assert timing.check_fragment(_shard(5, 4), trainer_version=5, fragment=2, rank=0) == 1


def test_an_empty_shard_is_nothing_to_check():
    empty = _shard(3, 0).select([])
    assert StalenessBound(0, iterations=8).check_fragment(empty, trainer_version=3, fragment=0, rank=0) == 0


def test_the_banner_says_which_fragments_are_stale():
    assert StalenessBound(0).describe_tcss("auto", 4) == "TCSS off (on-policy)"
    assert "fragments [0, 2) of 4 one version stale" in StalenessBound(1, switch=2).describe_tcss("2", 4)
    assert "not reproducible" in StalenessBound(1).describe_tcss("timing", 4)
