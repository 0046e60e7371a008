"""Test-wide settings: one CPU thread per process (CI has 2 cores; distributed tests start several), the
``slow`` marker on every multi-process test, so ``python -m pytest -q -m "not slow"`` is the fast inner loop
while ``python -m pytest -q`` still runs everything (README.md, "The two commands"), and the ``needs``
marker: ``@pytest.mark.needs("deepspeed")`` skips a test of an optional dependency, with the reason, where
the package is not installed. Every test's random draws are seeded (:func:`seeded`): a failure reproduces
with the same command, and ``DIGENRL_TEST_SEED=N`` draws another sample."""

import importlib.util
import os
import random
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

#: Every test here launches whole training runs (run_train.py under torchrun, several processes each).
SYSTEMS_TESTS = Path(__file__).parent / "systems"
#: Calls that always start worker processes (tests/runtime/spawn.py, torch.multiprocessing): a test whose
#: own body makes one is a multi-process test. (launch_torchrun is left out: a unit test fakes its
#: subprocess; whole runs live in tests/systems.)
MULTI_PROCESS_CALLS = frozenset({"spawn_workers", "start_processes"})


def is_multi_process(item: pytest.Item) -> bool:
    """Marked ``distributed``, under tests/systems, or spawning workers in its own body (so a multi-process
    test added without a marker still leaves the inner loop)."""
    if item.get_closest_marker("distributed") or SYSTEMS_TESTS in item.path.parents:
        return True
    code = getattr(getattr(item, "function", None), "__code__", None)
    return code is not None and not MULTI_PROCESS_CALLS.isdisjoint(code.co_names)


def missing_packages(names: tuple[str, ...]) -> list[str]:
    """The packages of ``names`` that are not installed. Found without importing them: importing deepspeed
    fixes its accelerator for the whole process (digenrl/trainer/parallel/deepspeed.py import_deepspeed)."""
    return [name for name in names if importlib.util.find_spec(name) is None]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``slow`` on every multi-process test (single-process tests that are slow carry it themselves); a skip
    naming the package on every test whose ``needs`` marker names one that is not installed."""
    for item in items:
        if is_multi_process(item):
            item.add_marker(pytest.mark.slow)
        missing = missing_packages(tuple(name for mark in item.iter_markers("needs") for name in mark.args))
        if missing:
            names, extras = ", ".join(missing), ",".join(missing)
            reason = f"needs {names} (optional), which is not installed: pip install 'digenrl[{extras}]'"
            item.add_marker(pytest.mark.skip(reason=reason))


def seed_of(nodeid: str) -> int:
    """The seed of one test: its node id's CRC32, mixed with ``DIGENRL_TEST_SEED`` when set."""
    return zlib.crc32(f"{os.environ.get('DIGENRL_TEST_SEED', '')}:{nodeid}".encode())


@pytest.fixture(autouse=True)
def seeded(request: pytest.FixtureRequest) -> int:
    """Seed Python's, numpy's and torch's global generators before every test (issue 33: tests drew
    unseeded random numbers, so a failure could not be replayed); returns the seed."""
    seed = seed_of(request.node.nodeid)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return seed


@pytest.fixture(scope="session")
def tiny_clipscore_server() -> Iterator[str]:
    """The URL of one ``python -m digenrl.rewards.serve --reward tiny-clipscore`` for the session (read by
    tests/rewards/test_rewards_remote.py and tests/systems/test_remote_reward.py); at the end SIGTERM must
    shut it down cleanly (tests/rewards/reward_server.py)."""
    from tests.rewards.reward_server import reward_server

    with reward_server("tiny-clipscore") as url:
        yield url
