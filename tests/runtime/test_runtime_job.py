"""Stopping what a launcher started (digenrl/runtime/launch/job.py), on real process trees shaped like
torchrun's: an agent whose workers each run in a session of their own, out of reach of a signal to the agent's
group. The whole-run case (SIGTERM to ``python run_train.py``) is tests/systems/test_lifecycle.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from digenrl.runtime.launch.job import FORWARDED_SIGNALS, Job, LaunchInterrupted, descendants


def _agent(worker_code: str) -> list[str]:
    """A stand-in for torchrun: starts two workers in their own sessions, prints their pids, sleeps. Each
    worker writes ``ready`` (to the same pipe, in one ``write``) once it set itself up."""
    code = (
        "import subprocess, sys, time\n"
        f"kids = [subprocess.Popen([sys.executable, '-c', {worker_code!r}], start_new_session=True)"
        " for _ in range(2)]\n"
        "print('pids', *(k.pid for k in kids), flush=True)\n"
        "time.sleep(120)\n"
    )
    return [sys.executable, "-c", code]


SLEEPER = "import os, time; os.write(1, b'ready\\n'); time.sleep(120)"
#: a worker that ignores SIGTERM: only the SIGKILL after the grace ends it
STUBBORN = (
    "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); os.write(1, b'ready\\n'); "
    "time.sleep(120)"
)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _start(job: Job, worker_code: str) -> tuple[subprocess.Popen, list[int]]:
    agent = job.start(_agent(worker_code), stdout=subprocess.PIPE, text=True)
    lines = [agent.stdout.readline().split() for _ in range(3)]
    assert sorted(line[0] for line in lines) == ["pids", "ready", "ready"], lines
    workers = next([int(pid) for pid in line[1:]] for line in lines if line[0] == "pids")
    assert len(workers) == 2 and all(_running(pid) for pid in workers)
    assert {pid for pid, _ in descendants(agent.pid)} >= set(workers)
    return agent, workers


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_launcher_stops_the_agent_and_every_worker(signum):
    saved = {sig: signal.getsignal(sig) for sig in FORWARDED_SIGNALS}
    workers: list[int] = []
    with pytest.raises(LaunchInterrupted) as info, Job() as job:
        agent, workers = _start(job, SLEEPER)
        threading.Timer(0.1, os.kill, (os.getpid(), signum)).start()
        agent.wait(60)  # interrupted: the handler raises out of the blocked wait
    assert info.value.signum == signum and signal.Signals(signum).name in str(info.value)
    assert agent.returncode is not None
    assert not any(_running(pid) for pid in workers)
    assert {sig: signal.getsignal(sig) for sig in FORWARDED_SIGNALS} == saved  # handlers put back


def test_workers_that_ignore_sigterm_are_killed_after_the_grace():
    with Job(grace_s=0.5) as job:
        agent, workers = _start(job, STUBBORN)
        job.stop()
    assert agent.returncode is not None and not any(_running(pid) for pid in workers)


def test_leaving_the_block_with_an_error_stops_the_job():
    workers: list[int] = []
    with pytest.raises(RuntimeError, match="the caller failed"), Job() as job:
        _, workers = _start(job, SLEEPER)
        raise RuntimeError("the caller failed")
    assert not any(_running(pid) for pid in workers)
