"""Classifier-free guidance helpers."""

import random

import pytest
import torch

from digenrl.algo.guidance import apply_cfg, double_for_cfg, split_cfg_output


def test_apply_cfg_matches_float64_reference():
    v_c, v_u = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    w = random.uniform(1.0, 8.0)
    expected = v_u.double() + w * (v_c.double() - v_u.double())
    torch.testing.assert_close(apply_cfg(v_c, v_u, w).double(), expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(apply_cfg(v_c, v_u, 0.0), v_u)
    with pytest.raises(ValueError, match="shape"):
        apply_cfg(v_c, v_u[:1], w)


def test_double_and_split_round_trip_in_uncond_cond_order():
    x = torch.randn(3, 4)
    doubled = double_for_cfg(x)
    assert doubled.shape == (6, 4)
    out = torch.cat([x - 1, x + 1])  # a "model" that returns [uncond; cond]
    v_u, v_c = split_cfg_output(out)
    assert torch.equal(v_u, x - 1) and torch.equal(v_c, x + 1)
    assert torch.equal(doubled[:3], doubled[3:])
    with pytest.raises(ValueError, match="even"):
        split_cfg_output(torch.randn(3, 4))
