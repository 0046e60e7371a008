"""Throughput table: samples/s, images/GPU/s and the ratio to colocated-sync, per model × profile × system.

    python experiments/run_throughput.py --simulate                       # the full table (a few minutes)
    python experiments/run_throughput.py --simulate --quick --out /tmp/t  # tiny, for tests (seconds)

Every row here is *simulated* (``digenrl.sim``): no GPU profile of the table is present on this machine,
so ``--simulate`` is required (measured rows come from real runs of ``experiments/run_train.py`` on the
profile's hardware and are added by hand to the results folder). Baselines are each tuned over their own
knobs (``digenrl.sim.planner.predict_baselines``: pool split, sub-batches, staleness); ``digenrl`` is the
planner's best plan (``search_plans``: split, D×S, fragment size, TAG; TCSS off since it changes the
algorithm). Each row names the cost file it used and whether those costs were measured or extrapolated
(``experiments/extrapolated_costs.py``). Writes ``OUT/table.csv`` (paper_figures results-table format,
experiment=main; the ``model`` column is ``<model> @ <profile>`` so each figure panel is one model on one
profile) and ``OUT/table.md``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from digenrl.sim.planner import predict_baselines, search_plans  # noqa: E402
from digenrl.sim.schedule_plan import SYSTEMS  # noqa: E402
from experiments.sim_tables import (  # noqa: E402
    MODELS,
    PROFILES,
    QUICK_COST_FILE,
    QUICK_MODEL,
    default_workload,
    device_costs,
    fragment_choices,
    header_lines,
    load,
    model_costs,
    write_table,
)

DEFAULT_OUT = REPO / "experiments" / "results" / "throughput"
QUICK_PROFILES = ("h200-8",)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=None, help=f"default: {' '.join(MODELS)}")
    p.add_argument("--profiles", nargs="*", default=None, help=f"default: {' '.join(PROFILES)}")
    p.add_argument(
        "--simulate", action="store_true", help="simulate profiles with no measured runs (all, here)"
    )
    p.add_argument(
        "--quick", action="store_true", help="tiny-sd3 from its CPU cost file, tiny workload, h200-8 (tests)"
    )
    p.add_argument("--costs", type=Path, default=None, help="cost file to use for every model (one model)")
    p.add_argument("--max-stages", type=int, default=4, help="largest TSP stage count the planner tries")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return p.parse_args(argv)


def throughput_rows(
    model: str,
    profile_name: str,
    extrapolated_dir: Path,
    *,
    quick: bool,
    max_stages: int,
    cost_file: Path | None = None,
) -> list[dict]:
    """One row per system for ``model`` on ``profile_name`` (simulated)."""
    profile = load(profile_name)
    workload = default_workload(model, quick=quick)
    mc = model_costs(model, extrapolated_dir, cost_file=cost_file, workload=workload)
    costs = device_costs(profile, mc.costs)
    scores = {s.plan.system: s for s in predict_baselines(profile, costs, workload, planning_iterations=5)}
    best = search_plans(
        profile,
        costs,
        workload,
        max_stages=max_stages,
        planning_iterations=5,
        fragment_groups=fragment_choices(workload.prompts_per_iteration),
    ).best
    scores["digenrl"] = best
    base = scores["colocated-sync"].samples_per_s
    rows = []
    for system in SYSTEMS:
        s = scores[system]
        separate = not s.plan.colocated
        rows.append(
            {
                "experiment": "main",
                "model": f"{model} @ {profile_name}",
                "system": system,
                "source": "simulated",
                "samples_per_s": s.samples_per_s,
                "images_per_gpu_s": s.samples_per_s / profile.world_size,
                "ratio_vs_colocated_sync": s.samples_per_s / base,
                "gpus": profile.world_size,
                "generators": s.plan.generators if separate else "",
                "trainers": s.plan.trainers if separate else "",
                "profile": profile_name,
                "model_name": model,
                "plan": s.plan.describe(),
                "cost_file": mc.cost_file,
                "cost_source": mc.source_label,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models = args.models or ((QUICK_MODEL,) if args.quick else MODELS)
    cost_file = args.costs or (QUICK_COST_FILE if args.quick else None)
    profiles = args.profiles or (QUICK_PROFILES if args.quick else PROFILES)
    if not args.simulate:
        raise SystemExit(
            "no measured runs exist for profiles "
            + ", ".join(profiles)
            + " on this machine: pass --simulate (every row is then marked simulated)"
        )
    command = "python experiments/run_throughput.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    rows = []
    for profile in profiles:
        for model in models:
            start = time.perf_counter()
            new = throughput_rows(
                model,
                profile,
                args.out / "costs",
                quick=args.quick,
                max_stages=args.max_stages,
                cost_file=cost_file,
            )
            rows.extend(new)
            best = next(r for r in new if r["system"] == "digenrl")
            print(
                f"[throughput] {model} @ {profile}: digenrl {best['samples_per_s']:.4g} samples/s "
                f"({best['ratio_vs_colocated_sync']:.2f}x colocated-sync; {best['plan']}) "
                f"[{time.perf_counter() - start:.1f} s]",
                flush=True,
            )
    header = header_lines(command, "Throughput per model x profile x system (experiment=main).")
    csv_path, md_path = write_table(rows, args.out, "table", header)
    print(f"[throughput] wrote {csv_path} and {md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
