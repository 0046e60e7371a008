"""GroupCompletion: a group's advantages, released once its rewards are in, equal the whole batch's."""

from __future__ import annotations

import math

import pytest
import torch

from digenrl.algo.advantages import group_advantages
from digenrl.algo.group_completion import GroupCompletion


def _batch(groups: int = 4, size: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rewards = torch.rand(groups * size, generator=g).float()
    rewards[size : 2 * size] = 0.5  # one zero-variance group
    group_ids = torch.arange(groups).repeat_interleave(size)
    sample_ids = torch.arange(size).repeat(groups)
    return rewards, group_ids, sample_ids


def test_released_in_any_order_equal_the_whole_batch() -> None:
    rewards, group_ids, sample_ids = _batch()
    whole = group_advantages(rewards, group_ids, clamp=5.0)
    completion = GroupCompletion(4, clamp=5.0)
    order = torch.randperm(rewards.numel(), generator=torch.Generator().manual_seed(1))
    released = []
    for chunk in order.split(3):  # sub-group pieces, out of order
        done = completion.add(group_ids[chunk], sample_ids[chunk], rewards[chunk])
        for group in done:  # released exactly when its last reward came in
            assert not any(
                int(group_ids[i]) == group.group for i in order[order.tolist().index(chunk[-1]) + 1 :]
            )
        released += [d.group for d in done]
    assert sorted(released) == [0, 1, 2, 3] and completion.pending == []
    advantages, keep = completion.advantages_for(group_ids, sample_ids)
    assert torch.equal(advantages, whole.advantages)
    assert bool(keep.all())
    assert completion.released(1).zero_variance and not completion.released(0).zero_variance


def test_incomplete_group_is_held_back() -> None:
    completion = GroupCompletion(3)
    assert completion.add([7, 7], [0, 2], [1.0, 2.0]) == []
    assert completion.pending == [7] and not completion.complete(7)
    with pytest.raises(KeyError, match=r"group 7 is not complete: rewards of sample indices \[0, 2\] of 3"):
        completion.released(7)
    (done,) = completion.add([7], [1], [3.0])
    assert done.group == 7 and completion.complete(7)
    assert torch.allclose(done.advantages, torch.tensor([-1.0, 1.0, 0.0]) * math.sqrt(1.5), atol=1e-3)


def test_a_dropped_sample_drops_its_whole_group() -> None:
    completion = GroupCompletion(2)
    completion.add([0], [0], [1.0])
    (done,) = completion.add([0], [1], [float("nan")], keep=[False])
    assert done.dropped and not bool(done.keep.any()) and torch.equal(done.advantages, torch.zeros(2))
    assert torch.equal(done.rewards, torch.tensor([1.0, 0.0]))


def test_bad_input_is_named() -> None:
    completion = GroupCompletion(2)
    completion.add([0], [0], [1.0])
    with pytest.raises(ValueError, match="sample 0 of group 0 arrived twice"):
        completion.add([0], [0], [1.0])
    with pytest.raises(ValueError, match=r"sample index 2 of group 1 is outside \[0, 2\)"):
        completion.add([1], [2], [1.0])
    with pytest.raises(ValueError, match="is nan but marked kept"):
        completion.add([3], [0], [float("nan")])
    with pytest.raises(ValueError, match=r"algo\.adv_std=group"):
        GroupCompletion(2, std_mode="global")
    with pytest.raises(ValueError, match="group_size must be an int >= 1"):
        GroupCompletion(0)
