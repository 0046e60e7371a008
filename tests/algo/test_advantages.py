"""Group advantages against a numpy float64 reference; reward gather single- and two-process (gloo)."""

import os
import random
import tempfile
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist

from digenrl.algo.advantages import gather_rewards, group_advantages
from tests.runtime.spawn import spawn_workers


def numpy_advantages(rewards, ids, std_mode, clamp=5.0, eps=1e-4):
    """flow_grpo PerPromptStatTracker.update semantics (np.std, + eps), plus the adv_clip_max clamp."""
    rewards, ids = np.asarray(rewards, dtype=np.float64), np.asarray(ids)
    adv, means, stds = np.empty_like(rewards), np.empty_like(rewards), np.empty_like(rewards)
    for g in np.unique(ids):
        m = ids == g
        means[m], stds[m] = rewards[m].mean(), rewards[m].std()
        denom = (rewards[m].std() if std_mode == "group" else rewards.std()) + eps
        adv[m] = (rewards[m] - rewards[m].mean()) / denom
    return np.clip(adv, -clamp, clamp), means, stds


def interleaved_batch(num_groups, group_size):
    """Random rewards, random non-contiguous int64 group labels, samples of a group scattered."""
    labels = torch.randperm(10_000)[:num_groups].to(torch.int64) * 7919
    ids = labels.repeat_interleave(group_size)
    perm = torch.randperm(ids.numel())
    return torch.randn(ids.numel()) * random.uniform(0.1, 3.0), ids[perm]


@pytest.mark.parametrize("std_mode", ["group", "global"])
def test_advantages_match_numpy_reference_interleaved(std_mode):
    rewards, ids = interleaved_batch(random.randint(2, 6), random.randint(2, 8))
    out = group_advantages(rewards, ids, std_mode=std_mode)
    adv, means, stds = numpy_advantages(rewards.numpy(), ids.numpy(), std_mode)
    assert out.advantages.dtype == torch.float32 and out.advantages.shape == rewards.shape
    np.testing.assert_allclose(out.advantages.numpy(), adv, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.group_mean.numpy(), means, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.group_std.numpy(), stds, rtol=1e-5, atol=1e-6)
    assert not bool(out.zero_variance.any())


def test_unequal_group_sizes_match_numpy():
    sizes = [random.randint(2, 7) for _ in range(4)]
    ids = torch.cat([torch.full((n,), g, dtype=torch.int64) for g, n in enumerate(sizes)])
    perm = torch.randperm(ids.numel())
    rewards, ids = torch.rand(ids.numel()), ids[perm]
    out = group_advantages(rewards, ids, std_mode="group")
    adv, _, _ = numpy_advantages(rewards.numpy(), ids.numpy(), "group")
    np.testing.assert_allclose(out.advantages.numpy(), adv, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("std_mode", ["group", "global"])
def test_zero_variance_group_is_exactly_zero_and_flagged(std_mode):
    rewards, ids = interleaved_batch(4, 3)
    rewards = rewards.double()
    flat_group = ids[0]
    rewards[ids == flat_group] = 0.1
    # the float64 mean of three 0.1 is 0.10000000000000002: a naive (r - mean)/(std + eps) is not exactly 0
    assert torch.tensor([0.1, 0.1, 0.1], dtype=torch.float64).mean().item() != 0.1
    out = group_advantages(rewards, ids, std_mode=std_mode)
    flat = ids == flat_group
    assert torch.equal(out.zero_variance, flat)
    assert torch.equal(out.advantages[flat], torch.zeros(int(flat.sum())))
    assert bool((out.advantages[~flat] != 0).any())
    adv, _, _ = numpy_advantages(rewards.numpy(), ids.numpy(), std_mode)
    np.testing.assert_allclose(out.advantages[~flat].numpy(), adv[~flat.numpy()], rtol=1e-5, atol=1e-6)


def test_clamp_limits_outliers():
    group_size = 30  # one outlier in a group of n has advantage sqrt(n - 1) > 5 before clamping
    rewards = torch.zeros(group_size)
    rewards[random.randrange(group_size)] = random.uniform(1.0, 10.0)
    ids = torch.zeros(group_size, dtype=torch.int64)
    out = group_advantages(rewards, ids, clamp=5.0)
    assert out.advantages.max().item() == 5.0
    unclamped = group_advantages(rewards, ids, clamp=float("inf"), eps=0.0)
    assert unclamped.advantages.max().item() == pytest.approx(np.sqrt(group_size - 1), rel=1e-4)
    small = group_advantages(rewards, ids, clamp=0.05)
    assert small.advantages.min().item() == pytest.approx(-0.05)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(std_mode="prompt"), "std_mode"),
        (dict(clamp=0.0), "clamp"),
        (dict(eps=-1.0), "eps"),
    ],
)
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(torch.rand(4), torch.tensor([0, 0, 1, 1]), **kwargs)


def test_bad_inputs():
    with pytest.raises(ValueError, match="group_ids"):
        group_advantages(torch.rand(4), torch.tensor([0.0, 0.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="group_ids"):
        group_advantages(torch.rand(4), torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="rewards"):
        group_advantages(torch.tensor([0.0, float("nan")]), torch.tensor([0, 0]))


def test_gather_is_identity_without_distributed():
    assert not dist.is_initialized()
    rewards, ids = torch.rand(5), torch.arange(5)
    all_rewards, all_ids = gather_rewards(rewards, ids)
    assert all_rewards is rewards and all_ids is ids


def _gather_worker(rank, world_size, init_file, payloads, out_dir):
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=60),
    )
    try:
        rewards, ids = payloads[rank]
        all_rewards, all_ids = gather_rewards(rewards, ids)
        torch.save((all_rewards, all_ids), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_gather_two_process_gloo_unequal_sizes():
    world_size = 2
    sizes = [random.randint(1, 4), random.randint(5, 9)]
    payloads = [(torch.randn(n, dtype=torch.float32), torch.randint(0, 2**40, (n,))) for n in sizes]
    with tempfile.TemporaryDirectory() as tmp:
        spawn_workers(_gather_worker, world_size, (os.path.join(tmp, "init"), payloads, tmp))
        expected_rewards = torch.cat([r for r, _ in payloads])
        expected_ids = torch.cat([i for _, i in payloads])
        for rank in range(world_size):
            all_rewards, all_ids = torch.load(os.path.join(tmp, f"rank{rank}.pt"))
            assert all_rewards.dtype == torch.float32 and all_ids.dtype == torch.int64
            assert torch.equal(all_rewards, expected_rewards)
            assert torch.equal(all_ids, expected_ids)
