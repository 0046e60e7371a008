"""Sigma grids against diffusers' scheduler/pipeline code and float64 references."""

import random

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.pipelines.flux.pipeline_flux import calculate_shift

from digenrl.algo.sigmas import (
    dance_sigmas,
    dynamic_shift_sigmas,
    flow_sigmas,
    flux_time_shift_mu,
    shift_sigmas,
    stretch_to_terminal,
)


@pytest.mark.parametrize("shift", [1.0, 3.0, "random"])
def test_flow_sigmas_equal_diffusers_static_shift(shift):
    shift = random.uniform(1.0, 6.0) if shift == "random" else shift
    for num_steps in (1, 10, 40, random.randint(2, 60)):
        scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
        scheduler.set_timesteps(num_steps)
        ours = flow_sigmas(num_steps, shift)
        assert ours.dtype == torch.float32 and ours.shape == (num_steps + 1,)
        assert torch.equal(ours, scheduler.sigmas), (shift, num_steps)
        assert ours[-1] == 0
        if shift in (1.0, 3.0):
            assert ours[0] == 1
        else:  # float32 rounding may leave 1 +- 1 ulp, exactly as diffusers does (see module docstring)
            assert abs(ours[0].item() - 1) <= 2**-23
        assert bool((ours[1:] < ours[:-1]).all())


def test_flow_sigmas_differ_from_plain_shifted_linspace_as_documented():
    # diffusers spaces towards the (twice shifted) training sigma_min, so the last step is tiny.
    diffusers_grid, plain_grid = flow_sigmas(10, 3.0), dance_sigmas(10, 3.0)
    assert diffusers_grid[-2] < 0.01
    assert plain_grid[-2] == pytest.approx(3 * 0.1 / (1 + 2 * 0.1), abs=1e-6)


def test_flux_mu_and_dynamic_grid_equal_diffusers():
    for image_seq_len in (256, 1024, 4096, random.randint(64, 8192)):
        mu = flux_time_shift_mu(image_seq_len)
        assert mu == calculate_shift(image_seq_len, 256, 4096, 0.5, 1.15)
        for num_steps in (1, 6, 28, random.randint(2, 50)):
            scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
            scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / num_steps, num_steps), mu=mu)
            ours = dynamic_shift_sigmas(num_steps, mu)
            assert ours.dtype == torch.float32 and ours.shape == (num_steps + 1,)
            assert torch.equal(ours, scheduler.sigmas), (image_seq_len, num_steps)


def test_dynamic_grid_float64_reference():
    mu, n = random.uniform(0.3, 1.5), random.randint(2, 30)
    t = np.linspace(1.0, 1 / n, n)
    expected = np.append(np.exp(mu) / (np.exp(mu) + (1 / t - 1)), 0.0)
    np.testing.assert_allclose(dynamic_shift_sigmas(n, mu).double().numpy(), expected, rtol=1e-6, atol=1e-7)


def test_dance_and_shift_sigmas_float64_reference():
    shift, n = random.uniform(0.5, 6.0), random.randint(1, 40)
    t = np.linspace(1.0, 0.0, n + 1)
    expected = shift * t / (1 + (shift - 1) * t)
    ours = dance_sigmas(n, shift)
    assert ours.dtype == torch.float32 and ours.shape == (n + 1,)
    np.testing.assert_allclose(ours.double().numpy(), expected, rtol=1e-6, atol=1e-7)
    x = torch.rand(17, dtype=torch.float64)
    np.testing.assert_allclose(shift_sigmas(x, shift).numpy(), (shift * x / (1 + (shift - 1) * x)).numpy())
    assert torch.equal(shift_sigmas(x, 1.0), x)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: flow_sigmas(0), "num_steps"),
        (lambda: flow_sigmas(5, -1.0), "shift"),
        (lambda: dance_sigmas(3, 0.0), "shift"),
        (lambda: dynamic_shift_sigmas(0, 0.5), "num_steps"),
        (lambda: flux_time_shift_mu(0), "image_seq_len"),
        (lambda: flow_sigmas(4, num_train_timesteps=0), "num_train_timesteps"),
    ],
)
def test_bad_arguments_name_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_stretch_to_terminal_matches_qwen_image_scheduler():
    """Qwen-Image's grid: dynamic shift then stretch so the last non-zero sigma is 0.02 (diffusers)."""
    n = int(torch.randint(4, 30, (1,)))
    mu = float(torch.empty(1).uniform_(0.3, 1.2))
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, shift_terminal=0.02)
    scheduler.set_timesteps(n, sigmas=np.linspace(1.0, 1 / n, n), mu=mu)
    ours = stretch_to_terminal(dynamic_shift_sigmas(n, mu), 0.02)
    torch.testing.assert_close(ours, scheduler.sigmas.to(torch.float32), rtol=0, atol=1e-6)
    assert abs(float(ours[-2]) - 0.02) < 1e-6 and float(ours[-1]) == 0.0
