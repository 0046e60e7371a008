"""Run a test worker in ``world`` processes with a hang guard (torch.multiprocessing).

The workers fork from the test session's preloaded fork server (tests/systems/preloaded_launch.py), which
imported torch, diffusers, peft, transformers and digenrl once: a spawned interpreter spent ~3 s of CPU
on those imports per worker, more than most of these tests compute. Each worker then takes the calling
test's environment (the server's is the one it started with), sees no GPU (the tests here are CPU gloo
tests) and runs ``fn`` as a spawned one would.

The guard tells a hang from slowness: on a loaded machine (CI's 2 cores, or a developer's shared with
other jobs) a 2-rank trainer test can take minutes of wall time while its workers keep computing, and a
fixed wall-clock limit failed such runs. A hung worker (a rank blocked in a collective its peer never
joins, a deadlocked queue) uses next to no CPU: the guard fails the test once the workers together used
less than ``IDLE_CPU_SHARE`` of one core over the last ``limit_s`` seconds, or after ``cap_s`` of wall
time whatever they did (a worker spinning forever). Where ``/proc`` is missing, ``limit_s`` is a plain
wall-clock limit, as before."""

from __future__ import annotations

import os
import time
from collections import deque

import pytest
import torch
import torch.multiprocessing as mp

from tests.systems.launcher import train_env
from tests.systems.preloaded_launch import ensure_fork_server

#: Below this share of one core over ``limit_s`` the workers are waiting, not computing: hung. Two ranks
#: blocked in gloo collectives use ~0.1 % (measured); a rank sharing 2 cores with 10 others still gets ~20 %.
IDLE_CPU_SHARE = 0.01
#: Wall-clock backstop for a worker that hangs while spinning.
CAP_S = 900.0
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` and its reaped children (``/proc/<pid>/stat``), or
    ``None`` where it cannot be read (not Linux, or the process is gone)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # after the command name, which may hold spaces
    return sum(int(x) for x in fields[11:15]) / _TICKS  # utime, stime, cutime, cstime


def _worker(rank: int, fn, env: dict[str, str], world: int, *args) -> None:
    os.environ.clear()
    os.environ.update(env)
    # CPU gloo workers: no GPU, as in the server (a process forked after CUDA was touched cannot use it)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    torch.set_num_threads(1)  # as tests/conftest.py sets it for the test process
    fn(rank, world, *args)


def spawn_workers(fn, world: int, args: tuple, limit_s: float = 60, cap_s: float = CAP_S) -> None:
    """``fn(rank, world, *args)`` in ``world`` processes (``fn`` a module-level function, as for a spawned
    process); a worker that raises fails the test, and so do workers that made no progress (CPU) for
    ``limit_s`` seconds or ran past ``cap_s``, instead of hanging the suite. Processes that already exited
    count as making no more progress."""
    ensure_fork_server(train_env())
    worker_args = (fn, dict(os.environ), world, *args)
    ctx = mp.start_processes(_worker, args=worker_args, nprocs=world, join=False, start_method="forkserver")
    start = time.monotonic()
    last: dict[int, float] = {}  # each rank's CPU seconds when last read (kept once it exited)
    samples: deque[tuple[float, float]] = deque()  # (time, the workers' CPU seconds so far)
    while not ctx.join(timeout=1):
        now = time.monotonic()
        for rank, p in enumerate(ctx.processes):
            used = process_cpu_s(p.pid)
            if used is not None:
                last[rank] = used
        if now - start > cap_s or (not last and now - start > limit_s):  # no /proc: wall clock only
            _fail(ctx, f"{world}-process test did not finish within {cap_s if last else limit_s} s")
        if not last:
            continue
        cpu = sum(last.values())
        samples.append((now, cpu))
        while len(samples) > 1 and now - samples[1][0] >= limit_s:
            samples.popleft()
        then, cpu_then = samples[0]
        if now - then >= limit_s and cpu - cpu_then < IDLE_CPU_SHARE * limit_s:
            alive = [rank for rank, p in enumerate(ctx.processes) if p.is_alive()]
            _fail(
                ctx,
                f"{world}-process test is hung: its workers used {cpu - cpu_then:.2f} s of CPU in the last "
                f"{now - then:.0f} s (ranks still running: {alive})",
            )


def _fail(ctx, message: str) -> None:
    for p in ctx.processes:
        p.terminate()
    pytest.fail(message)
