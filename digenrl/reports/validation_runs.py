"""Validate the simulator against real runs on this machine (docs/design.md §5, "Simulator and planner":
the simulator is trusted only as far as it matches real runs, so its error is reported).

    python experiments/measure.py validation-runs          # 4 configurations on cpu-2, ~2 min on 2 idle cores
    python experiments/measure.py validation-runs --configs digenrl-gap-f4 --iterations 6 --out /tmp/val

In ONE invocation: (1) measure the per-operation cost model of the run's model on this CPU with the
runs' thread count (``digenrl.perf.measure_costs.measure_costs``, 1 thread), (2) run every configuration for
real with ``torchrun`` (gloo, ``experiments/run_train.py``), (3) simulate the same configurations on the
``cpu-2`` profile from the cost model just measured, (4) compare with
:func:`digenrl.reports.validation.simulation_error` (same steady-state definition on both sides) and write a
markdown + JSON report with the exact command at the top.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from digenrl.launch import launch_torchrun
from digenrl.runtime.observe.span_phases import Phase, is_work_phase

#: where the real runs and the report go unless told (experiments/measure.py passes the checkout's runs/)
DEFAULT_OUT = Path("runs") / "validation"


@dataclass(frozen=True)
class Configuration:
    """One real run and the schedule plan that simulates it (same pools and knobs)."""

    name: str
    overrides: tuple[str, ...]
    plan_kwargs: dict


CONFIGURATIONS: dict[str, Configuration] = {
    c.name: c
    for c in (
        Configuration("colocated-sync", ("system=colocated-sync",), {"system": "colocated-sync"}),
        Configuration(
            "separate-sync",
            ("system=separate-sync", "pools.trainers=1", "pools.generators=1"),
            {"system": "separate-sync", "trainers": 1, "generators": 1},
        ),
        Configuration(
            "digenrl-gap-f4",
            (
                "system=digenrl",
                "gap.enabled=true",
                "gap.fragment_groups=4",
                "tsp_stages=1",
                "pools.trainers=1",
                "pools.generators=1",
            ),
            {"system": "digenrl", "trainers": 1, "generators": 1, "fragment_groups": 4, "tsp_stages": 1},
        ),
        Configuration(
            "separate-async-s1",
            ("system=separate-async", "asynchrony.max_staleness=1", "pools.trainers=1", "pools.generators=1"),
            {"system": "separate-async", "trainers": 1, "generators": 1, "max_staleness": 1},
        ),
    )
}

#: The workload every configuration runs (the committed CPU ablation's: experiments/results/ablation).
#: eval.every=0: the held-out evaluation the config may switch on is no part of what the simulator predicts
WORKLOAD_OVERRIDES = (
    "algo.prompts_per_iteration=8",
    "sampler.num_steps=16",
    "trainer.micro_batch_size=16",
    "eval.every=0",
)


def parse_args(
    argv: list[str] | None = None, *, config: Path | None = None, out: Path = DEFAULT_OUT
) -> argparse.Namespace:
    """``config`` / ``out``: the defaults of ``--config`` (None: required) and of ``--out`` / ``--runs-dir``
    (experiments/measure.py gives the checkout's ``experiments/configs/tiny.yaml``, ``runs/validation``)."""
    p = argparse.ArgumentParser(
        prog="experiments/measure.py validation-runs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", type=Path, default=config, required=config is None)
    p.add_argument("--profile", default="cpu-2", help="profile of the real runs and of the simulation")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2, help="iterations excluded at the start (both sides)")
    p.add_argument("--cooldown", type=int, default=1, help="iterations excluded at the end (both sides)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank and for the cost model")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs", nargs="*", default=list(CONFIGURATIONS), choices=list(CONFIGURATIONS))
    p.add_argument(
        "--runs-dir", type=Path, default=out, help="where real runs write (default: runs/validation)"
    )
    p.add_argument(
        "--out", type=Path, default=out, help="report folder (default: runs/validation; cpu.md / cpu.json)"
    )
    p.add_argument("--name", default="cpu", help="report file stem")
    p.add_argument("--timeout", type=float, default=300, help="seconds per real run")
    p.add_argument("--measure-iters", type=int, default=5, help="timed calls per cost measurement")
    p.add_argument(
        "--measure",
        default="each",
        choices=["each", "once"],
        help="measure the cost model right before every configuration's run (each: tracks the machine's "
        "load when the machine is shared) or once before all runs",
    )
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = p.parse_args(argv)
    if args.warmup < 1 or args.iterations <= args.warmup + args.cooldown:
        p.error("need --warmup >= 1 and --iterations > --warmup + --cooldown (a steady state)")
    return args


def run_real(conf: Configuration, args: argparse.Namespace, run_dir: Path) -> float:
    """One real torchrun run; returns its wall time including launch."""
    overrides = [
        f"profile={args.profile}",
        f"iterations={args.iterations}",
        f"seed={args.seed}",
        f"out_dir={run_dir}",
        "overwrite=true",  # a re-run replaces this script's own run
        *WORKLOAD_OVERRIDES,
        *args.overrides,
        *conf.overrides,
    ]
    return launch_torchrun(
        overrides,
        nproc=args.nproc,
        config=args.config,
        threads=args.threads,
        timeout_s=args.timeout,
        label=f"validate {conf.name}",
    )


def iteration_times(records: list[dict]) -> dict[int, float]:
    """Seconds between consecutive iteration ends (end = last ``optimizer`` span of the iteration), the
    definition of ``digenrl.reports.validation.steady_state``, per iteration."""
    ends: dict[int, float] = {}
    for r in records:
        if r.get("type") == "span" and r["phase"] == Phase.OPTIMIZER and r.get("iteration") is not None:
            ends[int(r["iteration"])] = max(ends.get(int(r["iteration"]), 0.0), float(r["t_end"]))
    return {k: ends[k] - ends[k - 1] for k in sorted(ends) if k >= 1 and k - 1 in ends}


def report_markdown(meta: dict, rows: list[dict], costs_text: str) -> str:
    lines = [
        f"# Simulator validation on {meta['hardware']} ({meta['date']})",
        "",
        f"`{meta['command']}`",
        "",
        f"Profile `{meta['profile']}`, {meta['nproc']} ranks, {meta['threads']} torch thread(s) per rank; "
        f"workload P={meta['workload']['prompts_per_iteration']} G={meta['workload']['group_size']} "
        f"T={meta['workload']['num_steps']} K={meta['workload']['train_steps']} "
        f"micro-batch={meta['workload']['micro_batch_size']}, {meta['iterations']} iterations, "
        f"steady state = iterations [{meta['warmup']}, {meta['iterations'] - meta['cooldown']}). "
        "The cost model was measured in the same invocation on the same machine "
        f"({meta['measure']}: right before each configuration's run, or once before all).",
        "",
        "| configuration | measured s/it | simulated s/it | measured samples/s | simulated samples/s "
        "| error | median s/it measured / simulated | median error | load avg (before, after) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['configuration']} | {r['measured_iteration_s']:.3f} | {r['simulated_iteration_s']:.3f} | "
            f"{r['measured_samples_per_s']:.2f} | {r['simulated_samples_per_s']:.2f} | "
            f"{100 * r['relative_error']:+.1f}% | {r['measured_median_iteration_s']:.3f} / "
            f"{r['simulated_median_iteration_s']:.3f} | {100 * r['median_relative_error']:+.1f}% | "
            f"{r['load_average_1min'][0]:.1f}, "
            f"{r['load_average_1min'][1]:.1f} |"
        )
    lines += ["", "Per-phase seconds per steady iteration (summed over the ranks of a role):", ""]
    lines += ["| configuration | role | phase | measured s | simulated s | error |"]
    lines += ["|---|---|---|---|---|---|"]
    for r in rows:
        for role, phases in r["phases"].items():
            for phase, v in phases.items():
                if not is_work_phase(phase):
                    continue
                meas = "—" if v["measured_s"] is None else f"{v['measured_s']:.3f}"
                sim = "—" if v["simulated_s"] is None else f"{v['simulated_s']:.3f}"
                err = "—" if v["relative_error"] is None else f"{100 * v['relative_error']:+.0f}%"
                lines.append(f"| {r['configuration']} | {role} | {phase} | {meas} | {sim} | {err} |")
    lines += [
        "",
        "Cost model of the last configuration (measured in this invocation):",
        "",
        "```",
        costs_text,
    ]
    lines += ["```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None, *, config: Path | None = None, out: Path = DEFAULT_OUT) -> int:
    """``config`` / ``out``: defaults of the options (:func:`parse_args`)."""
    args = parse_args(argv, config=config, out=out)
    import torch

    from digenrl.config import load_config
    from digenrl.costs.cost_model import CostModel
    from digenrl.perf.measure_costs import measure_costs
    from digenrl.plan import RunPlan
    from digenrl.plan.workload import Workload
    from digenrl.reports.validation import simulation_error
    from digenrl.runtime.observe.event_records import load_events
    from digenrl.sim.simulator import simulate

    torch.set_num_threads(args.threads)
    command = "python experiments/measure.py validation-runs " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    runs_dir = args.runs_dir
    cfg = load_config(
        str(args.config), [f"iterations={args.iterations}", *WORKLOAD_OVERRIDES, *args.overrides]
    )
    workload = Workload.from_config(
        cfg, iterations=args.iterations, warmup_iterations=args.warmup, cooldown_iterations=args.cooldown
    )
    # every batch a configuration runs: a group, fragments (F·G), a rank's share, the whole batch
    b = workload.samples_per_iteration
    batches = sorted({workload.group_size, 4 * workload.group_size, b // args.nproc, b})
    micro = sorted({4, workload.micro_batch_size})

    def measure() -> CostModel:
        start = time.perf_counter()
        costs = measure_costs(
            cfg.model.name,
            "cpu",
            batches=batches,
            micro_batches=micro,
            cfg_flags=(workload.cfg,),
            mode=cfg.trainer.mode,
            reward=cfg.reward.name,
            num_steps=workload.num_steps,
            warmup=2,
            iters=args.measure_iters,
            command=command,
        )
        print(costs.describe(), flush=True)
        print(f"[validate] cost model measured in {time.perf_counter() - start:.1f} s", flush=True)
        return costs

    costs = measure()
    rows = []
    for name in args.configs:
        conf = CONFIGURATIONS[name]
        run_dir = runs_dir / name
        load_before = os.getloadavg()[0]
        if args.measure == "each" and rows:
            costs = measure()
        launch_s = run_real(conf, args, run_dir)
        load_after = os.getloadavg()[0]
        result = simulate(args.profile, costs, workload, RunPlan(**conf.plan_kwargs))
        err = simulation_error(result, run_dir, warmup=args.warmup, cooldown=args.cooldown)
        steady = range(args.warmup, args.iterations - args.cooldown)
        measured_median = statistics.median(iteration_times(load_events(run_dir))[k] for k in steady)
        simulated_median = statistics.median(result.iteration_s[k] for k in steady)
        row = {
            "configuration": name,
            "overrides": list(conf.overrides),
            "plan": result.plan.describe(),
            "measured_samples_per_s": err["measured_samples_per_s"],
            "simulated_samples_per_s": err["simulated_samples_per_s"],
            "measured_iteration_s": b / err["measured_samples_per_s"],
            "simulated_iteration_s": b / err["simulated_samples_per_s"],
            "relative_error": err["relative_error"],
            "measured_median_iteration_s": measured_median,
            "simulated_median_iteration_s": simulated_median,
            "median_relative_error": measured_median / simulated_median - 1.0,
            "phases": err["phases"],
            "run_dir": str(run_dir),
            "launch_s": launch_s,
            "load_average_1min": [load_before, load_after],
            "costs": costs.to_dict(),
            "generator_step_s_whole_batch": costs.generator_step_s(b, workload.cfg),
            "train_micro_batch_s": costs.train_micro_batch_s(workload.micro_batch_size, workload.cfg),
        }
        rows.append(row)
        print(
            f"[validate] {name}: measured {row['measured_samples_per_s']:.2f} samples/s, simulated "
            f"{row['simulated_samples_per_s']:.2f} ({100 * row['relative_error']:+.1f}%)",
            flush=True,
        )
    meta = {
        "command": command,
        "date": time.strftime("%Y-%m-%d"),
        "hardware": f"{platform.machine()} CPU, {os.cpu_count()} cores",
        "profile": args.profile,
        "nproc": args.nproc,
        "threads": args.threads,
        "iterations": args.iterations,
        "warmup": args.warmup,
        "cooldown": args.cooldown,
        "workload": {
            "prompts_per_iteration": workload.prompts_per_iteration,
            "group_size": workload.group_size,
            "num_steps": workload.num_steps,
            "train_steps": workload.train_steps,
            "micro_batch_size": workload.micro_batch_size,
            "cfg": workload.cfg,
        },
        "measure": args.measure,
        "max_abs_error": max(abs(r["relative_error"]) for r in rows),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    text = report_markdown(meta, rows, costs.describe())
    (args.out / f"{args.name}.md").write_text(text)
    (args.out / f"{args.name}.json").write_text(
        json.dumps({"meta": meta, "costs": costs.to_dict(), "rows": rows}, indent=2, default=str) + "\n"
    )
    print(text)
    print(f"[validate] wrote {args.out / (args.name + '.md')} and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
