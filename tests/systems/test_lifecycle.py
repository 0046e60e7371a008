"""A run's life at its edges: a rank killed without warning leaves its events and the resumed run's trace
covers every iteration; a signal to the launcher stops torchrun and every worker; relative paths mean
what they mean in the directory the user ran the command in (digenrl/runtime/observe/events.py,
digenrl/runtime/launch/job.py, digenrl/launch.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from digenrl.runtime.observe.event_records import load_events
from digenrl.runtime.observe.metrics import read_metrics
from tests.systems.launcher import REPO, RUN_TRAIN, TINY, run_train, train_env

BASE = ["system=colocated-sync", "profile=cpu-1"]


def test_a_killed_rank_leaves_its_events_and_the_resumed_trace_covers_every_iteration(tmp_path, monkeypatch):
    """SIGKILL at the start of iteration 3 (after checkpoint step_2): every span of iterations 0-2 is in the
    log (it used to be flushed every 2 s, and a tiny run lost them all), so the resumed run's trace.json
    holds iterations 0-3, not only the ones the resumed process ran."""
    out = tmp_path / "run"
    run = [*BASE, "iterations=4", "checkpoint_every=2", f"out_dir={out}"]
    monkeypatch.setenv("DIGENRL_INJECT_FAULT", "rank=0,iteration=3,kind=kill")
    crashed = run_train(run, check=False)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    spans = [r for r in load_events(out) if r["type"] == "span"]
    assert sorted(s["iteration"] for s in spans if s["phase"] == "optimizer") == [0, 1, 2]
    assert not (out / "trace.json").exists()  # the crash came before the merge

    monkeypatch.delenv("DIGENRL_INJECT_FAULT")
    run_train([*run, "resume=true"])
    trace = json.loads((out / "trace.json").read_text())
    steps = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["name"] == "optimizer"]
    assert [(e["args"]["iteration"], e["args"].get("superseded", False)) for e in steps] == [
        (0, False),
        (1, False),
        (2, True),  # the killed process's iteration 2, redone from checkpoint step_2
        (2, False),
        (3, False),
    ]


def _state(pid: int) -> str | None:
    """The process state letter of ``pid`` (``Z``: exited, not yet reaped), None when there is none."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return None


def _running(pids: set[int]) -> set[int]:
    return {pid for pid in pids if _state(pid) not in (None, "Z")}


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                found.add(int(entry.name))
    return found


@pytest.fixture(scope="module")
def stopped_launch(tmp_path_factory):
    """One ``python run_train.py`` on a 2-rank profile (it starts torchrun itself), run the way a user runs
    it from their own directory, with a relative ``--config``, ``data.prompts`` and ``out_dir``, then
    stopped with SIGTERM to the launcher (a job scheduler cancelling the job) once both ranks are past
    iteration 0. Returns the work directory, the out_dir, the launcher's exit code, the pids found
    running before the signal and those still running after it, and the launcher's output."""
    work = tmp_path_factory.mktemp("lifecycle") / "work"
    work.mkdir()
    (work / "my.yaml").write_text(TINY.read_text())
    (work / "prompts.txt").write_text("a red cube\na blue sphere\n")
    out = work / "runs" / "rel"
    cmd = [
        sys.executable,
        str(RUN_TRAIN),
        "--config",
        "my.yaml",
        "iterations=100000",
        "data.prompts=prompts.txt",
        "out_dir=runs/rel",
    ]
    log_path = work.parent / "launcher.log"
    log = log_path.open("w")
    launcher = subprocess.Popen(
        cmd, cwd=work, env=train_env(), stdout=log, stderr=log, start_new_session=True
    )
    workers: set[int] = set()
    agents: set[int] = set()
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and launcher.poll() is None:  # both ranks past iteration 0
            logs = sorted((out / "events").glob("rank*.jsonl"))
            if len(logs) == 2 and all('"iteration":1' in path.read_text() for path in logs):
                break
            time.sleep(0.2)
        assert launcher.poll() is None, log_path.read_text()[-3000:]
        # the workers name themselves in their logs: found without the launcher's own process walk
        workers = {r["pid"] for r in load_events(out) if r["type"] == "meta"}
        agents = _children(launcher.pid)
        before = _running(workers | agents)
        os.kill(launcher.pid, signal.SIGTERM)
        code = launcher.wait(30)
        gone_by = time.monotonic() + 5
        while _running(workers | agents) and time.monotonic() < gone_by:
            time.sleep(0.05)
        after = _running(workers | agents)
    finally:
        for pid in _running(workers | agents) | ({launcher.pid} if launcher.poll() is None else set()):
            os.kill(pid, signal.SIGKILL)  # what this test started, left behind by a failure
        launcher.wait()
        log.close()
    return {
        "work": work,
        "out": out,
        "code": code,
        "workers": workers,
        "agents": agents,
        "before": before,
        "after": after,
        "text": log_path.read_text(),
    }


def test_sigterm_to_the_launcher_stops_torchrun_and_every_worker(stopped_launch):
    """SIGTERM to ``python run_train.py`` used to leave torchrun and both workers running to the end as
    orphans."""
    run = stopped_launch
    assert len(run["workers"]) == 2 and len(run["agents"]) == 1
    assert run["before"] == run["workers"] | run["agents"]
    assert run["after"] == set(), "torchrun or a worker outlived the launcher"
    assert run["code"] == 128 + signal.SIGTERM
    assert "received SIGTERM" in run["text"], run["text"][-3000:]
    for rank in (0, 1):  # every record a rank wrote before it was stopped is in its log
        assert any(r["type"] == "span" for r in load_events(run["out"]) if r["rank"] == rank)
    # the workers' SIGTERM is a stop with a checkpoint of the last iteration
    # (digenrl/runtime/faults/stop_request.py)
    from digenrl.trainer.checkpoint import latest_checkpoint_dir, read_meta

    checkpoint = latest_checkpoint_dir(run["out"])
    assert checkpoint is not None and read_meta(checkpoint)["step"] == len(read_metrics(run["out"]))
    assert "stopped on SIGTERM after iteration" in run["text"], run["text"][-3000:]


def test_relative_paths_resolve_in_the_directory_the_command_ran_in(stopped_launch):
    """The workers torchrun starts read and write where the command ran (they used to run in the
    repository: the prompts file was missing there, or the run was written into the repository)."""
    out = stopped_launch["out"]
    assert [r["iteration"] for r in read_metrics(out)][:1] == [0]  # read prompts.txt, wrote runs/rel
    assert sorted(p.name for p in (out / "events").iterdir()) == ["rank0.jsonl", "rank1.jsonl"]
    assert (stopped_launch["work"] / "runs" / "rel" / "config.yaml").is_file()
    assert not (REPO / "runs" / "rel").exists()
