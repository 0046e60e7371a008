"""Run a test worker in ``world`` spawned processes with a wall-clock limit (torch.multiprocessing)."""

from __future__ import annotations

import time

import pytest
import torch.multiprocessing as mp


def spawn_workers(fn, world: int, args: tuple, limit_s: float = 60) -> None:
    """``fn(rank, world, *args)`` in ``world`` processes; a worker that raises fails the test, and a run
    past ``limit_s`` is terminated and fails it too, instead of hanging the suite."""
    ctx = mp.start_processes(fn, args=(world, *args), nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + limit_s
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.terminate()
            pytest.fail(f"{world}-process test did not finish within {limit_s} s")
