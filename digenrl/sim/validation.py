"""How far a simulation is from a real run (docs/design.md §5, "Simulator and planner": the
simulator is trusted only as far as it matches real runs, so its error is reported).

Both sides are read with the same definitions: iteration k ends when its last ``optimizer`` span ends;
steady state is iterations ``[warmup, n − cooldown)``; throughput is samples per steady-state second.
Per-phase numbers are the mean seconds per steady iteration summed over the ranks of a role, from
:func:`digenrl.runtime.event_summary.summarize_records`, so a phase whose predicted time is off shows
up by name.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from digenrl.runtime.event_records import load_events
from digenrl.runtime.event_summary import summarize_records
from digenrl.sim.simulator import SimResult


def steady_state(
    records: Iterable[Mapping[str, Any]], samples_per_iteration: int, warmup: int = 1, cooldown: int = 1
) -> dict[str, Any]:
    """Steady-state throughput and per-phase seconds of an event log (real or simulated)."""
    records = list(records)
    ends: dict[int, float] = {}
    for r in records:
        if r.get("type") == "span" and r["phase"] == "optimizer" and r.get("iteration") is not None:
            ends[int(r["iteration"])] = max(ends.get(int(r["iteration"]), 0.0), float(r["t_end"]))
    iterations = sorted(k for k in ends if k >= 0)
    steady = [k for k in iterations if warmup <= k < len(iterations) - cooldown]
    if not steady:
        raise ValueError(
            f"the log has {len(iterations)} finished iteration(s); warmup={warmup} + cooldown={cooldown} "
            "leave no steady state"
        )
    start = ends[steady[0] - 1] if steady[0] > 0 else 0.0
    window = ends[steady[-1]] - start
    summary = summarize_records(records)
    phases: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for k in steady:
        for role, by_phase in summary.get(k, {}).get("phase_seconds", {}).items():
            for phase, seconds in by_phase.items():
                phases[role][phase] += seconds / len(steady)
    return {
        "iterations": steady,
        "iteration_s": window / len(steady),
        "samples_per_s": samples_per_iteration * len(steady) / window if window > 0 else float("inf"),
        "phase_seconds": {role: dict(p) for role, p in phases.items()},
    }


def simulation_error(
    result: SimResult, run_dir: str | Path, warmup: int = 1, cooldown: int = 1
) -> dict[str, Any]:
    """Compare ``result`` with the measured run in ``run_dir`` (its ``events/rank*.jsonl``).

    ``relative_error`` = (simulated − measured) / measured samples/s; per phase, the same for the mean
    seconds per steady iteration (phases present on only one side are listed with ``None``).
    """
    samples = result.workload.samples_per_iteration
    measured = steady_state(load_events(run_dir), samples, warmup, cooldown)
    simulated = steady_state(result.records(), samples, warmup, cooldown)
    phases: dict[str, dict[str, dict[str, float | None]]] = {}
    for role in sorted(set(measured["phase_seconds"]) | set(simulated["phase_seconds"])):
        real = measured["phase_seconds"].get(role, {})
        sim = simulated["phase_seconds"].get(role, {})
        phases[role] = {
            phase: {
                "measured_s": real.get(phase),
                "simulated_s": sim.get(phase),
                "relative_error": (sim[phase] - real[phase]) / real[phase]
                if phase in real and phase in sim and real[phase] > 0
                else None,
            }
            for phase in sorted(set(real) | set(sim))
        }
    return {
        "measured_samples_per_s": measured["samples_per_s"],
        "simulated_samples_per_s": simulated["samples_per_s"],
        "relative_error": (simulated["samples_per_s"] - measured["samples_per_s"])
        / measured["samples_per_s"],
        "phases": phases,
    }
