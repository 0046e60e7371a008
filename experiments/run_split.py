"""Generator:trainer split sensitivity: simulated samples/s of separate-sync and digenrl per pool split.

    python experiments/run_split.py                                # flux.1-dev on h800-16, every split
    python experiments/run_split.py --quick --out /tmp/split       # tiny, for tests (seconds)

For each trainer count t in 1..N−1 (generators N − t): separate-sync with that split, and digenrl with
the planner's best plan *restricted to that split* (D×S, fragment size, TAG searched). Every row is
simulated (``digenrl.sim``) with the cost file it names. Writes ``OUT/split.csv`` (paper_figures
results-table format, experiment=split) and ``OUT/split.md``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from digenrl.sim.planner import PlanScore, search_plans  # noqa: E402
from digenrl.sim.schedule_plan import SchedulePlan  # noqa: E402
from digenrl.sim.simulator import simulate  # noqa: E402
from experiments.run_scaling import sub_cluster  # noqa: E402
from experiments.sim_tables import (  # noqa: E402
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

DEFAULT_OUT = REPO / "experiments" / "results" / "split"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=None, help="default: flux.1-dev (quick: tiny-sd3)")
    p.add_argument("--base-profile", default="h800-32", help="one-node-group profile to cut")
    p.add_argument("--nodes", type=int, default=2, help="8-GPU nodes (2 = 16 GPUs)")
    p.add_argument("--max-stages", type=int, default=4)
    p.add_argument("--quick", action="store_true", help="tiny workload, 8 GPUs (tests)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python experiments/run_split.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    profile = sub_cluster(load(args.base_profile), 1 if args.quick else args.nodes)
    world = profile.world_size
    rows = []
    models = args.models or ([QUICK_MODEL] if args.quick else ["flux.1-dev"])
    for model in models:
        mc = model_costs(
            model,
            REPO / "experiments" / "results" / "throughput" / "costs",
            cost_file=QUICK_COST_FILE if args.quick else None,
            workload=default_workload(model, quick=args.quick),
        )
        costs = device_costs(profile, mc.costs)
        workload = replace(
            default_workload(model, quick=args.quick),
            iterations=5,
            warmup_iterations=1,
            cooldown_iterations=1,
        )
        start = time.perf_counter()
        for trainers in range(1, world):
            plan = SchedulePlan("separate-sync", trainers=trainers, generators=world - trainers)
            scores = {"separate-sync": PlanScore.of(simulate(profile, costs, workload, plan))}
            scores["digenrl"] = search_plans(
                profile,
                costs,
                workload,
                trainer_counts=[trainers],
                max_stages=args.max_stages,
                planning_iterations=5,
                fragment_groups=fragment_choices(workload.prompts_per_iteration),
            ).best
            for system, s in scores.items():
                rows.append(
                    {
                        "experiment": "split",
                        "model": model,
                        "system": system,
                        "source": "simulated",
                        "samples_per_s": s.samples_per_s,
                        "images_per_gpu_s": s.samples_per_s / world,
                        "gpus": world,
                        "generators": world - trainers,
                        "trainers": trainers,
                        "profile": profile.name,
                        "model_name": model,
                        "plan": s.plan.describe(),
                        "cost_file": mc.cost_file,
                        "cost_source": mc.source_label,
                    }
                )
        print(f"[split] {model} on {profile.name}: {world - 1} splits [{time.perf_counter() - start:.1f} s]")
    header = header_lines(command, f"Generator:trainer split sensitivity on {profile.name}.")
    csv_path, md_path = write_table(rows, args.out, "split", header)
    print(f"[split] wrote {csv_path} and {md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
