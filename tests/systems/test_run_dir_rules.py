"""End to end: a run never destroys or mixes with another run's data, and never commits a non-finite
update (docs/operations.md, "Runs: resume, overwrite and the lock"). Each refusal happens at startup,
before anything is written, and is said once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import pytest
import torch

from digenrl.runtime.observe.metrics import read_metrics
from digenrl.trainer.checkpoint import (
    checkpoint_steps,
    latest_checkpoint_dir,
    load_latest_checkpoint,
    read_meta,
)
from tests.systems.launcher import REPO, run_train, train_command, train_env

BASE = ["system=colocated-sync", "profile=cpu-1", "algo.prompts_per_iteration=2"]


def _run_id(out_dir) -> str:
    first = (out_dir / "config.yaml").read_text().splitlines()[0]
    assert first.startswith("# run_id: ")
    return first.removeprefix("# run_id: ")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A one-iteration run started with resume=true in an empty out_dir: there is nothing to resume, so it
    says so and starts a new run."""
    out = tmp_path_factory.mktemp("rules") / "run"
    proc = run_train([*BASE, "iterations=1", "resume=true", f"out_dir={out}"])
    return out, proc


def test_resume_true_in_an_empty_out_dir_says_it_starts_a_new_run(finished):
    out, proc = finished
    assert f"[digenrl] resume=true: no checkpoint in {out}, starting a new run at iteration 0" in proc.stdout
    assert f"[digenrl] run {_run_id(out)} (new run)" in proc.stdout
    assert [r["run_id"] for r in read_metrics(out)] == [_run_id(out)]


def test_resuming_with_a_changed_setting_fails_at_startup_naming_it(finished):
    out, _ = finished
    before = (out / "metrics.jsonl").read_bytes()
    proc = run_train(
        [*BASE, "iterations=2", "resume=true", "trainer.lr=0.5", "algo.group_size=8", f"out_dir={out}"],
        check=False,
    )
    assert proc.returncode == 2
    assert "algo.group_size: 4 in the checkpoint, 8 now" in proc.stderr
    assert "trainer.lr: " in proc.stderr and " in the checkpoint, 0.5 now" in proc.stderr
    assert (out / "metrics.jsonl").read_bytes() == before


def test_a_new_run_into_a_used_out_dir_is_refused_once_and_overwrite_replaces_it(finished, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(finished[0], out)
    old_id, old_metrics = _run_id(out), (out / "metrics.jsonl").read_bytes()
    two = ["system=colocated-sync", "profile=cpu-2", "algo.prompts_per_iteration=2", "iterations=1"]
    # a plain run (refused before it starts workers: run_train.py's entry point on one forked process) and
    # torchrun's two workers (the user's command: each worker finds the refusal, and it is said once)
    for nproc, launcher in ((0, "preloaded"), (2, "command")):
        proc = run_train([*two, f"out_dir={out}"], nproc=nproc, check=False, timeout_s=120, launcher=launcher)
        assert proc.returncode != 0
        said = proc.stdout + proc.stderr
        assert said.count("already holds a run") == 1, said
        assert "overwrite=true" in said and "resume=true" in said
        assert (out / "metrics.jsonl").read_bytes() == old_metrics and _run_id(out) == old_id
    run_train([*BASE, "iterations=1", "overwrite=true", f"out_dir={out}"])
    new_id = _run_id(out)
    assert new_id != old_id and [r["run_id"] for r in read_metrics(out)] == [new_id]
    assert load_latest_checkpoint(out)["run_id"] == new_id


def test_a_second_job_into_the_out_dir_of_a_running_job_is_refused_naming_it(tmp_path):
    """Job 1 (``python run_train.py`` on cpu-2: a launcher holding the lock, two workers sharing it) waits
    at iteration 1 after its first checkpoint; job 2 into the same out_dir is refused at once, naming
    job 1; job 1 ends and releases the lock, and the folder resumes."""
    out, go = tmp_path / "run", tmp_path / "go"
    two = ["system=colocated-sync", "profile=cpu-2", "algo.prompts_per_iteration=2", "iterations=2"]
    two += ["checkpoint_every=1"]
    env = dict(train_env(), DIGENRL_INJECT_FAULT=f"rank=0,iteration=1,after={go}")
    first = subprocess.Popen(
        train_command([*two, f"out_dir={out}"]),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not (out / "checkpoints" / "latest").is_file():
            assert first.poll() is None and time.monotonic() < deadline, first.communicate(timeout=30)
            time.sleep(0.2)
        record = json.loads((out / ".lock").read_text())
        assert record["pid"] == first.pid and record["run_id"] == _run_id(out)
        metrics = (out / "metrics.jsonl").read_bytes()
        second = run_train([*two, "resume=true", f"out_dir={out}"], check=False)  # refused by its launcher
        assert second.returncode == 2, second.stderr
        assert f"is in use by another run: pid {first.pid} on host " in second.stderr
        assert f"run {_run_id(out)}, since " in second.stderr
        assert (out / "metrics.jsonl").read_bytes() == metrics
        assert read_meta(latest_checkpoint_dir(out))["inputs"]["data.prompts"].startswith("sha256:")
    finally:
        go.touch()  # job 1 goes on to its injected failure
        try:
            first.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(first.pid, signal.SIGKILL)
            first.communicate()
    assert first.returncode == 1 and (out / ".lock").read_text() == ""  # ended: no holder left
    resumed = run_train([*two, "resume=true", f"out_dir={out}"], nproc=2)
    assert "resuming run" in resumed.stdout and "took over" not in resumed.stdout
    assert [r["iteration"] for r in read_metrics(out)] == [0, 1]


# float16 full fine-tuning with a large lr: the first AdamW step overflows float16 (max 65504)
OVERFLOW = [*BASE, "model.dtype=float16", "trainer.mode=full", "trainer.lr=1e5"]


def test_a_non_finite_update_stops_the_run_naming_the_iteration(tmp_path):
    proc = run_train([*OVERFLOW, "iterations=1", f"out_dir={tmp_path}"], check=False)
    assert proc.returncode != 0
    assert "FloatingPointError: non-finite parameters after the optimizer step" in proc.stderr
    assert "at iteration 0 (optimizer step 0)" in proc.stderr
    assert checkpoint_steps(tmp_path) == [] and read_metrics(tmp_path) == []


def test_skipped_non_finite_updates_leave_the_weights_and_are_counted(tmp_path):
    proc = run_train([*OVERFLOW, "iterations=2", "trainer.nonfinite=skip", f"out_dir={tmp_path}"])
    records = read_metrics(tmp_path)
    assert [r["nonfinite_skipped"] for r in records] == [1.0, 1.0]
    assert [r["update_norm"] for r in records] == [0.0, 0.0] and records[0]["grad_norm"] > 0
    assert proc.stdout.count("NON-FINITE STEP SKIPPED") == 2
    assert "non-finite updates skipped (trainer.nonfinite=skip) at iterations 0, 1" in proc.stdout
    state = load_latest_checkpoint(tmp_path)["trainer"]
    assert state["steps"] == 0 and state["optimizer"]["state"] == {}
    assert all(bool(torch.isfinite(t).all()) for t in state["model"].values())
