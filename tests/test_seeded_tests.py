"""Every test's random draws are seeded (tests/conftest.py ``seeded``): the same test draws the same
numbers in every run, and another test draws others."""

from __future__ import annotations

import random

import numpy as np
import torch

from tests.conftest import seed_of


def _draws(seed: int) -> tuple[float, float, float]:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_a_tests_draws_are_its_seeds(request, seeded):
    drawn = random.random(), float(np.random.rand()), float(torch.rand(()))
    assert seeded == seed_of(request.node.nodeid)
    assert drawn == _draws(seeded)


def test_another_test_has_another_seed(request, seeded):
    assert seeded != seed_of(request.node.nodeid.replace("another", "a"))
