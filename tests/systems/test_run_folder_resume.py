"""A run resumes from nothing but its folder: ``run_train.py --resume RUN_DIR`` and
``run_train.py resume=true out_dir=RUN_DIR`` read the config the run saved (digenrl/launch.py)."""

from __future__ import annotations

import subprocess
import sys

from digenrl.runtime.observe.metrics import read_metrics
from tests.systems.launcher import RUN_TRAIN, run_train, train_env


def _plain(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(RUN_TRAIN), *args], env=train_env(), capture_output=True, text=True, timeout=240
    )


def test_resume_needs_only_the_run_folder(tmp_path):
    run = tmp_path / "run"
    # a config the defaults would not reproduce: without the saved config.yaml the resume would be refused
    first = ["system=colocated-sync", "profile=cpu-1", "iterations=2", "checkpoint_every=1", "seed=7"]
    run_train([*first, "algo=mixgrpo", "algo.mix_window=2", f"out_dir={run}"])
    done = _plain(["--resume", str(run), "iterations=3"])
    assert done.returncode == 0, done.stderr
    assert [r["iteration"] for r in read_metrics(run)] == [0, 1, 2]
    again = _plain(["resume=true", f"out_dir={run}", "iterations=4"])
    assert again.returncode == 0, again.stderr
    assert [r["iteration"] for r in read_metrics(run)] == [0, 1, 2, 3]
