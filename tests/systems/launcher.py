"""Run ``experiments/run_train.py`` in a subprocess, plainly or under torchrun, for system tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUN_TRAIN = REPO / "experiments" / "run_train.py"
TINY = REPO / "experiments" / "configs" / "tiny.yaml"


def train_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", DIGENRL_THREADS="1", PYTHONUNBUFFERED="1", TORCH_CPP_LOG_LEVEL="ERROR")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def train_command(overrides: list[str], nproc: int = 0) -> list[str]:
    """``nproc=0``: a plain single process; otherwise ``torchrun --standalone --nproc_per_node``."""
    if nproc:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    else:
        cmd = [sys.executable]
    return [*cmd, str(RUN_TRAIN), "--config", str(TINY), *overrides]


def run_train(
    overrides: list[str], *, nproc: int = 0, timeout_s: float = 240, check: bool = True
) -> subprocess.CompletedProcess:
    """Run ``train_command(overrides, nproc)`` to the end, failing the test if it hangs past ``timeout_s``."""
    cmd = train_command(overrides, nproc)
    # Own session, so a hung run is killed with all its torchrun workers, not just the launcher.
    popen = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=train_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = popen.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(popen.pid, signal.SIGKILL)
        stdout, stderr = popen.communicate()
        raise AssertionError(
            f"{' '.join(cmd)} hung for {timeout_s} s\nstdout:\n{stdout}\nstderr:\n{stderr}"
        ) from None
    proc = subprocess.CompletedProcess(cmd, popen.returncode, stdout, stderr)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc
