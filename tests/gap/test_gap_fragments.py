"""FragmentPlan: fragments partition the prompt groups into equal runs of whole groups, every fragment
has exactly one producer, per-pipeline loads differ by at most one, and bad keys are named."""

from __future__ import annotations

import random

import pytest

from digenrl.config import ConfigError
from digenrl.gap.fragments import FragmentPlan


def _random_plan(assignment: str) -> FragmentPlan:
    groups = random.randint(1, 4)
    fragments = random.randint(1, 9)
    return FragmentPlan(groups * fragments, groups, random.randint(1, 5), assignment)


@pytest.mark.parametrize("assignment", ["round-robin", "dynamic"])
def test_fragments_partition_the_groups_and_each_has_one_producer(assignment):
    for _ in range(40):
        plan = _random_plan(assignment)
        p, f, d = plan.prompts_per_iteration, plan.fragment_groups, plan.num_pipelines
        assert plan.num_fragments * f == p
        ids = [pid for frag in range(plan.num_fragments) for pid in plan.prompt_ids(frag)]
        assert ids == list(range(p))  # consecutive whole groups, in order, each once
        assert all(len(plan.prompt_ids(frag)) == f for frag in range(plan.num_fragments))
        assert all(plan.fragment_of_prompt(pid) == pid // f for pid in range(p))
        produced = [frag for pipe in range(d) for frag in plan.fragments_of(pipe)]
        assert sorted(produced) == list(range(plan.num_fragments))
        for pipe in range(d):
            mine = plan.fragments_of(pipe)
            assert list(mine) == sorted(mine)  # a pipeline produces its fragments in index order
            assert all(plan.pipeline_of(frag) == pipe for frag in mine)
            assert [plan.position_in_pipeline(frag) for frag in mine] == list(range(len(mine)))
        loads = [len(plan.fragments_of(pipe)) for pipe in range(d)]
        assert max(loads) - min(loads) <= 1
        assert plan.idle_pipelines == tuple(i for i, n in enumerate(loads) if n == 0)
        rounds = plan.production_rounds()
        assert sorted(x for r in rounds for x in r) == list(range(plan.num_fragments))
        assert plan.fragment_samples(3) == 3 * f


def test_assignment_orders():
    rr = FragmentPlan(12, 2, 4, "round-robin")  # 6 fragments over 4 pipelines
    assert [rr.fragments_of(p) for p in range(4)] == [(0, 4), (1, 5), (2,), (3,)]
    assert rr.production_rounds() == [(0, 1, 2, 3), (4, 5)]
    dynamic = FragmentPlan(12, 2, 4)  # the default: claimed at run time (FragmentStream)
    assert dynamic.assignment == "dynamic" and "claimed at run time" in dynamic.describe()
    idle = FragmentPlan(4, 2, 3, "round-robin")
    assert idle.idle_pipelines == (2,) and "idle pipelines: [2]" in idle.describe()
    assert "2 fragments of 2 groups (8 samples)" in idle.describe(group_size=4)


def test_errors_name_the_keys():
    with pytest.raises(
        ConfigError,
        match=r"algo\.prompts_per_iteration=6 is not a multiple of gap\.fragment_groups=4.*\[1, 2, 3, 6\]",
    ):
        FragmentPlan(6, 4)
    with pytest.raises(ConfigError, match=r"gap\.fragment_groups must be an int >= 1, got 0"):
        FragmentPlan(6, 0)
    with pytest.raises(ConfigError, match=r"algo\.prompts_per_iteration must be an int >= 1"):
        FragmentPlan(0, 1)
    with pytest.raises(ValueError, match="assignment='random' is not allowed"):
        FragmentPlan(4, 1, 2, "random")
    with pytest.raises(ValueError, match=r"fragment must be an int in \[0, 2\)"):
        FragmentPlan(4, 2).prompt_ids(2)
    with pytest.raises(ValueError, match=r"pipeline must be an int in \[0, 2\)"):
        FragmentPlan(4, 2, 2).fragments_of(2)


@pytest.mark.parametrize(("prompts", "group", "size"), [(4, 2, 1), (4, 4, 2), (3, 4, 6), (2, 8, 4)])
def test_sample_fragments_partition_the_batch_and_name_the_groups_they_wait_for(prompts, group, size):
    """gap.fragment_samples: fragment f holds samples [f·S, (f+1)·S) of the group-major batch; a group's
    advantages wait for exactly the fragments holding its samples."""
    plan = FragmentPlan(prompts, 1, 2, group_size=group, sample_size=size)
    assert plan.splits_groups and plan.num_fragments == prompts * group // size
    assert plan.fragment_samples(group) == size
    covered = []
    for f in range(plan.num_fragments):
        ids, rows = plan.prompt_ids(f), plan.rows(f)
        samples = [(ids.start + r // group, r % group) for r in rows]
        assert len(samples) == size and {g for g, _ in samples} == set(ids)
        covered += samples
        waits = plan.fragments_of_groups(f)
        holders = {h for h in range(plan.num_fragments) if set(plan.prompt_ids(h)) & set(ids)}
        assert set(waits) == holders and f in waits
    assert covered == [(g, i) for g in range(prompts) for i in range(group)]


def test_whole_group_sizes_in_samples_are_the_group_plan():
    plan = FragmentPlan(4, 1, 2, group_size=4, sample_size=8)
    assert plan == FragmentPlan(4, 2, 2, group_size=4) and not plan.splits_groups
    assert plan.fragments_of_groups(1) == range(1, 2)


def test_sample_size_that_does_not_divide_the_batch_is_named():
    with pytest.raises(
        ConfigError,
        match=r"gap\.fragment_samples=3 does not divide the batch of .* = 8 samples.*\[1, 2, 4, 8\]",
    ):
        FragmentPlan(4, 1, group_size=2, sample_size=3)
