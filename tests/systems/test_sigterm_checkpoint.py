"""SIGTERM ends a run with a checkpoint (issue 35, item 6; digenrl/runtime/faults/stop_request.py): the run
finishes the iteration it is in, writes the checkpoint of that step, ends its logs and exits with
128 + SIGTERM; ``resume=true`` continues from it. One single-process run of the tiny model, then a resume
of one iteration."""

from __future__ import annotations

import signal
import subprocess
import time

from digenrl.runtime.observe.metrics import read_metrics
from digenrl.trainer.checkpoint import latest_checkpoint_dir, read_meta, verify_checkpoint
from tests.systems.launcher import run_train, train_command, train_env

OVERRIDES = ["system=colocated-sync", "profile=cpu-1", "checkpoint_every=0"]


def test_sigterm_writes_a_checkpoint_at_the_next_iteration_end_and_the_run_resumes_from_it(tmp_path):
    out = tmp_path / "run"
    log = tmp_path / "run.log"
    with log.open("w") as stream:
        proc = subprocess.Popen(
            train_command([*OVERRIDES, "iterations=100000", f"out_dir={out}"]),
            env=train_env(),
            stdout=stream,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and proc.poll() is None and len(read_metrics(out)) < 2:
                time.sleep(0.1)
            assert proc.poll() is None, log.read_text()[-3000:]
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text()
    assert code == 128 + signal.SIGTERM, text[-3000:]
    done = len(read_metrics(out))
    checkpoint = latest_checkpoint_dir(out)
    assert checkpoint is not None, text[-3000:]
    verify_checkpoint(checkpoint)
    assert read_meta(checkpoint)["step"] == done  # the checkpoint of the last iteration logged
    assert f"stopped on SIGTERM after iteration {done - 1}: checkpoint at step {done}" in text
    assert (out / "trace.json").is_file()  # the run ended as a run ends: logs merged

    resumed = run_train([*OVERRIDES, f"iterations={done + 1}", f"out_dir={out}", "resume=true"])
    assert "resuming run" in resumed.stdout + resumed.stderr
    assert [r["iteration"] for r in read_metrics(out)] == list(range(done + 1))
