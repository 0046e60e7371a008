"""Span phase names are declared once (digenrl/runtime/observe/span_phases.py) and nothing emits another name.

Three checks: the one writer of span records refuses an undeclared phase (so every run and simulation in
the suite checks what it emits), the simulator's schedules of every system emit only declared names, and no
emitter in the package spells a phase as a string literal (it names a ``Phase`` member).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from digenrl.plan import RunPlan
from digenrl.plan.workload import Workload
from digenrl.runtime.hardware.profiles import load_profile
from digenrl.runtime.observe.event_records import span_record
from digenrl.runtime.observe.events import EventLogger
from digenrl.runtime.observe.span_phases import (
    Phase,
    declared_phase,
    is_idle_phase,
    is_work_phase,
    waiting_for,
)
from digenrl.sim.simulator import simulate
from tests.sim.toy_costs import toy_costs

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


def _plans(world: int) -> list[RunPlan]:
    half = world // 2
    pools = {"trainers": half, "generators": world - half}
    return [
        RunPlan("colocated-sync", train_resident=False, reward_resident=False),
        RunPlan("colocated-overlap", overlap_sub_batches=2),
        RunPlan("colocated-engine"),
        RunPlan("separate-sync", **pools),
        RunPlan("separate-async", **pools, max_staleness=2),
        RunPlan("digenrl", **pools, fragment_groups=1, tsp_stages=2),
        RunPlan("digenrl", **pools, tag=True, tag_policy="always", tag_max_fragments=1, tcss=True),
    ]


def test_every_phase_the_simulator_emits_is_declared():
    costs = toy_costs(
        step=0.05,
        decode=0.02,
        reward=0.01,
        unit=0.03,
        optimizer=0.02,
        fragment_bytes=10**7,
        unit_bytes=10**7,
        sync_bytes=10**8,
        grad_bytes=10**8,
        optimizer_bytes=10**9,
    )
    profile = load_profile("cpu-4")
    workload = Workload(
        prompts_per_iteration=8, group_size=2, num_steps=4, train_steps=2, cfg=False, micro_batch_size=2
    )
    emitted: set[str] = set()
    for plan in _plans(profile.world_size):
        emitted |= {span["phase"] for span in simulate(profile, costs, workload, plan).spans}
    assert emitted <= set(Phase)
    # the schedules reach the names the summaries, TAG and the figures group by
    expected = {Phase.GENERATE, Phase.SCORE, Phase.TRAIN, Phase.OPTIMIZER, Phase.SYNC, Phase.TRANSFER}
    expected |= {Phase.TAG_SWITCH, Phase.RESIDENCY, Phase.OFFLOAD, Phase.ONLOAD, Phase.RESHARD}
    expected |= {Phase.WAIT_FRAGMENT, Phase.WAIT_STAGE, Phase.WAIT_TRANSFER, Phase.WAIT_SYNC}
    assert expected <= emitted, sorted(expected - emitted)


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
