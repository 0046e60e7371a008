"""Test-wide settings: one CPU thread per process (CI has 2 cores; distributed tests start several), and the
``slow`` marker on every multi-process test, so ``python -m pytest -q -m "not slow"`` is the fast inner loop
while ``python -m pytest -q`` still runs everything (README.md, "The two commands")."""

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

#: Every test here launches whole training runs (run_train.py under torchrun, several processes each).
SYSTEMS_TESTS = Path(__file__).parent / "systems"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``slow`` on the tests under tests/systems and on every ``distributed`` one (torchrun or spawned gloo
    workers), including test files added later; single-process tests that are slow carry it themselves."""
    for item in items:
        if item.get_closest_marker("distributed") or SYSTEMS_TESTS in item.path.parents:
            item.add_marker(pytest.mark.slow)
