"""DiffusionNFT's forward-process loss (digenrl/algo/nft.py) against a computation by hand."""

from __future__ import annotations

import pytest
import torch

from digenrl.algo.nft import nft_loss, optimality_probability, velocity_kl


def test_optimality_probability_maps_the_clipped_advantage_to_0_1():
    r = optimality_probability(torch.tensor([-7.0, -5.0, -2.5, 0.0, 1.0, 5.0, 9.0]), 5.0)
    assert r.tolist() == pytest.approx([0.0, 0.0, 0.25, 0.5, 0.6, 1.0, 1.0])


def test_the_loss_of_two_units_by_hand():
    # unit 0: D = 2, σ = 0.5, A = 2.5 → r = 0.75; unit 1: σ = 0.25, A = −5 → r = 0
    v = torch.tensor([[1.0, -1.0], [0.5, 2.0]])
    v_old = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    x_t = torch.tensor([[1.0, 1.0], [0.0, 2.0]])
    x0 = torch.tensor([[0.0, 2.0], [1.0, 1.0]])
    sigma = torch.tensor([0.5, 0.25])
    adv = torch.tensor([2.5, -5.0])
    beta = 0.5
    terms = nft_loss(v, v_old, x_t, x0, sigma, adv, beta=beta, adv_clip_max=5.0)
    # unit 0: v⁺ = 0.5·v + 0.5·v_old = (0.5, −0.5); x̂0⁺ = x_t − 0.5·v⁺ = (0.75, 1.25); error (0.75, −0.75)
    #   w⁺ = 0.75, L⁺ = mean(0.5625, 0.5625)/0.75 = 0.75
    #   v⁻ = 1.5·v_old − 0.5·v = (−0.5, 0.5); x̂0⁻ = (1.25, 0.75); error (1.25, −1.25): w⁻ = 1.25, L⁻ = 1.25
    #   loss = 5·(0.75·0.75 + 0.25·1.25)/0.5 = 5·(0.5625 + 0.3125)/0.5 = 8.75
    # unit 1: v⁻ = 1.5·(1, 1) − 0.5·(0.5, 2) = (1.25, 0.5); x̂0⁻ = (0, 2) − 0.25·(1.25, 0.5) = (−0.3125, 1.875)
    #   error (−1.3125, 0.875): w⁻ = 1.09375, L⁻ = mean(1.72265625, 0.765625)/1.09375 = 1.1375
    #   loss = 5·(0 + 1·1.1375)/0.5 = 11.375
    assert terms.r.tolist() == pytest.approx([0.75, 0.0])
    assert terms.positive[0].item() == pytest.approx(0.75)
    assert terms.negative[0].item() == pytest.approx(1.25)
    assert terms.negative[1].item() == pytest.approx(1.1375)
    assert terms.loss.tolist() == pytest.approx([8.75, 11.375])


def test_a_positive_sample_pulls_the_velocity_to_its_clean_latent_and_a_negative_one_pushes():
    """One gradient step on v: toward x0's velocity (x_t − x0)/σ for r = 1, away from it for r = 0."""
    g = torch.Generator().manual_seed(0)
    x0, eps = torch.randn(1, 16, generator=g), torch.randn(1, 16, generator=g)
    sigma = torch.tensor([0.6])
    x_t = (1 - sigma) * x0 + sigma * eps
    target = (x_t - x0) / sigma  # the velocity whose x̂0 is x0
    v_start = target + 0.3 * torch.randn(1, 16, generator=g)
    for advantage, closer in ((5.0, True), (-5.0, False)):
        v = v_start.clone().requires_grad_(True)
        terms = nft_loss(v, v.detach(), x_t, x0, sigma, torch.tensor([advantage]), beta=1.0, adv_clip_max=5.0)
        terms.loss.sum().backward()
        stepped = v.detach() - 1e-3 * v.grad
        before, after = (v_start - target).norm(), (stepped - target).norm()
        assert bool(after < before) is closer, (advantage, before, after)


def test_velocity_kl_is_the_mean_squared_velocity_gap():
    assert velocity_kl(torch.tensor([[1.0, 3.0]]), torch.tensor([[0.0, 1.0]])).tolist() == [2.5]
