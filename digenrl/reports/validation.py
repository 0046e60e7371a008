"""How far a simulation is from a real run (docs/design.md §5, "Simulator and planner": the
simulator is trusted only as far as it matches real runs, so its error is reported).

Both sides are read with the same definitions: iteration k ends when its last ``optimizer`` span ends;
steady state is iterations ``[warmup, n − cooldown)``; throughput is samples per steady-state second.
Per-phase numbers are the mean seconds per steady iteration summed over the ranks of a role, from
:func:`digenrl.runtime.observe.event_summary.summarize_records`, so a phase whose predicted time is off shows
up by name.

:func:`compare_run` does both for a run directory: it simulates the plan the run executed (its
``plan.json``, :class:`~digenrl.plan.RunPlan`) from the cost file of its device and model and prints
predicted next to measured seconds per phase (``python experiments/simulate.py validate RUN_DIR``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from digenrl.costs.cost_model import CostModel, cost_path, run_path
from digenrl.costs.device_costs import DeviceCosts
from digenrl.plan import RunPlan
from digenrl.plan.workload import Workload
from digenrl.runtime.hardware.profiles import HardwareProfile
from digenrl.runtime.observe.event_records import load_events
from digenrl.runtime.observe.event_summary import summarize_records
from digenrl.runtime.observe.span_phases import Phase, is_work_phase
from digenrl.sim.simulator import SimResult, simulate
from digenrl.trainer.run_dir import PLAN_FILE, run_profile

if TYPE_CHECKING:
    from digenrl.config import Config


def steady_state(
    records: Iterable[Mapping[str, Any]], samples_per_iteration: int, warmup: int = 1, cooldown: int = 1
) -> dict[str, Any]:
    """Steady-state throughput and per-phase seconds of an event log (real or simulated)."""
    records = list(records)
    ends: dict[int, float] = {}
    for r in records:
        if r.get("type") == "span" and r["phase"] == Phase.OPTIMIZER and r.get("iteration") is not None:
            ends[int(r["iteration"])] = max(ends.get(int(r["iteration"]), 0.0), float(r["t_end"]))
    # positions, not iteration numbers: a trimmed log (experiments/make_figures.py --real-run) may start
    # after iteration 0; its first logged iteration then only marks where the window starts
    iterations = sorted(k for k in ends if k >= 0)
    first = iterations[0] if iterations else 0
    skip = max(warmup, 1) if first > 0 else warmup
    steady = iterations[skip : len(iterations) - cooldown]
    if not steady:
        raise ValueError(
            f"the log has {len(iterations)} finished iteration(s); warmup={warmup} + cooldown={cooldown} "
            "leave no steady state"
        )
    before = iterations.index(steady[0]) - 1
    start = ends[iterations[before]] if before >= 0 else 0.0
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


# ----------------------------------------------------------------------------- a real run vs its simulation

#: Goal for every phase of a validated run (docs/design.md §5): |simulated − measured| / measured.
PHASE_ERROR_GOAL = 0.10


def run_plan(run_dir: Path, cfg: Config, profile: HardwareProfile) -> RunPlan:
    """The plan the run in ``run_dir`` executed: its ``plan.json``; a run written before runs recorded
    their plan gets the plan of its ``config.yaml`` (:meth:`RunPlan.from_config`, the same rule)."""
    if (run_dir / PLAN_FILE).is_file():
        return RunPlan.load(run_dir / PLAN_FILE)
    return RunPlan.from_config(cfg, profile)


def run_cost_file(cfg: Config, profile: HardwareProfile, costs_dir: str | Path) -> Path:
    """``<costs_dir>/<device>-<model>.json`` of a run's first device type."""
    kind = profile.device_type(0).name
    return cost_path("cpu" if kind.startswith("cpu") else kind, cfg.model.name, costs_dir)


def compare_run(
    run_dir: str | Path,
    cost_file: str | Path | None = None,
    warmup: int = 1,
    cooldown: int = 0,
    *,
    costs_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Simulate the run in ``run_dir`` (its ``config.yaml``) and compare per phase (:func:`simulation_error`),
    priced by ``cost_file``, else by the file of the run's device and model in ``costs_dir``.

    The row says which code path the run executed (``model.compile`` / ``model.autocast``, resolved for the
    profile's device) and which the cost file timed; when they differ the comparison is still made but
    ``path_mismatch`` says why the error cannot be read as the simulator's."""
    from digenrl.config import load_config

    run_dir = Path(run_dir)
    cfg = load_config(run_dir / "config.yaml")
    profile = run_profile(run_dir, cfg.profile)
    if cost_file is None:
        if costs_dir is None:
            raise ValueError("compare_run needs a cost_file or the costs_dir holding <device>-<model>.json")
        cost_file = run_cost_file(cfg, profile, costs_dir)
    costs = CostModel.load(cost_file)
    records = load_events(run_dir)
    finished = {
        int(r["iteration"])
        for r in records
        if r.get("type") == "span" and r["phase"] == Phase.OPTIMIZER and r.get("iteration") is not None
    }
    iterations = max(finished) + 1 if finished else 0
    workload = Workload.from_config(
        cfg, iterations=iterations, warmup_iterations=warmup, cooldown_iterations=cooldown
    )
    plan = run_plan(run_dir, cfg, profile)
    result = simulate(profile, DeviceCosts(profile, costs), workload, plan)
    error = simulation_error(result, run_dir, warmup, cooldown)
    device = "cuda" if profile.backend == "nccl" else "cpu"
    path = run_path(*cfg.model.optimised(device))
    phases = {
        role: {phase: v for phase, v in by_phase.items() if is_work_phase(phase)}
        for role, by_phase in error["phases"].items()
    }
    checked = [
        v["relative_error"] for by in phases.values() for v in by.values() if v["relative_error"] is not None
    ]
    return {
        "run_dir": str(run_dir),
        "model": cfg.model.name,
        "profile": cfg.profile,
        "system": cfg.system,
        "plan": plan.describe(),
        "run_path": path,
        "cost_path": costs.path,
        "path_mismatch": ""
        if path == costs.path
        else f"the run executed {path}, the cost file timed {costs.path}",
        "cost_file": str(cost_file),
        "iterations": iterations,
        "steady": list(workload.steady_iterations),
        "measured_iteration_s": workload.samples_per_iteration / error["measured_samples_per_s"],
        "simulated_iteration_s": workload.samples_per_iteration / error["simulated_samples_per_s"],
        "measured_samples_per_s": error["measured_samples_per_s"],
        "simulated_samples_per_s": error["simulated_samples_per_s"],
        "relative_error": error["relative_error"],
        "max_phase_error": max((abs(e) for e in checked), default=None),
        "phase_goal": PHASE_ERROR_GOAL,
        "phases": phases,
    }


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:+.1f}%"


def report_markdown(rows: list[dict[str, Any]], command: str) -> str:
    """Predicted vs measured per run and per phase, the error beside every predicted number."""
    lines = [
        "# Simulator validation against real runs",
        "",
        f"`{command}`",
        "",
        f"Steady state as in `digenrl.reports.validation.steady_state`; goal: every phase within "
        f"{100 * PHASE_ERROR_GOAL:.0f}% (docs/design.md §5).",
        "",
        "| run | model | profile | system | path (run / costs) | measured s/it | predicted s/it (error) |"
        " worst abs. phase error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        worst = "—" if r["max_phase_error"] is None else f"{100 * r['max_phase_error']:.1f}%"
        lines.append(
            f"| {Path(r['run_dir']).name} | {r['model']} | {r['profile']} | {r['system']} | "
            f"{r['run_path']} / {r['cost_path']} | {r['measured_iteration_s']:.3f} | "
            f"{r['simulated_iteration_s']:.3f} ({_pct(-r['relative_error'] / (1 + r['relative_error']))}) | "
            f"{worst} |"
        )
    lines += ["", "Per phase, seconds per steady iteration summed over the ranks of a role:", ""]
    lines += [
        "| run | role | phase | measured s | predicted s (error) | within goal |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        for role, phases in r["phases"].items():
            for phase, v in phases.items():
                measured = "—" if v["measured_s"] is None else f"{v['measured_s']:.3f}"
                predicted = "—" if v["simulated_s"] is None else f"{v['simulated_s']:.3f}"
                err = v["relative_error"]
                ok = "—" if err is None else ("yes" if abs(err) <= PHASE_ERROR_GOAL else "no")
                name = Path(r["run_dir"]).name
                lines.append(f"| {name} | {role} | {phase} | {measured} | {predicted} ({_pct(err)}) | {ok} |")
    mismatched = [r for r in rows if r["path_mismatch"]]
    if mismatched:
        lines += ["", "Path mismatches (the error is then the path's, not the simulator's):", ""]
        lines += [f"* {Path(r['run_dir']).name}: {r['path_mismatch']}" for r in mismatched]
    return "\n".join(lines) + "\n"
