"""``python experiments/simulate.py <command>``: everything that simulates (nothing here measures or plots).

    plan        the best plan for a profile and cost file, with the tuned baselines
    throughput  the table of every system per scenario × profile      (out: runs/simulate/throughput)
    scaling     strong scaling with the GPU count                      (out: runs/simulate/scaling)
    split       the generator : trainer split                          (out: runs/simulate/split)
    validate    predicted vs measured seconds, per phase, of real runs (out: runs/simulate/validation)

Tables are written where ``--out`` says, by default under ``runs/``; ``--regenerate`` writes the committed
folder under ``experiments/results/`` (the command goes into the table's header and into
``experiments/results/README.md``). Every command takes the :class:`~digenrl.reports.folders.Folders` of
the checkout from its entry point (``experiments/simulate.py``). This module also holds ``measure.py
missing`` (:func:`missing`) and the dispatch of both entry points' commands (:func:`dispatch`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from digenrl.config import Config, explicit_keys, load_config
from digenrl.costs.cost_model import CostModel, load_costs
from digenrl.costs.device_costs import SCALINGS, DeviceCosts
from digenrl.costs.sample_costs import SampleVariance
from digenrl.dependency_logs import quiet_dependency_logs
from digenrl.plan import RunPlan, is_schedule_key
from digenrl.reports import tables
from digenrl.reports.folders import Folders


def _parser(command: str, doc: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog=f"experiments/simulate.py {command}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _out(args: argparse.Namespace, name: str, folders: Folders) -> Path:
    if args.regenerate and args.out is not None:
        raise SystemExit("--regenerate writes experiments/results/" + name + "; do not pass --out with it")
    if args.regenerate:
        return folders.results / name
    return args.out if args.out is not None else folders.runs / "simulate" / name


def _table_args(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("--max-stages", type=int, default=4, help="largest TSP stage count the planner tries")
    p.add_argument(
        "--quick", action="store_true", help="tiny-sd3 from its CPU cost file, tiny workload (tests)"
    )
    p.add_argument("--costs", type=Path, default=None, help="cost file to use (one scenario)")
    p.add_argument("--out", type=Path, default=None, help=f"output folder (default: runs/simulate/{name})")
    p.add_argument("--regenerate", action="store_true", help=f"write experiments/results/{name}")


def _cost_file(args: argparse.Namespace, folders: Folders) -> Path | None:
    """``--costs``, else with ``--quick`` the tiny model's CPU file, else None (each scenario's own file)."""
    return args.costs or (tables.quick_cost_file(folders) if args.quick else None)


def _flux_by_default(args: argparse.Namespace) -> list[tables.Scenario]:
    """The scenarios of a scaling / split table (FLUX.1-dev LoRA unless named)."""
    chosen = tables.scenarios(args.quick, args.scenarios or (None if args.quick else ["flux.1-dev"]))
    return [s for s in chosen if args.quick or s.variant == "lora" or args.scenarios]


def _command(name: str, argv: list[str] | None) -> str:
    return f"python experiments/simulate.py {name} " + shlex.join(sys.argv[2:] if argv is None else argv)


# ----------------------------------------------------------------------------- plan


def plan(argv: list[str] | None, folders: Folders) -> int:
    """Ask the planner for the best plan on a hardware profile (and, with --baselines, the baselines)."""
    from digenrl.plan.workload import Workload
    from digenrl.planning.planner import Planner
    from digenrl.rules.schedule import trained_step_count
    from digenrl.runtime.hardware.profiles import load_profile

    p = _parser("plan", plan.__doc__)
    p.add_argument("--profile", required=True, help="hardware profile name or YAML path")
    p.add_argument("--costs", action="append", default=[], help="cost file (PATH) or TYPE=PATH; repeatable")
    p.add_argument(
        "--model", default=None, help="with --device: experiments/results/costs/<device>-<model>.json"
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
    p.add_argument("--max-staleness", type=int, default=0, choices=[0, 1], help="1: TCSS plans allowed")
    p.add_argument("--max-stages", type=int, default=8, help="largest TSP stage count to consider")
    p.add_argument("--baselines", action="store_true", help="also print the tuned baselines' predictions")
    p.add_argument(
        "--json", action="store_true", help="print only the best plan, as a run's plan.json holds it"
    )
    p.add_argument(
        "--emit-config",
        type=Path,
        default=None,
        metavar="PATH",
        help="write a config that `run_train.py --config PATH` runs as exactly the best plan",
    )
    args = p.parse_args(argv)
    if args.emit_config is not None and (args.train_steps is not None or args.cfg is not None):
        p.error(
            "--emit-config cannot write --train-steps or --cfg as config keys exactly; set them in --config "
            "(algo.timestep_fraction, sampler.guidance_scale) instead"
        )
    profile = load_profile(args.profile)
    if args.model and args.device:
        models: CostModel | dict[str, CostModel] = load_costs(args.device, args.model, folders.costs)
    elif not args.costs:
        p.error("give --costs PATH (or TYPE=PATH, repeatable), or --model with --device")
    elif all("=" in c for c in args.costs):
        models = {key: CostModel.load(path) for key, path in (c.split("=", 1) for c in args.costs)}
    elif len(args.costs) == 1 and "=" not in args.costs[0]:
        models = CostModel.load(args.costs[0])
    else:
        p.error("--costs: either one PATH, or TYPE=PATH for every file")
    costs = DeviceCosts(profile, models, reference_type=args.reference_type, scaling=args.scaling)
    model_name = next(iter(costs.by_type.values())).model
    cfg = load_config(args.config, [f"model.name={model_name}"] if args.config is None else None)
    workload = Workload.from_config(cfg, iterations=6)
    changes = {
        "prompts_per_iteration": args.prompts,
        "group_size": args.group_size,
        "num_steps": args.steps,
        "micro_batch_size": args.micro_batch,
        "cfg": None if args.cfg is None else args.cfg == "on",
    }
    changes = {k: v for k, v in changes.items() if v is not None}
    if args.steps is not None:
        changes["train_steps"] = args.train_steps or trained_step_count(cfg.algo, args.steps)
    elif args.train_steps is not None:
        changes["train_steps"] = args.train_steps
    workload = replace(workload, **changes)
    say = (lambda *a, **k: None) if args.json else print
    say(
        f"profile {profile.name} ({profile.world_size} devices), model {model_name}: "
        f"P={workload.prompts_per_iteration} G={workload.group_size} T={workload.num_steps} "
        f"K={workload.train_steps} cfg={'on' if workload.cfg else 'off'} "
        f"micro-batch={workload.micro_batch_size}"
    )
    for type_name, cost in sorted(costs.by_type.items()):
        say(f"  costs for {type_name}: {cost.device}-{cost.model} ({cost.source}, path {cost.path})")
    start = time.perf_counter()
    planner = Planner(profile, costs, workload)
    result = planner.search(max_staleness=args.max_staleness, max_stages=args.max_stages)
    # the plan as a run of it records it: the workload's memory knobs and the profile as given
    best = result.best.plan.resolved(workload, profile).with_(profile=args.profile)
    run_items = _run_config_items(cfg if args.config else None, best, model_name, changes)
    if args.emit_config is not None:
        _write_config(args.emit_config, run_items)
        command = f"python experiments/run_train.py --config {shlex.quote(str(args.emit_config))}"
    else:
        base = f" --config {shlex.quote(args.config)}" if args.config else ""
        # with --config the file holds the rest; a command-line system= switches off its other systems' knobs
        items = run_items
        if args.config:
            items = {_WORKLOAD_KEYS[k]: v for k, v in changes.items() if k in _WORKLOAD_KEYS}
            items |= best.config_items()
        command = f"python experiments/run_train.py{base} " + " ".join(
            shlex.quote(f"{k}={_override_text(v)}") for k, v in items.items()
        )
    if args.json:
        print(json.dumps(best.to_json(), indent=2))
        return 0
    print(result.describe())
    print("  run it: " + command)
    if args.baselines:
        print("baselines (each tuned over its own knobs):")
        for label, score in planner.baselines(max_staleness=1).items():
            print(f"  {label}: {score.describe() if score else 'no plan fits in memory'}")
    print(f"planned in {time.perf_counter() - start:.1f} s")
    return 0


#: Workload fields ``simulate.py plan`` may change and the config keys that say the same.
_WORKLOAD_KEYS = {
    "prompts_per_iteration": "algo.prompts_per_iteration",
    "group_size": "algo.group_size",
    "num_steps": "sampler.num_steps",
    "micro_batch_size": "trainer.micro_batch_size",
}


def _run_config_items(base: Config | None, plan: RunPlan, model: str, changes: Mapping[str, Any]) -> dict:
    """The dotted keys of a config that runs ``plan`` for the planned workload: ``base``'s own keys but the
    schedule's (:data:`~digenrl.plan.SCHEDULE_KEYS`), the model, the workload changed on the command line,
    then the plan's keys (:meth:`RunPlan.config_items`)."""
    items: dict[str, Any] = {}
    if base is not None:
        for key in explicit_keys(base):
            if not is_schedule_key(key):
                section, _, name = key.partition(".")
                items[key] = getattr(getattr(base, section), name) if name else getattr(base, section)
    else:
        items["model.name"] = model
    items |= {_WORKLOAD_KEYS[k]: v for k, v in changes.items() if k in _WORKLOAD_KEYS}
    return items | plan.config_items()


def _write_config(path: Path, items: Mapping[str, Any]) -> None:
    """``items`` (dotted keys) as a nested YAML config file."""
    tree: dict[str, Any] = {}
    for key, value in items.items():
        section, _, name = key.partition(".")
        if name:
            tree.setdefault(section, {})[name] = value
        else:
            tree[key] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "# written by `python experiments/simulate.py plan --emit-config`: the planner's best plan\n"
        + yaml.safe_dump(tree, sort_keys=False)
    )


def _override_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


# ----------------------------------------------------------------------------- tables


def throughput(argv: list[str] | None, folders: Folders) -> int:
    """Throughput per scenario × profile × system (module docstring of digenrl.reports.tables)."""
    p = _parser("throughput", tables.__doc__)
    p.add_argument("--scenarios", nargs="*", default=None, help="labels or models (default: all)")
    p.add_argument("--profiles", nargs="*", default=None, help=f"default: {' '.join(tables.PROFILES)}")
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the rows of the existing table for the scenario x profile pairs not computed now "
        "(a table built in several runs; every run's command stays in the header)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="panels (scenario x profile) searched in parallel processes; each panel's search is "
        "sequential and the rows are the same whatever the count",
    )
    p.add_argument(
        "--variance",
        type=Path,
        default=None,
        help="per-sample cost distributions (experiments/results/costs/variance/*.json): the scenarios' "
        "rows are computed with them, labelled '<scenario> +variance' (add them with --merge)",
    )
    p.add_argument("--variance-seed", type=int, default=None, help="seed of the draws (default: the file's)")
    _table_args(p, "throughput")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error(f"--jobs must be >= 1, got {args.jobs}")
    out = _out(args, "throughput", folders)
    chosen = tables.scenarios(args.quick, args.scenarios)
    if args.variance is not None:
        try:
            variance = SampleVariance.load(args.variance)
        except ValueError as error:
            p.error(f"--variance: {error}")
        if args.variance_seed is not None:
            variance = variance.with_seed(args.variance_seed)
        chosen = tables.with_variance(chosen, variance)
    elif args.variance_seed is not None:
        p.error("--variance-seed needs --variance FILE")
    cost_file = _cost_file(args, folders)
    profiles = args.profiles or (tables.QUICK_PROFILES if args.quick else tables.PROFILES)
    panels = [(scenario, profile) for profile in profiles for scenario in chosen]
    commands = [_command("throughput", argv)]
    old_rows: list[dict[str, Any]] = []
    if args.merge and (out / "table.csv").is_file():
        old_commands, old_rows = tables.read_table(out / "table.csv")
        commands = [c for c in old_commands if c not in commands] + commands
    header = tables.header_lines(commands, "Throughput per scenario x profile x system.")
    validation = tables.validation_errors(folders.validation)
    rows: list[dict[str, Any]] = []
    asked = {(scenario.label, profile): i for i, (scenario, profile) in enumerate(panels)}
    # the table is rewritten as each panel ends: a long regeneration that is stopped keeps what it finished
    for panel in tables.panel_rows(
        panels, folders, max_stages=args.max_stages, cost_file=cost_file, jobs=args.jobs
    ):
        rows += panel
        rows.sort(key=lambda r: asked[(r["scenario"], r["profile"])])  # stable: a panel's rows keep order
        done = {(r["scenario"], r["profile"]) for r in rows}
        kept = [r for r in old_rows if (r["scenario"], r["profile"]) not in done]
        table = tables.panel_order(kept + rows) if kept else rows
        tables.attach_validation(table, validation)
        csv_path, md_path = tables.write_table(table, out, "table", header)
    print(f"[throughput] wrote {csv_path} and {md_path}")
    return 0


def scaling(argv: list[str] | None, folders: Folders) -> int:
    """Strong scaling: the same logical batch on 8, 16, 24, 32 GPUs of an H800 cluster."""
    p = _parser("scaling", scaling.__doc__)
    p.add_argument("--scenarios", nargs="*", default=None, help="labels or models (default: flux.1-dev)")
    p.add_argument("--base-profile", default="h800-32", help="one-node-group profile to cut")
    p.add_argument("--nodes", nargs="*", type=int, default=[1, 2, 3, 4], help="node counts")
    _table_args(p, "scaling")
    args = p.parse_args(argv)
    out = _out(args, "scaling", folders)
    chosen, cost_file = _flux_by_default(args), _cost_file(args, folders)
    base = tables.load_profile(args.base_profile)
    nodes = [1, 2] if args.quick else args.nodes
    rows = []
    for scenario in chosen:
        rows += tables.scaling_rows(
            scenario, base, nodes, folders, max_stages=args.max_stages, cost_file=cost_file
        )
    header = tables.header_lines(
        [_command("scaling", argv)],
        f"Strong scaling (fixed logical batch) on {args.base_profile} cut to nodes.",
    )
    csv_path, md_path = tables.write_table(rows, out, "scaling", header)
    print(f"[scaling] wrote {csv_path} and {md_path}")
    return 0


def split(argv: list[str] | None, folders: Folders) -> int:
    """Generator : trainer split sensitivity: separate-sync and DigenRL's mechanisms per pool split."""
    p = _parser("split", split.__doc__)
    p.add_argument("--scenarios", nargs="*", default=None, help="labels or models (default: flux.1-dev)")
    p.add_argument("--base-profile", default="h800-32", help="one-node-group profile to cut")
    p.add_argument("--nodes", type=int, default=2, help="8-GPU nodes (2 = 16 GPUs)")
    _table_args(p, "split")
    args = p.parse_args(argv)
    out = _out(args, "split", folders)
    profile = tables.sub_cluster(tables.load_profile(args.base_profile), 1 if args.quick else args.nodes)
    chosen, cost_file = _flux_by_default(args), _cost_file(args, folders)
    rows = []
    for scenario in chosen:
        start = time.perf_counter()
        rows += tables.split_rows(scenario, profile, folders, max_stages=args.max_stages, cost_file=cost_file)
        print(f"[split] {scenario.label} on {profile.name} [{time.perf_counter() - start:.1f} s]", flush=True)
    header = tables.header_lines(
        [_command("split", argv)], f"Generator:trainer split sensitivity on {profile.name}."
    )
    csv_path, md_path = tables.write_table(rows, out, "split", header)
    print(f"[split] wrote {csv_path} and {md_path}")
    return 0


# ----------------------------------------------------------------------------- validate


def validate(argv: list[str] | None, folders: Folders) -> int:
    """Predicted vs measured seconds per phase of real runs (digenrl.reports.validation.compare_run): each
    RUN_DIR's config.yaml is simulated on its profile from a cost file of the run's code path."""
    from digenrl.reports.validation import compare_run, report_markdown

    p = _parser("validate", validate.__doc__)
    p.add_argument("run_dirs", nargs="+", type=Path, help="out_dir of real runs (config.yaml, events/)")
    p.add_argument("--costs", type=Path, default=None, help="cost file (default: <device>-<model>.json)")
    p.add_argument("--warmup", type=int, default=1, help="iterations excluded at the start (both sides)")
    p.add_argument("--cooldown", type=int, default=0, help="iterations excluded at the end (both sides)")
    p.add_argument("--name", default="validation", help="report file stem")
    p.add_argument("--out", type=Path, default=None, help="report folder (default: runs/simulate/validation)")
    p.add_argument("--regenerate", action="store_true", help="write experiments/results/validation")
    args = p.parse_args(argv)
    out = _out(args, "validation", folders)
    rows = [
        compare_run(
            d, cost_file=args.costs, warmup=args.warmup, cooldown=args.cooldown, costs_dir=folders.costs
        )
        for d in args.run_dirs
    ]
    text = report_markdown(rows, _command("validate", argv))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.md").write_text(text)
    (out / f"{args.name}.json").write_text(json.dumps({"rows": rows}, indent=2, default=str) + "\n")
    print(text)
    print(f"[validate] wrote {out / (args.name + '.md')} and .json")
    return 0


def memory(argv: list[str] | None, folders: Folders) -> int:
    """The planner's memory estimate of each RUN_DIR's first rank against the run's measured peak
    (digenrl/reports/memory_check.py)."""
    from digenrl.reports.memory_check import memory_row, report_markdown

    p = _parser("memory", memory.__doc__)
    p.add_argument(
        "run_dirs", nargs="+", type=Path, help="out_dir of real GPU runs (config.yaml, metrics.jsonl)"
    )
    p.add_argument("--profile", default=None, help="the profile the runs ran on, where they recorded auto")
    p.add_argument("--name", default="memory", help="report file stem")
    p.add_argument("--out", type=Path, default=None, help="report folder (default: runs/simulate/memory)")
    p.add_argument("--regenerate", action="store_true", help="write experiments/results/memory")
    args = p.parse_args(argv)
    out = _out(args, "memory", folders)
    rows = [memory_row(d, folders.costs, args.profile) for d in args.run_dirs]
    text = report_markdown(rows, _command("memory", argv))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.md").write_text(text)
    (out / f"{args.name}.json").write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    print(text)
    print(f"[memory] wrote {out / (args.name + '.md')} and .json")
    return 0


# ----------------------------------------------------------------------------- measure.py missing


def missing(argv: list[str] | None, folders: Folders) -> int:
    """List the cost points a GPU call must re-measure (:mod:`digenrl.costs.audit`) for the tables'
    workloads."""
    from digenrl.costs.audit import GPU_PATH, audit, missing_measurements

    p = argparse.ArgumentParser(prog="experiments/measure.py missing", description=missing.__doc__)
    p.add_argument("--costs-dir", type=Path, default=folders.costs)
    args = p.parse_args(argv)
    for path in sorted(args.costs_dir.glob("*.json")):
        costs = CostModel.load(path)
        gpu = costs.device != "cpu"
        workload = tables.default_workload(costs.model, quick=not gpu)  # the table's workload of the model
        reasons = audit(costs, workload, expected_path=GPU_PATH if gpu else "eager")
        print(
            f"{path.name} (for the table workload, micro-batch {workload.micro_batch_size}): "
            f"{'; '.join(reasons) or 'up to date'}"
        )
    print("\nbenchmarks that replace the stale points (experiments/gpu/h200_refresh_costs.sh runs them):")
    for m in missing_measurements(args.costs_dir):
        print(f"  # {m.model}: {m.replaces}\n  {m.command()}")
    return 0


# ----------------------------------------------------------------------------- dispatch

#: ``experiments/simulate.py``'s commands; each takes ``(argv, folders)``.
COMMANDS: dict[str, Callable[[list[str] | None, Folders], int]] = {
    "plan": plan,
    "throughput": throughput,
    "scaling": scaling,
    "split": split,
    "validate": validate,
    "memory": memory,
}


def module_main(module: str, **defaults: Any) -> Callable[[list[str]], int]:
    """The ``main`` of ``module``, imported when the command runs (an entry point imports only what its
    command needs), called with ``defaults`` (the checkout's folders the entry point knows)."""

    def run(argv: list[str]) -> int:
        return importlib.import_module(module).main(argv, **defaults)

    return run


def dispatch(
    doc: str, commands: Mapping[str, Callable[[list[str]], int] | str], argv: list[str] | None
) -> int:
    """Run ``argv[0]`` of ``commands`` (a function of the remaining arguments, or the name of a module whose
    ``main`` takes them) with the rest of ``argv``; the usage ``doc`` without a known command (the entry
    points experiments/measure.py and simulate.py)."""
    quiet_dependency_logs()
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print(doc)
        if argv and argv[0] not in ("-h", "--help"):
            print(f"unknown command {argv[0]!r}; choose one of: {', '.join(commands)}", file=sys.stderr)
            return 2
        return 0 if argv else 2
    command = commands[argv[0]]
    run = command if callable(command) else importlib.import_module(command).main
    return run(argv[1:]) or 0
