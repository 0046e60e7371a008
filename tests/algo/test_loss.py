"""Clipped policy loss and KL penalty against float64 references; GRPO-Guard's RatioNorm on a drift."""

import math
import random

import pytest
import torch

from digenrl.algo.loss import clipped_policy_loss, kl_to_reference, ratio_norm_terms


def ref_loss(logp, old, adv, eps):
    ratio = torch.exp(logp.double() - old.double())
    unclipped = -adv.double() * ratio
    clipped = -adv.double() * ratio.clamp(1 - eps, 1 + eps)
    return torch.maximum(unclipped, clipped), ratio


def test_loss_matches_float64_reference_with_both_branches():
    n, eps = 64, random.choice([1e-4, 1e-3, 0.2])
    old = torch.randn(n)
    logp = old + torch.randn(n) * eps * 3  # about half the units fall outside the clip range
    adv = torch.randn(n)
    out = clipped_policy_loss(logp, old, adv, eps)
    expected, ratio = ref_loss(logp, old, adv, eps)
    assert out.loss.shape == out.ratio.shape == out.clipped.shape == (n,)
    torch.testing.assert_close(out.ratio.double(), ratio, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.loss.double(), expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(out.clipped, (out.ratio - 1).abs() > eps)
    away_from_edge = ((ratio - 1).abs() - eps).abs() > 1e-5  # float32 and float64 may differ at the edge
    assert torch.equal(out.clipped[away_from_edge], ((ratio - 1).abs() > eps)[away_from_edge])
    assert 0 < int(out.clipped.sum()) < n


def test_clipped_branch_values():
    eps = 0.1
    logp = torch.log(torch.tensor([1.5, 0.5, 1.5, 0.5]))
    adv = torch.tensor([2.0, 2.0, -2.0, -2.0])
    out = clipped_policy_loss(logp, torch.zeros(4), adv, eps)
    # A > 0: ratio above 1 + eps is capped, ratio below 1 - eps is not; mirror image for A < 0.
    expected = torch.tensor([-2.0 * 1.1, -2.0 * 0.5, 2.0 * 1.5, 2.0 * 0.9])
    torch.testing.assert_close(out.loss, expected)
    assert bool(out.clipped.all())


def test_on_policy_ratio_is_exactly_one_and_loss_is_minus_advantage():
    logp = torch.randn(16)
    adv = torch.randn(16)
    out = clipped_policy_loss(logp, logp.clone(), adv, 1e-4)
    assert torch.equal(out.ratio, torch.ones(16))
    assert torch.equal(out.loss, -adv)
    assert not bool(out.clipped.any())


def test_gradient_is_minus_advantage_times_ratio_inside_clip_range():
    eps = 0.05
    old = torch.randn(32)
    logp = (old + (torch.rand(32) - 0.5) * 0.05).requires_grad_(True)  # |log ratio| < 0.025 < eps
    adv = torch.randn(32)
    out = clipped_policy_loss(logp, old, adv, eps)
    out.loss.sum().backward()
    assert not bool(out.clipped.any())
    ratio = torch.exp(logp.detach().double() - old.double())
    torch.testing.assert_close(logp.grad.double(), -adv.double() * ratio)


def test_gradient_is_zero_where_the_clipped_branch_wins():
    logp = torch.log(torch.tensor([1.5, 0.5])).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0])
    clipped_policy_loss(logp, torch.zeros(2), adv, 0.1).loss.sum().backward()
    assert torch.equal(logp.grad, torch.zeros(2))


def test_old_log_prob_and_advantages_get_no_gradient():
    old = torch.randn(4, requires_grad=True)
    adv = torch.randn(4, requires_grad=True)
    logp = torch.randn(4, requires_grad=True)
    clipped_policy_loss(logp, old, adv, 0.2).loss.sum().backward()
    assert old.grad is None and adv.grad is None and logp.grad is not None


def test_loss_errors():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="clip_range"):
        clipped_policy_loss(x, x, x, 0.0)
    with pytest.raises(ValueError, match="shape"):
        clipped_policy_loss(x, x, torch.zeros(3, 1), 0.1)


@pytest.mark.parametrize("std_kind", ["per_sample", "float", "elementwise"])
def test_kl_matches_float64_reference(std_kind):
    shape = (3, 2, 4, 4)
    mean, ref_mean = torch.randn(shape), torch.randn(shape)
    std = {
        "per_sample": torch.rand(3, 1, 1, 1) + 0.1,
        "float": random.uniform(0.1, 1.0),
        "elementwise": torch.rand(shape) + 0.1,
    }[std_kind]
    std64 = torch.as_tensor(std, dtype=torch.float64)
    expected = ((mean.double() - ref_mean.double()) ** 2 / (2 * std64**2)).mean(dim=(1, 2, 3))
    kl = kl_to_reference(mean, ref_mean, std)
    assert kl.shape == (3,)
    torch.testing.assert_close(kl.double(), expected, rtol=1e-5, atol=1e-6)


def test_kl_flow_grpo_form_for_per_sample_std():
    # flow_grpo: mean over dims of the squared difference, then divided by 2 * std_dev_t**2.
    mean, ref_mean = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    std = torch.rand(2, 1, 1) + 0.2
    flow_grpo = ((mean - ref_mean) ** 2).mean(dim=(1, 2), keepdim=True) / (2 * std**2)
    torch.testing.assert_close(kl_to_reference(mean, ref_mean, std), flow_grpo.flatten())
    assert torch.equal(kl_to_reference(mean, mean.clone(), std), torch.zeros(2))


def test_kl_gradient_only_through_policy_mean_and_errors():
    mean = torch.randn(2, 4, requires_grad=True)
    ref_mean = torch.randn(2, 4, requires_grad=True)
    kl_to_reference(mean, ref_mean, 0.5).sum().backward()
    assert ref_mean.grad is None and mean.grad is not None
    with pytest.raises(ValueError, match="std"):
        kl_to_reference(mean, ref_mean, 0.0)
    with pytest.raises(ValueError, match="shape"):
        kl_to_reference(mean, ref_mean[:1], 0.5)


# ------------------------------------------------------------------------------- GRPO-Guard's RatioNorm


def _drifted_units(s: float, n: int = 512, d: int = 4096, drift: float = 0.01, seed: int = 0):
    """Units of one step with transition std ``s`` whose current mean has drifted by rms ``drift`` from the
    behaviour mean: (log p_θ, log p_old, μ_θ, μ_old, std), log-densities averaged over the elements."""
    g = torch.Generator().manual_seed(seed)
    old_mean = torch.randn(n, d, generator=g)
    mean = old_mean + drift * torch.randn(1, d, generator=g).expand(n, d)
    std = torch.full((n, 1), s)
    sample = old_mean + std * torch.randn(n, d, generator=g)

    def log_density(mu: torch.Tensor) -> torch.Tensor:
        return (-((sample - mu) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi)).mean(1)

    return log_density(mean), log_density(old_mean), mean, old_mean, std


def test_ratio_norm_recentres_a_drifted_ratio_and_makes_the_steps_consistent():
    eps, advantages = 1e-4, torch.ones(512)
    raw_means, norm_means, norm_spreads, raw_upper = [], [], [], []
    for s in (0.02, 0.2):  # an early, noisy step and a later one: same drift, different transition std
        log_prob, old_log_prob, mean, old_mean, std = _drifted_units(s)
        raw = clipped_policy_loss(log_prob, old_log_prob, advantages, eps)
        bias, scale = ratio_norm_terms(mean, old_mean, std)
        norm = clipped_policy_loss(
            log_prob, old_log_prob, advantages, eps, log_ratio_bias=bias, log_ratio_scale=scale
        )
        raw_means.append(raw.ratio.mean().item())
        norm_means.append(norm.ratio.mean().item())
        norm_spreads.append(norm.ratio.std().item())
        raw_upper.append((raw.ratio > 1 + eps).float().mean().item())
        # with RatioNorm, about a quarter of the positive-advantage units reach the upper clip at every step
        assert (norm.ratio > 1 + eps).float().mean().item() > 0.1
    # unnormalised: mean ≈ exp(−drift²/(2s²)) — far below 1 at the small-s step, and different per step
    assert raw_means[0] < 0.9 and raw_means[1] > 0.99
    assert raw_upper[0] == 0.0  # left shift: the upper clip never constrains a positive-advantage unit
    assert raw_means[0] == pytest.approx(math.exp(-(0.01**2) / (2 * 0.02**2)), rel=0.02)
    for m in norm_means:
        assert abs(m - 1) < 2e-5
    assert norm_spreads[0] == pytest.approx(norm_spreads[1], rel=0.2)  # one scale for every step


def test_ratio_norm_is_one_on_policy_and_carries_the_gradient_through_the_mean():
    log_prob, _, mean, _, std = _drifted_units(0.1, n=8, d=64)
    mean = mean.clone().requires_grad_(True)
    bias, scale = ratio_norm_terms(mean, mean.detach(), std)
    assert torch.equal(bias, torch.zeros(8))
    terms = clipped_policy_loss(
        log_prob, log_prob, torch.ones(8), 0.2, log_ratio_bias=bias, log_ratio_scale=scale
    )
    assert torch.equal(terms.ratio, torch.ones(8))
    # the bias is quadratic in the drift: zero gradient on-policy, a gradient once the mean has moved
    shifted = mean + 0.01
    bias, _ = ratio_norm_terms(shifted, mean.detach(), std)
    bias.sum().backward()
    assert mean.grad is not None and float(mean.grad.abs().sum()) > 0
