"""Ask the simulator-backed planner for the best DigenRL plan on a hardware profile.

    python experiments/run_plan.py --profile cpu-4 --costs experiments/results/costs/cpu-tiny-sd3.json
    python experiments/run_plan.py --profile h200-8 --model sd3.5-medium --device h200 \
        --prompts 32 --group-size 16 --steps 10 --cfg on --baselines
    python experiments/run_plan.py --profile hetero-h100-a100-16 --costs h100=costs/h100-flux.json \
        --costs a100=costs/a100-flux.json

Prints the best plan and the runner-up with their predicted steady-state samples/s (and, with
--baselines, the tuned baselines' predictions). The workload comes from --config (an experiment YAML;
default: the model's defaults) and the flags that override it.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

try:
    import digenrl  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from digenrl.config import load_config
from digenrl.runtime.profiles import load_profile
from digenrl.sim.costs import CostModel, load_costs
from digenrl.sim.device_costs import SCALINGS, DeviceCosts
from digenrl.sim.planner import predict_baselines, search_plans
from digenrl.sim.workload import Workload


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", required=True, help="hardware profile name or YAML path")
    p.add_argument(
        "--costs",
        action="append",
        default=[],
        help="cost file (PATH) or per device type (TYPE=PATH); repeatable",
    )
    p.add_argument(
        "--model", default=None, help="with --device: load experiments/results/costs/<device>-<model>.json"
    )
    p.add_argument("--device", default=None, help="device name of the cost file (e.g. h200, cpu)")
    p.add_argument(
        "--reference-type", default=None, help="profile device type a single cost file was measured on"
    )
    p.add_argument(
        "--scaling", default="relative_speed", choices=SCALINGS, help="how to extrapolate to other types"
    )
    p.add_argument("--config", default=None, help="experiment YAML for the workload (algo/sampler/trainer)")
    p.add_argument("--prompts", type=int, default=None, help="prompts per iteration (P)")
    p.add_argument("--group-size", type=int, default=None, help="samples per prompt (G)")
    p.add_argument("--steps", type=int, default=None, help="denoising steps (T)")
    p.add_argument("--train-steps", type=int, default=None, help="trained timesteps per sample (K)")
    p.add_argument("--cfg", default=None, choices=["on", "off"], help="classifier-free guidance")
    p.add_argument("--micro-batch", type=int, default=None, help="training units per micro-batch")
    p.add_argument("--samples-per-forward", type=int, default=None, help="generator forward cap (0 = all)")
    p.add_argument("--allow-tcss", action="store_true", help="also consider one-step-stale plans (TCSS)")
    p.add_argument("--max-stages", type=int, default=8, help="largest TSP stage count to consider")
    p.add_argument("--baselines", action="store_true", help="also print the tuned baselines' predictions")
    return p.parse_args(argv)


def load_cost_models(args: argparse.Namespace) -> CostModel | dict[str, CostModel]:
    if args.model and args.device:
        return load_costs(args.device, args.model)
    if not args.costs:
        raise ValueError("give --costs PATH (or TYPE=PATH, repeatable), or --model with --device")
    typed = [c for c in args.costs if "=" in c]
    if typed and len(typed) != len(args.costs):
        raise ValueError("--costs: either one PATH, or TYPE=PATH for every file")
    if not typed:
        if len(args.costs) != 1:
            raise ValueError("--costs: several files need TYPE=PATH so each names its device type")
        return CostModel.load(args.costs[0])
    return {key: CostModel.load(path) for key, path in (c.split("=", 1) for c in typed)}


def build_workload(args: argparse.Namespace, model: str) -> Workload:
    cfg = load_config(args.config, [f"model.name={model}"] if args.config is None else None)
    workload = Workload.from_config(cfg, iterations=6)
    changes = {
        "prompts_per_iteration": args.prompts,
        "group_size": args.group_size,
        "num_steps": args.steps,
        "micro_batch_size": args.micro_batch,
        "samples_per_forward": args.samples_per_forward,
        "cfg": None if args.cfg is None else args.cfg == "on",
    }
    changes = {key: value for key, value in changes.items() if value is not None}
    if args.steps is not None and args.train_steps is None:
        changes["train_steps"] = max(1, int(args.steps * cfg.algo.timestep_fraction))
    if args.train_steps is not None:
        changes["train_steps"] = args.train_steps
    return replace(workload, **changes)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    profile = load_profile(args.profile)
    models = load_cost_models(args)
    costs = DeviceCosts(profile, models, reference_type=args.reference_type, scaling=args.scaling)
    model_name = next(iter(costs.by_type.values())).model
    workload = build_workload(args, model_name)
    print(
        f"profile {profile.name} ({profile.world_size} devices), model {model_name}: "
        f"P={workload.prompts_per_iteration} G={workload.group_size} T={workload.num_steps} "
        f"K={workload.train_steps} cfg={'on' if workload.cfg else 'off'} "
        f"micro-batch={workload.micro_batch_size}"
    )
    for type_name, cost in sorted(costs.by_type.items()):
        print(f"  costs for {type_name}: {cost.device}-{cost.model} ({cost.source})")
    start = time.perf_counter()
    result = search_plans(profile, costs, workload, allow_tcss=args.allow_tcss, max_stages=args.max_stages)
    print(result.describe())
    if args.baselines:
        print("baselines (each tuned over its own knobs):")
        for score in predict_baselines(profile, costs, workload):
            print(f"  {score.describe()}")
    print(f"planned in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
