"""Ablation: separate-sync vs DigenRL with GAP, then GAP + TSP, side by side on one profile.

Each variant is a real ``torchrun`` run of ``experiments/run_train.py`` with the same model, logical
batch, seed and pool split; the table reports the median iteration time after ``--warmup``
iterations, trained samples/s, each pool's busy fraction (from the event logs) and the ratio of
samples/s to ``separate-sync`` measured in the same invocation.

    python experiments/run_ablation.py --nproc 2 --trainers 1 --profile cpu-2 \
        --variants separate-sync "digenrl gap f=1" "digenrl gap f=4" --out runs/ablation-cpu2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from digenrl.launch import launch_torchrun

REPO = Path(__file__).resolve().parents[1]

VARIANTS: dict[str, list[str]] = {
    "separate-sync": ["system=separate-sync"],
    # fragment size trades pipeline depth against the batching efficiency of each forward
    "digenrl gap f=1": ["system=digenrl", "gap=true", "gap.fragment_groups=1", "tsp_stages=1"],
    "digenrl gap f=4": ["system=digenrl", "gap=true", "gap.fragment_groups=4", "tsp_stages=1"],
    "digenrl gap+tsp2 f=1": ["system=digenrl", "gap=true", "gap.fragment_groups=1", "tsp_stages=2"],
    "digenrl gap+tsp2 f=4": ["system=digenrl", "gap=true", "gap.fragment_groups=4", "tsp_stages=2"],
}


def run_variant(name: str, overrides: list[str], args: argparse.Namespace, out: Path) -> dict:
    run_dir = out / name.replace(" ", "_").replace("+", "-").replace("=", "")
    start = time.perf_counter()
    launch_torchrun(
        [
            f"profile={args.profile}",
            f"iterations={args.iterations}",
            f"seed={args.seed}",
            f"out_dir={run_dir}",
            f"pools.trainers={args.trainers}",
            f"pools.generators={args.nproc - args.trainers}",
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
    busy = {
        role: statistics.median(r.get("busy_fraction", {}).get(role, float("nan")) for r in steady)
        for role in ("trainer", "generator")
    }
    return {
        "variant": name,
        "overrides": overrides,
        "iteration_s_median": wall,
        "samples_per_s": samples / wall,
        "busy_trainer": busy["trainer"],
        "busy_generator": busy["generator"],
        "reward_last": records[-1]["reward_mean"],
        "run_dir": str(run_dir),
        "launch_s": time.perf_counter() - start,
    }


def table(rows: list[dict]) -> str:
    base = next(r for r in rows if r["variant"] == "separate-sync")["samples_per_s"]
    lines = [
        "| variant | iteration s (median) | samples/s | trainer busy | generator busy | vs separate-sync |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['iteration_s_median']:.3f} | {r['samples_per_s']:.2f} | "
            f"{r['busy_trainer']:.2f} | {r['busy_generator']:.2f} | {r['samples_per_s'] / base:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "experiments" / "configs" / "tiny.yaml")
    parser.add_argument("--profile", default="cpu-4")
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--trainers", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2, help="iterations excluded from the medians")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "ablation")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for every variant")
    args = parser.parse_args()
    if "separate-sync" not in args.variants:
        parser.error("--variants must include separate-sync (the baseline of the ratio column)")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [run_variant(name, VARIANTS[name], args, args.out) for name in args.variants]
    text = table(rows)
    print(text)
    command = "python experiments/run_ablation.py " + " ".join(sys.argv[1:])
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


if __name__ == "__main__":
    main()
