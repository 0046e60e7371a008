"""A run's life at its edges: a rank killed without warning leaves its events and the resumed run's trace
covers every iteration (digenrl/runtime/events.py)."""

from __future__ import annotations

import json
import signal

from digenrl.runtime.event_records import load_events
from tests.systems.launcher import run_train

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
