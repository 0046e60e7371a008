"""Train-timestep selection and the sampler's SDE-step mask."""

import random

import pytest
import torch

from digenrl.algo.timesteps import sde_step_mask, select_train_steps


def _gen(seed=None):
    return torch.Generator().manual_seed(random.randrange(2**31) if seed is None else seed)


@pytest.mark.parametrize(
    "num_steps, fraction, count", [(10, 0.99, 9), (10, 1.0, 10), (10, 0.05, 1), (16, 0.6, 9)]
)
def test_first_mode_counts(num_steps, fraction, count):
    steps = select_train_steps(num_steps, fraction, "first")
    assert steps.dtype == torch.int64
    assert torch.equal(steps, torch.arange(count))


def test_first_mode_random_fraction_is_floor():
    n, f = random.randint(1, 50), random.uniform(0.01, 1.0)
    assert select_train_steps(n, f, "first").numel() == max(1, int(n * f))


def test_shuffled_mode_count_range_sorted_and_seeded():
    n, f = random.randint(4, 30), random.uniform(0.2, 1.0)
    seed = random.randrange(2**31)
    steps = select_train_steps(n, f, "shuffled", _gen(seed))
    assert steps.numel() == max(1, int(n * f))
    assert steps.unique().numel() == steps.numel()
    assert bool((steps >= 0).all() and (steps < n).all())
    assert torch.equal(steps, steps.sort().values)
    assert torch.equal(steps, select_train_steps(n, f, "shuffled", _gen(seed)))
    draws = {tuple(select_train_steps(10, 0.6, "shuffled", _gen()).tolist()) for _ in range(20)}
    assert len(draws) > 1


@pytest.mark.parametrize("num_steps, window", [(10, 2), (10, 3), (6, 3), (20, 2)])
def test_fast_window_inside_first_half_contiguous_seeded(num_steps, window):
    seed = random.randrange(2**31)
    starts = set()
    for i in range(200):
        steps = select_train_steps(num_steps, 1.0, "fast-window", _gen(seed + i), window=window)
        assert steps.numel() == window
        assert torch.equal(steps, torch.arange(steps[0].item(), steps[0].item() + window))
        assert steps[0] >= 0 and steps[-1] < num_steps // 2
        starts.add(steps[0].item())
    assert starts == set(range(num_steps // 2 - window + 1))  # every admissible window occurs
    assert torch.equal(
        select_train_steps(num_steps, 1.0, "fast-window", _gen(seed), window=window),
        select_train_steps(num_steps, 1.0, "fast-window", _gen(seed), window=window),
    )


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.5, float("nan")])
def test_bad_fraction_names_timestep_fraction(fraction):
    with pytest.raises(ValueError, match="timestep_fraction"):
        select_train_steps(10, fraction, "first")


def test_selection_errors():
    with pytest.raises(ValueError, match="generator"):
        select_train_steps(10, 0.5, "shuffled")
    with pytest.raises(ValueError, match="generator"):
        select_train_steps(10, 0.5, "fast-window")
    with pytest.raises(ValueError, match="window"):
        select_train_steps(10, 1.0, "fast-window", _gen(), window=6)
    with pytest.raises(ValueError, match="window"):
        select_train_steps(10, 1.0, "fast-window", _gen(), window=0)
    with pytest.raises(ValueError, match="mode"):
        select_train_steps(10, 0.5, "last")
    with pytest.raises(ValueError, match="num_steps"):
        select_train_steps(0, 0.5, "first")


def test_sde_step_mask():
    steps = select_train_steps(10, 1.0, "fast-window", _gen(), window=3)
    mask = sde_step_mask(10, steps, mode="fast-window")
    assert mask.dtype == torch.bool and mask.shape == (10,)
    assert torch.equal(mask.nonzero().flatten(), steps)
    for mode in ("first", "shuffled"):
        assert bool(sde_step_mask(10, torch.arange(3), mode=mode).all())
    with pytest.raises(ValueError, match="train_steps"):
        sde_step_mask(10, torch.tensor([10]), mode="fast-window")
    with pytest.raises(ValueError, match="mode"):
        sde_step_mask(10, torch.tensor([1]), mode="window")
