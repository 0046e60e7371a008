"""MixGRPO's sliding window (digenrl/algo/timesteps.py) and MixGRPO-Flash's DPM-Solver++(2M) step."""

from __future__ import annotations

import math

import pytest
import torch

from digenrl.algo.sde_step import dpm_solver_2m_step, euler_step
from digenrl.algo.sigmas import flow_sigmas
from digenrl.algo.timesteps import MixWindow, sde_step_mask
from digenrl.config import AlgoConfig
from digenrl.rules.schedule import trained_step_count


def test_progressive_window_moves_by_stride_every_interval_and_starts_over():
    # 25 steps, w = 4, s = 1, τ = 25 (the published script): 22 positions 0..21, one per 25 iterations
    w = MixWindow(size=4, stride=1, shift_interval=25)
    starts = [w.start(25, n) for n in range(0, 25 * 23, 25)]
    assert starts == [*range(22), 0]
    assert [w.start(25, n) for n in (0, 24, 25, 49, 50)] == [0, 0, 1, 1, 2]
    assert w.steps(25, 25 * 21).tolist() == [21, 22, 23, 24]  # the last position ends at the last step
    # a stride that does not divide the positions: 0, 3, 6 (9 would not fit in 10 − 3 + 1 = 8 starts)
    w3 = MixWindow(size=3, stride=3, shift_interval=2)
    assert [w3.start(10, n) for n in range(0, 10)] == [0, 0, 3, 3, 6, 6, 0, 0, 3, 3]


def test_every_window_holds_size_steps_inside_the_trajectory():
    for steps, size, stride, interval in [(10, 1, 1, 1), (10, 10, 1, 1), (7, 3, 2, 3), (25, 4, 1, 25)]:
        w = MixWindow(size, stride, interval)
        for n in range(0, 200, 3):
            idx = w.steps(steps, n)
            assert idx.numel() == size and int(idx[0]) >= 0 and int(idx[-1]) < steps
            assert torch.equal(idx, torch.arange(int(idx[0]), int(idx[0]) + size))


def test_random_window_is_uniform_over_the_starts_and_seeded():
    w = MixWindow(size=3, schedule="random")
    starts = [w.start(8, 0, torch.Generator().manual_seed(s)) for s in range(400)]
    assert set(starts) == set(range(6))  # 8 − 3 + 1 positions, every one drawn
    assert w.start(8, 5, torch.Generator().manual_seed(7)) == w.start(8, 9, torch.Generator().manual_seed(7))
    with pytest.raises(ValueError, match="Generator"):
        w.start(8, 0)


def test_a_window_larger_than_the_trajectory_is_refused():
    with pytest.raises(ValueError, match="window size"):
        MixWindow(size=5).start(4, 0)


def test_the_window_is_the_only_stochastic_part():
    mask = sde_step_mask(6, torch.tensor([2, 3]), mode="mixgrpo")
    assert mask.tolist() == [False, False, True, True, False, False]


def test_trained_step_count_is_the_window_for_mixgrpo():
    assert trained_step_count(AlgoConfig(name="mixgrpo", mix_window=4), 25) == 4
    assert trained_step_count(AlgoConfig(), 25) == 24  # FlowGRPO: ⌊25 · 0.99⌋
    assert trained_step_count(AlgoConfig(timestep_selection="fast-window", fast_window=3), 25) == 3


def _gaussian_flow(a: float):
    """Data N(0, a²): the exact x̂0 = E[x0 | x_σ] and the exact ODE solution x(σ) = z·sqrt((1−σ)²a² + σ²)."""

    def velocity(x: torch.Tensor, sigma: float) -> torch.Tensor:
        x0 = (1 - sigma) * a**2 * x / ((1 - sigma) ** 2 * a**2 + sigma**2)
        return (x - x0) / sigma

    def exact(z: torch.Tensor, sigma: float) -> torch.Tensor:
        return z * math.sqrt((1 - sigma) ** 2 * a**2 + sigma**2)

    return velocity, exact


def test_dpm_solver_2m_is_more_accurate_than_euler_on_a_curved_flow():
    velocity, exact = _gaussian_flow(a=0.3)
    z = torch.linspace(-2, 2, 9).reshape(9, 1)
    sigmas = flow_sigmas(8, shift=3.0).tolist()
    start = 2  # the ODE part after a window ending at step 1
    x_euler = x_dpm = exact(z, sigmas[start])
    prev_x0, prev_sigma = None, None
    for i in range(start, 8):
        s, s_next = sigmas[i], sigmas[i + 1]
        x_euler = euler_step(velocity(x_euler, s), x_euler, s, s_next)
        x_dpm, x0 = dpm_solver_2m_step(
            velocity(x_dpm, s), x_dpm, s, s_next, prev_x0=prev_x0, prev_sigma=prev_sigma
        )
        prev_x0, prev_sigma = x0, s
    target = exact(z, 0.0)
    err_euler = (x_euler - target).abs().max().item()
    err_dpm = (x_dpm - target).abs().max().item()
    assert err_dpm < 0.5 * err_euler, (err_dpm, err_euler)


def test_dpm_solver_2m_without_history_is_the_euler_step():
    g = torch.Generator().manual_seed(0)
    v, x = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
    out, x0 = dpm_solver_2m_step(v, x, 0.6, 0.4)
    assert torch.allclose(out, euler_step(v, x, 0.6, 0.4), atol=1e-6)
    assert torch.allclose(x0, x - 0.6 * v)
    # into σ' = 0 the step stays first order whatever the history (diffusers' lower_order_final)
    last, _ = dpm_solver_2m_step(v, x, 0.2, 0.0, prev_x0=torch.zeros_like(x), prev_sigma=0.4)
    assert torch.allclose(last, euler_step(v, x, 0.2, 0.0), atol=1e-6)
