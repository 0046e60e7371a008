"""Flow-SDE / CPS / DanceGRPO steps against independent float64 references and diffusers' Euler step."""

import math
import random

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from digenrl.algo.sde_step import dance_step, euler_step, flow_sde_step
from digenrl.algo.sigmas import dance_sigmas, flow_sigmas

SHAPES = [(3,), (4, 5), (2, 3, 4, 4), (2, 2, 3, 4, 2)]


def _dims(t):
    return tuple(range(1, t.ndim))


def _col(values, ndim):
    """[B] float64 → [B, 1, ..., 1]."""
    return values.double().reshape(-1, *([1] * (ndim - 1)))


def _random_step_pair(grid, batch, include_first=True):
    """Per-sample (sigma, sigma_next) tensors [B] drawn from consecutive grid entries."""
    idx = torch.randint(0, len(grid) - 1, (batch,))
    if include_first:
        idx[0] = 0  # always exercise the sigma == 1 guard
    return grid[idx], grid[idx + 1]


def _inputs(shape):
    return torch.randn(shape), torch.randn(shape)


def ref_flowgrpo_sde(v, x, s, sn, a, sigma1):
    """flow_grpo sd3_sde_with_logprob.py, sde_type='sde', in float64 and in the reference's own form."""
    v, x = v.double(), x.double()
    s, sn = _col(s, x.ndim), _col(sn, x.ndim)
    dt = sn - s
    # flow_grpo tests `sigma == 1`; we also count float32 1 +- 1 ulp (shifted grids) as 1, see SIGMA_ONE_ATOL.
    at_one = (s - 1).abs() <= 1e-6
    std_dev_t = a * torch.sqrt(s / (1 - torch.where(at_one, torch.full_like(s, sigma1), s)))
    mean = x * (1 + std_dev_t**2 / (2 * s) * dt) + v * (1 + std_dev_t**2 * (1 - s) / (2 * s)) * dt
    return mean, std_dev_t * torch.sqrt(-dt), std_dev_t


def ref_cps(v, x, s, sn, a):
    v, x = v.double(), x.double()
    s, sn = _col(s, x.ndim), _col(sn, x.ndim)
    std = sn * math.sin(a * math.pi / 2)
    mean = (x - s * v) * (1 - sn) + (x + (1 - s) * v) * torch.sqrt(sn**2 - std**2)
    return mean, std


def ref_dance(v, x, s, sn, eta):
    """DanceGRPO fastvideo/train_grpo_flux.py flux_step(sde_solver=True), float64."""
    v, x = v.double(), x.double()
    s, sn = _col(s, x.ndim), _col(sn, x.ndim)
    dsigma = sn - s
    mean = x + dsigma * v
    x0 = x - s * v
    score = -(x - x0 * (1 - s)) / s**2
    mean = mean + (-0.5 * eta**2 * score) * dsigma
    return mean, eta * torch.sqrt(s - sn)


def assert_log_prob_close(actual, prev, mean, std, expected):
    """float32 rounds x' and mu to about eps32*|x'|, so z = (x' - mu)/std carries up to ~2*eps32*|x'|/std:
    the per-sample tolerance follows that bound (it matters only for the near-deterministic last steps)."""
    eps32 = torch.finfo(torch.float32).eps
    dims = tuple(range(1, prev.ndim))
    prev = prev.double()
    if prev.ndim > 1:
        scale = prev.abs().amax(dim=dims) * (prev - mean).abs().amax(dim=dims)
        std_min = std.expand_as(mean).amin(dim=dims)
    else:
        scale, std_min = prev.abs() * (prev - mean).abs(), std.expand_as(mean)
    bound = 1e-4 * (1 + expected.abs()) + 8 * eps32 * scale / std_min**2
    assert bool(((actual.double() - expected).abs() <= bound).all()), (actual, expected, bound)


def ref_log_prob(prev, mean, std):
    lp = torch.distributions.Normal(mean, std.expand_as(mean)).log_prob(prev.double())
    return lp.mean(dim=_dims(lp)) if lp.ndim > 1 else lp


@pytest.mark.parametrize("shape", SHAPES)
def test_sde_matches_float64_reference(shape):
    grid = flow_sigmas(random.choice([6, 10, 20]), random.uniform(1.0, 4.0))
    a = random.uniform(0.3, 1.3)
    s, sn = _random_step_pair(grid, shape[0])
    v, x = _inputs(shape)
    noise = torch.randn(shape)
    out = flow_sde_step(v, x, s, sn, noise_level=a, noise=noise, sigma_max=grid[1].item())
    mean, std, std_dev_t = ref_flowgrpo_sde(v, x, s, sn, a, grid[1].item())
    assert out.prev_sample.dtype == out.log_prob.dtype == out.mean.dtype == out.std.dtype == torch.float32
    assert out.log_prob.shape == (shape[0],)
    torch.testing.assert_close(out.mean.double(), mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.std.double(), std, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(out.noise_scale.double(), std_dev_t, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(out.prev_sample.double(), mean + std * noise.double(), rtol=1e-5, atol=1e-5)
    expected_lp = ref_log_prob(out.prev_sample, mean, std)
    assert_log_prob_close(out.log_prob, out.prev_sample, mean, std, expected_lp)


def test_sde_log_prob_equals_torch_normal_on_own_mean_and_std():
    shape = random.choice(SHAPES)
    grid = flow_sigmas(10, 3.0)
    s, sn = _random_step_pair(grid, shape[0])
    v, x = _inputs(shape)
    out = flow_sde_step(v, x, s, sn, noise_level=0.7, noise=torch.randn(shape), sigma_max=grid[1].item())
    lp = torch.distributions.Normal(out.mean, out.std.expand_as(out.mean)).log_prob(out.prev_sample)
    expected = lp.mean(dim=_dims(lp)) if lp.ndim > 1 else lp
    torch.testing.assert_close(out.log_prob, expected, rtol=1e-5, atol=1e-5)


def test_scalar_sigmas_equal_per_sample_tensor_sigmas():
    shape = (3, 2, 4)
    grid = flow_sigmas(10, 3.0)
    i = random.randint(1, 9)
    v, x = _inputs(shape)
    noise = torch.randn(shape)
    by_float = flow_sde_step(v, x, grid[i].item(), grid[i + 1].item(), noise_level=0.7, noise=noise)
    by_tensor = flow_sde_step(v, x, grid[i].expand(3), grid[i + 1].expand(3), noise_level=0.7, noise=noise)
    for field in ("prev_sample", "log_prob", "mean", "std"):
        assert torch.equal(getattr(by_float, field), getattr(by_tensor, field))


@pytest.mark.parametrize("kind", ["sde", "cps", "dance"])
def test_given_prev_sample_gives_bitwise_same_log_prob_as_sampling(kind):
    shape = (4, 3, 4, 4)
    grid = flow_sigmas(10, 3.0)
    s, sn = _random_step_pair(grid, shape[0])
    v, x = _inputs(shape)

    def step(**kw):
        if kind == "dance":
            return dance_step(v, x, s, sn, eta=0.3, **kw)
        return flow_sde_step(v, x, s, sn, noise_level=0.8, sde_type=kind, sigma_max=grid[1].item(), **kw)

    sampled = step(noise=torch.randn(shape))
    scored = step(prev_sample=sampled.prev_sample)
    assert torch.equal(sampled.log_prob, scored.log_prob)
    assert torch.equal(scored.prev_sample, sampled.prev_sample)
    assert torch.equal(torch.exp(scored.log_prob - sampled.log_prob), torch.ones(shape[0]))


@pytest.mark.parametrize("shape", SHAPES)
def test_cps_matches_float64_reference(shape):
    grid = flow_sigmas(random.choice([6, 10]), 3.0)
    a = random.choice([random.uniform(0.3, 1.0), 1.0, 0.999])  # near 1 the reference's sqrt form cancels
    s, sn = _random_step_pair(grid, shape[0])
    v, x = _inputs(shape)
    noise = torch.randn(shape)
    out = flow_sde_step(v, x, s, sn, noise_level=a, sde_type="cps", noise=noise)
    mean, std = ref_cps(v, x, s, sn, a)
    torch.testing.assert_close(out.mean.double(), mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.std.double(), std, rtol=1e-5, atol=1e-7)
    prev = mean + std * noise.double()
    torch.testing.assert_close(out.prev_sample.double(), prev, rtol=1e-5, atol=1e-5)
    expected_lp = -((out.prev_sample.double() - mean) ** 2)
    expected_lp = expected_lp.mean(dim=_dims(expected_lp)) if expected_lp.ndim > 1 else expected_lp
    # no 1/std^2 in the cps log-prob: the float32 rounding bound is scaled by std^2 = 1 here
    assert_log_prob_close(out.log_prob, out.prev_sample, mean, torch.ones_like(std), expected_lp)


def test_cps_last_step_has_zero_std_and_zero_log_prob():
    grid = flow_sigmas(10, 3.0)
    shape = (2, 3, 4)
    v, x = _inputs(shape)
    out = flow_sde_step(v, x, grid[-2].item(), 0.0, noise_level=0.8, sde_type="cps", noise=torch.randn(shape))
    assert torch.equal(out.std, torch.zeros_like(out.std))
    assert torch.equal(out.prev_sample, out.mean)
    assert torch.equal(out.log_prob, torch.zeros(2))


@pytest.mark.parametrize("shape", SHAPES)
def test_dance_matches_float64_reference(shape):
    grid = dance_sigmas(random.choice([8, 16]), random.uniform(1.0, 5.0))
    eta = random.uniform(0.1, 0.5)
    s, sn = _random_step_pair(grid, shape[0])
    v, x = _inputs(shape)
    noise = torch.randn(shape)
    out = dance_step(v, x, s, sn, eta=eta, noise=noise)
    mean, std = ref_dance(v, x, s, sn, eta)
    torch.testing.assert_close(out.mean.double(), mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.std.double(), std, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(out.prev_sample.double(), mean + std * noise.double(), rtol=1e-5, atol=1e-5)
    expected_lp = ref_log_prob(out.prev_sample, mean, std)
    assert_log_prob_close(out.log_prob, out.prev_sample, mean, std, expected_lp)


def test_dance_log_ratio_equals_dancegrpo_constant_free_log_ratio():
    # DanceGRPO's logged value drops -log(std) - log(sqrt(2 pi)); ratios between two policies must agree.
    shape = (3, 2, 4, 4)
    grid = dance_sigmas(16, 3.0)
    s, sn = _random_step_pair(grid, shape[0])
    x = torch.randn(shape)
    v_old, v_new = torch.randn(shape), torch.randn(shape)
    prev = dance_step(v_old, x, s, sn, eta=0.3, noise=torch.randn(shape)).prev_sample
    ours = [dance_step(v, x, s, sn, eta=0.3, prev_sample=prev).log_prob.double() for v in (v_old, v_new)]
    theirs = []
    for v in (v_old, v_new):
        mean, std = ref_dance(v, x, s, sn, 0.3)
        theirs.append((-((prev.double() - mean) ** 2) / (2 * std**2)).mean(dim=(1, 2, 3)))
    torch.testing.assert_close(ours[1] - ours[0], theirs[1] - theirs[0], rtol=1e-4, atol=1e-4)


def test_noise_level_zero_equals_diffusers_euler_step():
    num_steps, shift = random.choice([4, 10]), random.uniform(1.0, 4.0)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(num_steps)
    grid = flow_sigmas(num_steps, shift)
    shape = (2, 3, 4, 4)
    x = torch.randn(shape)
    for i, t in enumerate(scheduler.timesteps):
        v = torch.randn(shape)
        expected = scheduler.step(v, t, x).prev_sample
        s, sn = grid[i].item(), grid[i + 1].item()
        outs = [
            flow_sde_step(v, x, s, sn, noise_level=0.0),
            flow_sde_step(v, x, s, sn, noise_level=0.0, sde_type="cps", noise=torch.randn(shape)),
            dance_step(v, x, s, sn, eta=0.0),
        ]
        assert torch.equal(euler_step(v, x, s, sn), expected)
        for out in outs:
            assert torch.equal(out.prev_sample, expected)
            assert torch.equal(out.mean, expected)
            assert torch.equal(out.log_prob, torch.zeros(2))
            assert torch.equal(out.std, torch.zeros_like(out.std))
        x = expected


def test_noise_level_zero_scores_given_sample_without_nan():
    grid = flow_sigmas(10, 3.0)
    shape = (2, 5)
    v, x = _inputs(shape)
    prev = torch.randn(shape)
    out = flow_sde_step(v, x, grid[0].item(), grid[1].item(), noise_level=0.0, prev_sample=prev)
    assert torch.equal(out.prev_sample, prev)
    assert torch.equal(out.log_prob, torch.zeros(2))


def test_bf16_inputs_are_computed_in_float32():
    shape = (2, 3, 4, 4)
    grid = flow_sigmas(10, 3.0)
    s, sn = _random_step_pair(grid, shape[0])
    v, x = (t.to(torch.bfloat16) for t in _inputs(shape))
    noise = torch.randn(shape)
    out = flow_sde_step(v, x, s, sn, noise_level=0.7, noise=noise, sigma_max=grid[1].item())
    ref = flow_sde_step(v.float(), x.float(), s, sn, noise_level=0.7, noise=noise, sigma_max=grid[1].item())
    for field in ("prev_sample", "log_prob", "mean", "std"):
        assert getattr(out, field).dtype == torch.float32
        assert torch.equal(getattr(out, field), getattr(ref, field))
    mean, _, _ = ref_flowgrpo_sde(v, x, s, sn, 0.7, grid[1].item())
    torch.testing.assert_close(out.mean.double(), mean, rtol=1e-5, atol=1e-5)
    assert euler_step(v, x, 0.5, 0.25).dtype == torch.float32


def test_log_prob_gradient_flows_through_velocity_only():
    shape = (2, 3, 4)
    grid = flow_sigmas(10, 3.0)
    s, sn = _random_step_pair(grid, shape[0], include_first=False)
    v = torch.randn(shape, dtype=torch.float64)
    x = torch.randn(shape)
    prev = torch.randn(shape).requires_grad_(True)
    v32 = v.float().requires_grad_(True)
    out = flow_sde_step(v32, x, s, sn, noise_level=0.7, prev_sample=prev, sigma_max=grid[1].item())
    out.log_prob.sum().backward()
    assert prev.grad is None
    v64 = v.float().double().requires_grad_(True)
    mean, std, _ = ref_flowgrpo_sde(v64, x, s, sn, 0.7, grid[1].item())
    ref_log_prob(prev.detach(), mean, std).sum().backward()
    torch.testing.assert_close(v32.grad.double(), v64.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("sigma0", [1.0, math.nextafter(1.0, 0.0), math.nextafter(1.0, 2.0)])
def test_sigma_rounded_near_one_uses_the_sigma_max_guard(sigma0):
    sigma0 = float(torch.tensor(sigma0, dtype=torch.float32))  # 1 - 1 ulp / 1 / 1 + 1 ulp in float32
    shape = (2, 3, 4)
    v, x = _inputs(shape)
    sigma1 = 0.96
    out = flow_sde_step(v, x, sigma0, sigma1, noise_level=0.7, noise=torch.randn(shape), sigma_max=sigma1)
    expected_scale = 0.7 * math.sqrt(sigma0 / (1 - sigma1))
    torch.testing.assert_close(out.noise_scale.flatten(), torch.full((2,), expected_scale), rtol=1e-6, atol=0)
    assert bool(torch.isfinite(out.prev_sample).all() and torch.isfinite(out.log_prob).all())


def test_sigma_one_requires_sigma_max():
    shape = (2, 4)
    v, x = _inputs(shape)
    with pytest.raises(ValueError, match="sigma_max"):
        flow_sde_step(v, x, 1.0, 0.9, noise_level=0.7, noise=torch.randn(shape))
    # the guard only matters for 'sde'; cps and Euler are fine at sigma = 1
    flow_sde_step(v, x, 1.0, 0.9, noise_level=0.7, sde_type="cps", noise=torch.randn(shape))
    flow_sde_step(v, x, 1.0, 0.9, noise_level=0.0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(noise_level=0.7), "noise"),
        (dict(noise_level=0.7, noise="n", prev_sample="n"), "not both"),
        (dict(noise_level=0.7, noise="n", sde_type="ode"), "sde_type"),
        (dict(noise_level=-0.1, noise="n"), "noise_level"),
        (dict(noise_level=1.2, noise="n", sde_type="cps"), "noise_level"),
        (dict(noise_level=0.7, noise="short"), "noise"),
    ],
)
def test_flow_sde_step_errors(kwargs, match):
    shape = (2, 4)
    v, x = _inputs(shape)
    kwargs = {
        k: (torch.randn(shape) if val == "n" else torch.randn(2, 3) if val == "short" else val)
        for k, val in kwargs.items()
    }
    with pytest.raises(ValueError, match=match):
        flow_sde_step(v, x, 0.5, 0.4, **kwargs)


def test_dance_step_errors_and_bad_sigmas():
    shape = (2, 4)
    v, x = _inputs(shape)
    with pytest.raises(ValueError, match="noise"):
        dance_step(v, x, 0.5, 0.4, eta=0.3)
    with pytest.raises(ValueError, match="not both"):
        dance_step(v, x, 0.5, 0.4, eta=0.3, noise=torch.randn(shape), prev_sample=torch.randn(shape))
    with pytest.raises(ValueError, match="sigma"):
        euler_step(v, x, 0.4, 0.5)  # not a denoising step
    with pytest.raises(ValueError, match="sigma"):
        euler_step(v, x, torch.tensor([0.5, 0.5, 0.5]), 0.4)  # wrong batch size
    with pytest.raises(ValueError, match="shape"):
        euler_step(v, torch.randn(2, 5), 0.5, 0.4)
