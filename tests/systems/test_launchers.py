"""The test launchers themselves: a run forked from the preloaded server computes what the user's command
computes (bit for bit), and a hung run, forked or agent-launched, is killed and reported, not waited on."""

from __future__ import annotations

import pytest

from digenrl.runtime.observe.metrics import read_metrics
from tests.systems.launcher import RESUME_KEYS, run_train, train_env
from tests.systems.preloaded_launch import ready_fork_server

RUN = ["system=colocated-sync", "profile=cpu-2", "iterations=2", "seed=3", "checkpoint_every=0"]


def test_preloaded_ranks_compute_what_torchrun_computes(tmp_path):
    forked = run_train([*RUN, f"out_dir={tmp_path / 'forked'}"], nproc=2)
    command = run_train([*RUN, f"out_dir={tmp_path / 'torchrun'}"], nproc=2, launcher="command")
    a, b = read_metrics(tmp_path / "forked"), read_metrics(tmp_path / "torchrun")
    assert [r["iteration"] for r in a] == [r["iteration"] for r in b] == [0, 1]
    for x, y in zip(a, b, strict=True):
        assert {k: x[k] for k in RESUME_KEYS} == {k: y[k] for k in RESUME_KEYS}
    for proc in (forked, command):
        assert "[digenrl] iteration 1 (2/2)" in proc.stdout


#: The hang timeout of the test below: the whole wait of each case. The stopped rank stops at the start of
#: iteration 0, about 0.5 s after its fork (measured on 2 cores, fork server ready), so a tenth of this.
HUNG_TIMEOUT_S = 6


@pytest.mark.parametrize("nproc", [0, 2])
def test_a_hung_preloaded_run_is_killed_and_reported(tmp_path, monkeypatch, nproc):
    monkeypatch.setenv("DIGENRL_INJECT_FAULT", f"rank={max(nproc - 1, 0)},iteration=0,kind=stop")
    profile = "profile=cpu-2" if nproc else "profile=cpu-1"
    run = [*RUN, profile, "runtime.timeout_s=600", f"out_dir={tmp_path}"]
    ready_fork_server(train_env())  # the timeout runs from the fork: not while the server imports torch
    with pytest.raises(AssertionError, match=rf"hung for {HUNG_TIMEOUT_S} s[\s\S]*injected stop"):
        run_train(run, nproc=nproc, timeout_s=HUNG_TIMEOUT_S)
