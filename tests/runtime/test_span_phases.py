"""Span phase names are declared once (digenrl/runtime/observe/span_phases.py) and nothing emits another name.

Two checks here: the one writer of span records refuses an undeclared phase (so every run and simulation
in the suite checks what it emits), and no emitter in the package spells a phase as a string literal (it
names a ``Phase`` member). That the simulator's schedules of every system emit only declared names:
tests/sim/test_sim_schedules.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from digenrl.runtime.observe.event_records import span_record
from digenrl.runtime.observe.events import EventLogger
from digenrl.runtime.observe.span_phases import (
    Phase,
    declared_phase,
    is_idle_phase,
    is_work_phase,
    waiting_for,
)

PACKAGE = Path(__file__).resolve().parents[2] / "digenrl"


def test_span_record_refuses_an_undeclared_phase_and_names_where_to_declare_it():
    with pytest.raises(
        ValueError, match=r"'rollout' is not declared in digenrl/runtime/observe/span_phases\.py"
    ):
        span_record(0, "generator", "rollout", 0.0, 1.0)
    record = span_record(0, "generator", Phase.GENERATE, 0.0, 1.0)
    assert record["phase"] == "generate" and type(record["phase"]) is str  # the log holds the plain value


def test_event_logger_refuses_an_undeclared_phase_before_its_body_runs(tmp_path):
    ran = []
    with EventLogger(tmp_path, 0, "trainer", 0.0) as events:
        with pytest.raises(ValueError, match="'warmup' is not declared"), events.span("warmup"):
            ran.append(True)
        with events.span(Phase.TRAIN, iteration=0):
            ran.append(False)
    assert ran == [False]


def test_idle_work_and_wait_names():
    assert declared_phase("wait_fragment") is Phase.WAIT_FRAGMENT
    assert waiting_for(Phase.ALLREDUCE) is Phase.WAIT_ALLREDUCE
    with pytest.raises(ValueError, match="'wait_score_twice' is not declared"):
        waiting_for("score_twice")  # type: ignore[arg-type]
    idle = {p for p in Phase if is_idle_phase(p)}
    assert idle == {p for p in Phase if p.name.startswith("WAIT_")}
    assert {p for p in Phase if not is_work_phase(p)} == idle | {Phase.ITERATION}


#: span emitters and the position of their phase argument
_PHASE_ARGUMENT = {
    "span": 0,  # EventLogger.span(phase, ...)
    "record_span": 0,  # EventLogger.record_span(phase, t_start, t_end, ...)
    "span_record": 2,  # span_record(rank, role, phase, ...)
    "work": 1,  # simulator: cluster.work(rank, phase, seconds, ...)
    "wait_signal": 1,  # cluster.wait_signal(rank, phase, signal, ...)
    "collective": 4,  # cluster.collective(key, rank, ranks, seconds, phase, ...)
    "recv": 0,  # simulator channel: recv(phase, ...)
    "add": 1,  # SpanLog.add(rank, phase, t_start, t_end, ...)
}


def test_no_emitter_spells_a_phase_as_a_string():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            index = _PHASE_ARGUMENT.get(name)
            if index is None or len(node.args) <= index:
                continue
            argument = node.args[index]
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {argument.value!r}")
    assert offenders == [], "name a digenrl.runtime.observe.span_phases.Phase member instead"
