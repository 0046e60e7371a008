"""One run per out_dir (digenrl/runtime/run_folder/run_lock.py): a second job is refused naming the holder, a
lock left by a killed job is taken over and said so, a launcher's workers share its lock."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from digenrl.config import Config, ConfigError, apply_overrides
from digenrl.runtime.comm.distributed import DistContext
from digenrl.runtime.run_folder.run_lock import LOCK_FILE, TOKEN_ENV, acquire_run_lock, holds_run_lock
from digenrl.trainer.run_dir import agree_run_start

REPO = Path(__file__).resolve().parents[2]
#: A process that takes the lock, records a run id, says its token and then waits to be killed.
HOLDER = """
import sys, time
from digenrl.runtime.run_folder.run_lock import acquire_run_lock
lock, _ = acquire_run_lock(sys.argv[1])
lock.record("feedface")
print(lock.info["token"], flush=True)
time.sleep(600)
"""


@pytest.fixture
def holder(tmp_path):
    """Another job holding ``tmp_path/run``'s lock: (its process, its token)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "run")], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        token = proc.stdout.readline().strip()
        assert token, "the holder process did not start"
        yield proc, token
    finally:
        proc.kill()
        proc.wait()


def test_a_second_job_is_refused_naming_the_holder(tmp_path, holder):
    proc, _ = holder
    with pytest.raises(ConfigError) as info:
        acquire_run_lock(tmp_path / "run")
    message = str(info.value)
    assert (
        f"is in use by another run: pid {proc.pid} on host {socket.gethostname()}, run feedface, since "
        in message
    )
    assert str(tmp_path / "run" / LOCK_FILE) in message


def test_a_lock_left_by_a_killed_job_is_taken_over_and_said_so(tmp_path, holder):
    proc, _ = holder
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    lock, note = acquire_run_lock(tmp_path / "run")
    try:
        assert f"names pid {proc.pid} on host {socket.gethostname()}, run feedface" in note
        assert "no longer holds the lock (it ended without releasing it: killed or crashed)" in note
        assert json.loads((tmp_path / "run" / LOCK_FILE).read_text())["pid"] == os.getpid()
    finally:
        lock.release()
    assert (tmp_path / "run" / LOCK_FILE).read_text() == ""  # a clean end leaves no holder to report
    again, note = acquire_run_lock(tmp_path / "run")
    again.release()
    assert note == ""


def test_the_workers_of_the_launcher_holding_the_lock_share_it(tmp_path, holder, monkeypatch):
    proc, token = holder
    monkeypatch.setenv(TOKEN_ENV, "another job's token")
    with pytest.raises(ConfigError, match="in use by another run"):
        acquire_run_lock(tmp_path / "run")
    monkeypatch.setenv(TOKEN_ENV, token)
    lock, note = acquire_run_lock(tmp_path / "run")
    assert note == "" and lock.fd is None and holds_run_lock(tmp_path / "run")
    lock.record("decided-by-rank-0")  # the launcher's record gets the run id its rank 0 decided
    record = json.loads((tmp_path / "run" / LOCK_FILE).read_text())
    assert record["pid"] == proc.pid and record["run_id"] == "decided-by-rank-0"
    lock.release()


def _ctx() -> DistContext:
    return DistContext(0, 1, 0, torch.device("cpu"), "none", is_distributed=False)


def test_startup_holds_the_lock_with_the_run_id_and_a_refused_start_leaves_none(tmp_path, holder):
    out = tmp_path / "own"
    start = agree_run_start(apply_overrides(Config(), [f"out_dir={out}"]), _ctx())
    record = json.loads((out / LOCK_FILE).read_text())
    assert record["run_id"] == start.run_id and record["pid"] == os.getpid() and holds_run_lock(out)
    acquire_run_lock(out)[0].release()

    (out / "metrics.jsonl").write_text('{"iteration": 0}\n')  # a run is there: a new one is refused
    with pytest.raises(ConfigError, match="already holds a run"):
        agree_run_start(apply_overrides(Config(), [f"out_dir={out}"]), _ctx())
    assert not holds_run_lock(out) and (out / LOCK_FILE).read_text() == ""

    with pytest.raises(ConfigError, match=f"in use by another run: pid {holder[0].pid}"):
        agree_run_start(apply_overrides(Config(), [f"out_dir={tmp_path / 'run'}"]), _ctx())
