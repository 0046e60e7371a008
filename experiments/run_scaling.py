"""Scaling with GPU count: simulated samples/s of every system on 8, 16, 24, 32 GPUs of an H800-like cluster.

    python experiments/run_scaling.py                                   # flux.1-dev on h800-{8,16,24,32}
    python experiments/run_scaling.py --quick --out /tmp/scaling        # tiny, for tests (seconds)

The clusters are ``hardware_profiles/h800-32.yaml`` cut to 1..4 of its 8-GPU nodes (same device type and
links). The workload (the global batch) is fixed while GPUs grow (strong scaling), as a fixed FlowGRPO
recipe would be run on a bigger cluster. Baselines are tuned over their own knobs; digenrl is the
planner's best plan. Every row is simulated (``digenrl.sim``) with the cost file it names. Writes
``OUT/scaling.csv`` (paper_figures results-table format, experiment=scaling) and ``OUT/scaling.md``.
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

from digenrl.runtime.profiles import HardwareProfile, NodeGroup  # noqa: E402
from digenrl.sim.planner import predict_baselines, search_plans  # noqa: E402
from digenrl.sim.schedule_plan import SYSTEMS  # noqa: E402
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

DEFAULT_OUT = REPO / "experiments" / "results" / "scaling"


def sub_cluster(base: HardwareProfile, nodes: int) -> HardwareProfile:
    """``base`` (one node group) cut to ``nodes`` nodes, named ``<type>-<gpus>``."""
    if len(base.nodes) != 1 or not 1 <= nodes <= base.nodes[0].count:
        raise ValueError(f"nodes must be in [1, {base.nodes[0].count}] of a one-group profile, got {nodes}")
    group = replace(base.nodes[0], count=nodes)
    name = f"{group.gpu}-{nodes * group.devices_per_node}"
    return replace(base, name=name, nodes=(NodeGroup(group.count, group.devices_per_node, group.gpu),))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=None, help="default: flux.1-dev (quick: tiny-sd3)")
    p.add_argument("--base-profile", default="h800-32", help="one-node-group profile to cut")
    p.add_argument("--nodes", nargs="*", type=int, default=[1, 2, 3, 4], help="node counts")
    p.add_argument("--max-stages", type=int, default=4)
    p.add_argument("--quick", action="store_true", help="tiny workload, 1-2 nodes (tests)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python experiments/run_scaling.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    base = load(args.base_profile)
    nodes = [1, 2] if args.quick else args.nodes
    rows = []
    models = args.models or ([QUICK_MODEL] if args.quick else ["flux.1-dev"])
    for model in models:
        workload = default_workload(model, quick=args.quick)
        mc = model_costs(
            model,
            REPO / "experiments" / "results" / "throughput" / "costs",
            cost_file=QUICK_COST_FILE if args.quick else None,
            workload=workload,
        )
        for n in nodes:
            start = time.perf_counter()
            profile = sub_cluster(base, n)
            costs = device_costs(profile, mc.costs)
            scores = {
                s.plan.system: s for s in predict_baselines(profile, costs, workload, planning_iterations=5)
            }
            scores["digenrl"] = search_plans(
                profile,
                costs,
                workload,
                max_stages=args.max_stages,
                planning_iterations=5,
                fragment_groups=fragment_choices(workload.prompts_per_iteration),
            ).best
            for system in SYSTEMS:
                s = scores[system]
                separate = not s.plan.colocated
                rows.append(
                    {
                        "experiment": "scaling",
                        "model": model,
                        "system": system,
                        "source": "simulated",
                        "samples_per_s": s.samples_per_s,
                        "images_per_gpu_s": s.samples_per_s / profile.world_size,
                        "ratio_vs_colocated_sync": s.samples_per_s / scores["colocated-sync"].samples_per_s,
                        "gpus": profile.world_size,
                        "generators": s.plan.generators if separate else "",
                        "trainers": s.plan.trainers if separate else "",
                        "profile": profile.name,
                        "model_name": model,
                        "plan": s.plan.describe(),
                        "cost_file": mc.cost_file,
                        "cost_source": mc.source_label,
                    }
                )
            print(
                f"[scaling] {model} on {profile.name}: digenrl "
                f"{scores['digenrl'].samples_per_s:.4g} samples/s "
                f"[{time.perf_counter() - start:.1f} s]",
                flush=True,
            )
    header = header_lines(command, f"Scaling with GPU count on {args.base_profile} cut to 8-GPU nodes.")
    csv_path, md_path = write_table(rows, args.out, "scaling", header)
    print(f"[scaling] wrote {csv_path} and {md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
