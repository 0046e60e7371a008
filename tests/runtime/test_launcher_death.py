"""One job per run, always (issue 35, item 3; digenrl/runtime/launch/job.py, run_lock.py): a SIGKILL of the
launcher ends its agent (parent-death signal) and the agent's workers (each watches the launcher), and
while a worker of the run lives a new job is refused naming its pid. Three tiny processes, ~2 s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from digenrl.config import ConfigError
from digenrl.runtime.launch.job import _exists
from digenrl.runtime.run_folder.run_lock import acquire_run_lock, live_worker, release_run_locks

REPO = Path(__file__).resolve().parents[2]
#: A worker: registers in the run folder, watches its launcher, says its pid, waits.
WORKER = """
import os, sys, time
from digenrl.runtime.launch.job import exit_with_launcher
from digenrl.runtime.run_folder.run_lock import register_worker
exit_with_launcher()
register_worker(sys.argv[1])
print(os.getpid(), flush=True)
time.sleep(120)
"""
#: The agent (torchrun's place): starts the worker in a session of its own, as torchrun does.
AGENT = """
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1]], start_new_session=True)
worker.wait()
"""
#: The launcher: starts the agent through Job (parent-death signal, launcher id in the environment).
LAUNCHER = """
import sys, time
from digenrl.runtime.launch.job import Job
job = Job()
job.start([sys.executable, "-c", sys.argv[2], sys.argv[1], sys.argv[3]])
print(job.procs[0].pid, flush=True)
time.sleep(120)
"""


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _exists(pid) or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z":
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal and /proc: Linux")
def test_a_killed_launcher_takes_its_workers_and_no_job_starts_while_one_lives(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(run), AGENT, WORKER], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        agent = int(launcher.stdout.readline())
        deadline = time.monotonic() + 30
        while live_worker(run) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        worker = live_worker(run)
        assert worker is not None and worker != agent
        with pytest.raises(ConfigError, match=rf"worker pid {worker} of an earlier job .*kill {worker}"):
            acquire_run_lock(run)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        assert _gone_within(agent, 5.0), "the agent outlived its launcher"
        assert _gone_within(worker, 5.0), "the worker outlived its launcher"
        assert live_worker(run) is None
        lock, _ = acquire_run_lock(run)  # nothing of the old job lives: the new one starts
        assert lock.fd is not None
    finally:
        release_run_locks()
        launcher.kill()
        launcher.wait()
        for pid in (locals().get("agent"), locals().get("worker")):
            if pid and _exists(pid):
                os.kill(pid, signal.SIGKILL)
