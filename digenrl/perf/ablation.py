"""Ablation: the baselines and DigenRL's mechanisms added one at a time, side by side on one profile.

Each variant is a real ``torchrun`` run of ``experiments/run_train.py`` with the same model, logical
batch and seed. The ladder: ``colocated-sync`` (every rank generates and trains), ``separate-sync``
(disjoint pools, full-batch barrier), then ``digenrl`` with GAP, + TSP (needs 2+ generators), + TAG,
+ TCSS, and ``separate-async`` at staleness 1 beside the last (equal staleness, docs/design.md §4).
Opt-in rows (``--variants``, :func:`switch_variants`) run the TCSS row with other ``tcss.switch`` values:
``timing`` (the non-reproducible switch) and one fragment per generator rank (fresher, may wait);
``--fragment-samples S`` adds the GAP rows with fragments of S samples, also below a group
(:func:`fragment_variants`, with and without TAG).
Every variant runs ``--repeats`` times, interleaved with the others, and the table reports medians over
the runs (the samples/s of each run in brackets: a shared CPU machine drifts). Per run: the median
iteration time after ``--warmup`` iterations, trained
samples/s over the steady window (from the commit of the last warm-up iteration to the end: one window,
since with TCSS and the async baseline iterations overlap), each pool's busy fraction, the bubble-free
bound (the samples/s a perfect schedule of the same busy device-seconds would reach,
``digenrl.runtime.observe.event_summary.steady_window``), the staleness the
variant allows and the fraction of samples that were one version stale, and the ratio of samples/s to
``separate-sync`` measured in the same invocation.

    python experiments/measure.py ablation --nproc 2 --trainers 1 --profile cpu-2 --out runs/ablation-cpu2
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
from pathlib import Path

from digenrl.launch import launch_torchrun
from digenrl.runtime.observe.event_summary import steady_window

#: where the runs and the table go unless told (experiments/measure.py passes the checkout's runs/)
DEFAULT_OUT = Path("runs") / "ablation"
DIGENRL = ["system=digenrl", "tag=false", "tcss=false"]


def ladder(generators: int, stages: int, fragment_groups: int) -> dict[str, tuple[list[str], int]]:
    """Variant name → (overrides, staleness it allows). TSP rows need a pipeline of 2+ stages."""
    tsp = stages > 1
    digenrl = [*DIGENRL, f"gap.fragment_groups={fragment_groups}"]
    base = [*digenrl, f"tsp_stages={stages if tsp else 1}"]
    mechanisms = "gap+tsp" if tsp else "gap"
    variants: dict[str, tuple[list[str], int]] = {
        "colocated-sync": (["system=colocated-sync"], 0),
        "separate-sync": (["system=separate-sync"], 0),
        "digenrl gap": ([*digenrl, "tsp_stages=1"], 0),
    }
    if tsp:
        variants["digenrl gap+tsp"] = (base, 0)
    variants[f"digenrl {mechanisms}+tag"] = ([*base, "tag=true", "tag.policy=auto"], 0)
    variants[f"digenrl {mechanisms}+tag+tcss"] = ([*base, "tag=true", "tag.policy=auto", "tcss=true"], 1)
    variants["separate-async s=1"] = (["system=separate-async", "asynchrony.max_staleness=1"], 1)
    return variants


def switch_variants(generators: int, stages: int, fragment_groups: int) -> dict[str, tuple[list[str], int]]:
    """The ladder's TCSS row (``tcss.switch=auto``: the whole next iteration one version stale) with
    ``tcss.switch=timing`` and with the switch at fragment ``generators`` instead."""
    name, (overrides, staleness) = next(
        (n, v) for n, v in ladder(generators, stages, fragment_groups).items() if n.endswith("+tcss")
    )
    return {
        f"{name} switch=timing": ([*overrides, "tcss.switch=timing"], staleness),
        f"{name} switch={generators}": ([*overrides, f"tcss.switch={generators}"], staleness),
    }


def fragment_variants(stages: int, fragment_samples: int) -> dict[str, tuple[list[str], int]]:
    """The GAP and GAP+TAG rows with fragments of ``fragment_samples`` samples (``gap.fragment_samples``)."""
    base = [*DIGENRL, f"gap.fragment_samples={fragment_samples}", f"tsp_stages={stages}"]
    name = f"digenrl gap S={fragment_samples}"
    return {name: (base, 0), f"{name}+tag": ([*base, "tag=true", "tag.policy=auto"], 0)}


def run_variant(
    name: str, overrides: list[str], staleness: int, args: argparse.Namespace, out: Path, repeat: int
) -> dict:
    run_dir = out / name.replace(" ", "_").replace("+", "-").replace("=", "") / f"run{repeat}"
    colocated = overrides[0].startswith("system=colocated")
    pools = (
        []
        if colocated
        else [f"pools.trainers={args.trainers}", f"pools.generators={args.nproc - args.trainers}"]
    )
    start = time.perf_counter()
    launch_torchrun(
        [
            f"profile={args.profile}",
            f"iterations={args.iterations}",
            f"seed={args.seed}",
            f"out_dir={run_dir}",
            "overwrite=true",  # a re-run replaces this script's own run
            "eval.every=0",  # the config's held-out evaluation is no part of the throughput compared
            *pools,
            *args.overrides,
            *overrides,
        ],
        nproc=args.nproc,
        config=args.config,
        threads=args.threads,
        timeout_s=args.timeout,
        label=f"ablation {name}",
    )
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    steady = records[args.warmup :] or records
    wall = statistics.median(r["wall_s"] for r in steady)
    samples = statistics.median(r["samples"] for r in steady)
    roles = ("colocated",) if colocated else ("trainer", "generator")
    busy = {
        role: statistics.median(r.get("busy_fraction", {}).get(role, float("nan")) for r in steady)
        for role in roles
    }
    window = steady_window(run_dir, steady[0]["iteration"])
    trained = sum(r["samples"] for r in steady)
    return {
        "variant": name,
        "overrides": overrides,
        "iteration_s_median": wall,
        "samples_per_s": trained / window["window_s"],
        "samples_per_s_median_iteration": samples / wall,
        "busy": busy,
        "bubble_free_samples_per_s": trained / window["bubble_free_bound_s"],
        "staleness_allowed": staleness,
        "stale_fraction": statistics.mean(r.get("stale_fraction", 0.0) for r in steady),
        "tag_fragments": statistics.mean(r.get("tag_fragments", 0.0) for r in steady),
        "reward_last": records[-1]["reward_mean"],
        "run_dir": str(run_dir),
        "launch_s": time.perf_counter() - start,
    }


def summarize(runs: list[dict]) -> dict:
    """One row per variant from its repeated runs: medians, and the spread of samples/s."""
    rates = [r["samples_per_s"] for r in runs]
    row = dict(runs[0])
    for key in (
        "iteration_s_median",
        "samples_per_s",
        "bubble_free_samples_per_s",
        "stale_fraction",
        "tag_fragments",
    ):
        row[key] = statistics.median(r[key] for r in runs)
    row["busy"] = {role: statistics.median(r["busy"][role] for r in runs) for role in runs[0]["busy"]}
    row["samples_per_s_runs"] = rates
    row["run_dir"] = [r["run_dir"] for r in runs]
    return row


def table(rows: list[dict]) -> str:
    base = next(r for r in rows if r["variant"] == "separate-sync")["samples_per_s"]
    lines = [
        "| variant | staleness | iteration s | samples/s (runs) | bubble-free bound | busy | "
        "stale samples | TAG fragments/it | vs separate-sync |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        busy = ", ".join(f"{role} {100 * f:.0f}%" for role, f in r["busy"].items())
        ratio = r["samples_per_s"] / base
        lines.append(
            f"| {r['variant']} | ≤{r['staleness_allowed']} | {r['iteration_s_median']:.3f} | "
            f"{r['samples_per_s']:.2f} ({', '.join(f'{x:.1f}' for x in r['samples_per_s_runs'])}) | "
            f"{r['bubble_free_samples_per_s']:.2f} | {busy} | "
            f"{100 * r['stale_fraction']:.0f}% | {r['tag_fragments']:.1f} | {ratio:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None, *, config: Path | None = None, out: Path = DEFAULT_OUT) -> int:
    """``config`` / ``out``: the defaults of ``--config`` (None: required) and ``--out``
    (experiments/measure.py gives the checkout's ``experiments/configs/tiny.yaml`` and ``runs/ablation``)."""
    parser = argparse.ArgumentParser(
        prog="experiments/measure.py ablation", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--config", type=Path, default=config, required=config is None)
    parser.add_argument("--profile", default="cpu-4")
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--trainers", type=int, default=2)
    parser.add_argument(
        "--tsp-stages", type=int, default=0, help="0: every generator is one stage of one pipeline"
    )
    parser.add_argument(
        "--fragment-groups", type=int, default=1, help="gap.fragment_groups of the digenrl rows"
    )
    parser.add_argument(
        "--fragment-samples",
        type=int,
        default=0,
        help="add GAP rows (with and without TAG) with fragments of this many samples (0: none)",
    )
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="iterations excluded from the medians")
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs per variant (interleaved); medians reported"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--variants", nargs="*", help="a subset of the ladder (default: all of it)")
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument(
        "overrides", nargs="*", help="extra key=value overrides for every variant (keys every system reads)"
    )
    args = parser.parse_args(argv)
    generators = args.nproc - args.trainers
    stages = args.tsp_stages or generators
    default = ladder(generators, stages, args.fragment_groups)
    variants = {**default, **switch_variants(generators, stages, args.fragment_groups)}
    if args.fragment_samples:
        variants |= fragment_variants(stages if stages > 1 else 1, args.fragment_samples)
    chosen = args.variants or list(default)
    unknown = [v for v in chosen if v not in variants]
    if unknown:
        parser.error(
            f"--variants {unknown} are not in the ladder for {generators} generator(s): {list(variants)}"
        )
    if "separate-sync" not in chosen:
        parser.error("--variants must include separate-sync (the baseline of the ratio column)")
    args.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {name: [] for name in chosen}
    for repeat in range(args.repeats):  # interleaved, so drift on a shared machine hits every variant alike
        for name in chosen:
            overrides, staleness = variants[name]
            runs[name].append(run_variant(name, overrides, staleness, args, args.out, repeat))
            print(
                f"[ablation] {name} run {repeat}: {runs[name][-1]['samples_per_s']:.2f} samples/s", flush=True
            )
    rows = [summarize(runs[name]) for name in chosen]
    text = table(rows)
    print(text)
    command = "python experiments/measure.py ablation " + shlex.join(sys.argv[2:] if argv is None else argv)
    meta = {
        "command": command,
        "date": time.strftime("%Y-%m-%d"),
        "hardware": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "nproc": args.nproc,
        "trainers": args.trainers,
        "profile": args.profile,
    }
    (args.out / "ablation.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    (args.out / "ablation.md").write_text(
        f"# Ablation ({meta['date']}, {meta['hardware']})\n\n`{command}`\n\n{text}\n"
    )
    return 0
