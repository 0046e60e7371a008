"""Summarise the shared-device systems runs (experiments/gpu/h200_shared_systems.sh) and their equivalence.

    python experiments/gpu/shared_summary.py systems RUNS_ROOT --out DIR [--hardware TEXT] [--command TEXT]
    python experiments/gpu/shared_summary.py equivalence REFERENCE CANDIDATE --out DIR [--iterations 3]
        [--exact] [--name equivalence]

``systems``: one row per run folder under RUNS_ROOT (its ``config.yaml``, ``metrics.jsonl`` and the per-rank
``events/rank<r>.jsonl``): system, model, ranks, iterations done, seconds per iteration (median over the
iterations after the first, which compiles), peak GiB per rank (the ``memory`` counters every rank writes,
docs/operations.md "Reading a run"), the trace, ``ok`` (the configured iterations all done). Writes
``summary.json`` (a list of those objects) and ``summary.md``.

``equivalence``: per iteration reward, loss and update norm of both runs side by side, and the max abs
difference of the trained LoRA weights in their checkpoints after ``--iterations`` iterations; writes
``<name>.json`` and ``<name>.md``. The tolerance is bf16's (``TOLERANCE`` below, with why), or, with
``--exact``, none: runs with deterministic kernels that train the same micro-batches in the same order
(docs/operations.md, "Reproducible runs") must agree bit for bit on reward, update and gradient norm and
weights (``EXACT_KEYS``); the loss, which the schedules sum over other partitions, within ``EXACT_LOSS_ABS``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import yaml

from digenrl.runtime.observe.metrics import read_metrics

#: bf16 keeps 8 significant bits: one rounding is up to 2^-8 ≈ 0.39 % relative. Two schedules that run the
#: same update on the same trajectories may still round differently where a kernel sees another batch
#: shape (a fragment of one prompt group on the TAG trainer vs the same group inside a larger forward), so
#: per-iteration means may differ by a few roundings: 2 % relative on reward and update norm, 0.02 absolute
#: on the loss (an on-policy loss is ~0; its scale is the advantages', ~1). The
#: LoRA weights move at most about ``lr`` per AdamW step (its update is lr * m / sqrt(v), |m / sqrt(v)| <= 1
#: up to bias correction), so after N steps a different update would show as a difference of order lr;
#: equal updates differ by far less: the weight tolerance is lr / 10.
TOLERANCE = {"relative": 0.02, "weights_in_lr": 0.1}
#: what ``--exact`` requires to be equal: the update's inputs (trajectories, hence rewards) and its result
EXACT_KEYS = ("reward_mean", "update_norm", "grad_norm")
#: the reported loss is a float64 sum per training call (one per fragment, or one per batch): only close
EXACT_LOSS_ABS = 1e-9


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def peaks_by_rank(run: Path) -> dict[int, float]:
    """The largest per-iteration ``memory`` counter each rank wrote (GiB)."""
    peaks: dict[int, float] = {}
    for log in sorted((run / "events").glob("rank*.jsonl")):
        for r in read_jsonl(log):
            if r.get("type") == "counter" and r.get("name") == "memory":
                rank = int(r["rank"])
                peaks[rank] = max(peaks.get(rank, 0.0), float(r["values"]["peak_gib"]))
    return peaks


def summarise_run(run: Path) -> dict:
    cfg = yaml.safe_load((run / "config.yaml").read_text()) if (run / "config.yaml").is_file() else {}
    metrics = read_metrics(run)
    pools = cfg.get("pools") or {}
    ranks = sum(int(pools.get(k, 0) or 0) for k in ("trainers", "generators", "scorers")) or 1
    steady = metrics[1:] or metrics
    peaks = peaks_by_rank(run)
    wanted = int(cfg.get("iterations", 0) or 0)
    return {
        "run": run.name,
        "system": cfg.get("system", "?"),
        "model": (cfg.get("model") or {}).get("name", "?"),
        "ranks": ranks,
        "iterations": len(metrics),
        "s_per_iteration": round(statistics.median(r["wall_s"] for r in steady), 3) if steady else None,
        "first_iteration_s": round(metrics[0]["wall_s"], 2) if metrics else None,
        "peak_mem_gib": [round(peaks[r], 2) for r in sorted(peaks)],
        "reward_mean": [round(r["reward_mean"], 5) for r in metrics],
        "tag_fragments": [r.get("tag_fragments") for r in metrics]
        if "tag_fragments" in (metrics or [{}])[0]
        else None,
        "tflop_per_iteration": round(steady[-1]["flops"]["total"] / 1e12, 2)
        if steady and steady[-1].get("flops")
        else None,
        "fraction_of_bound": _median([r.get("fraction_of_bound") for r in steady]),
        "trace": str(run / "trace.json") if (run / "trace.json").is_file() else None,
        "ok": wanted > 0 and len(metrics) >= wanted,
    }


def _median(values: list) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 4) if present else None


def systems_table(rows: list[dict]) -> str:
    lines = [
        "| run | system | model | ranks | iterations | s/iteration (median after the 1st) | 1st s | "
        "peak GiB per rank | TAG fragments | TFLOP/iteration | fraction of bound | ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        peaks = " / ".join(f"{p:.1f}" for p in r["peak_mem_gib"]) or "-"
        tag = ",".join(str(t) for t in r["tag_fragments"]) if r.get("tag_fragments") else "-"
        lines.append(
            f"| {r['run']} | {r['system']} | {r['model']} | {r['ranks']} | {r['iterations']} | "
            f"{r['s_per_iteration']} | {r['first_iteration_s']} | {peaks} | {tag} | "
            f"{r.get('tflop_per_iteration')} | {r.get('fraction_of_bound')} | {'yes' if r['ok'] else 'NO'} |"
        )
    return "\n".join(lines)


def lora_weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    """The trainable tensors of the trainer state in ``checkpoints/step_<step>/trainer.pt``."""
    payload = torch.load(
        run / "checkpoints" / f"step_{step}" / "trainer.pt", map_location="cpu", weights_only=False
    )
    found: dict[str, torch.Tensor] = {}

    def walk(tree, prefix: str) -> None:
        if isinstance(tree, torch.Tensor):
            if "lora_" in prefix:
                found[prefix] = tree.float()
        elif isinstance(tree, dict):
            for k, v in tree.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))

    walk(payload["trainer"]["model"], "")
    return found


def equivalence(reference: Path, candidate: Path, iterations: int, *, exact: bool = False) -> dict:
    a, b = read_metrics(reference), read_metrics(candidate)
    cfg = yaml.safe_load((reference / "config.yaml").read_text())
    lr = float(cfg["trainer"]["lr"])
    rows = []
    for ra, rb in zip(a, b, strict=False):
        row = {"iteration": ra["iteration"]}
        for key in ("reward_mean", "loss", "update_norm", "grad_norm"):
            x, y = float(ra.get(key, float("nan"))), float(rb.get(key, float("nan")))
            row[key] = [x, y]
            # the loss of an on-policy step is ~0 (ratio 1 times advantages that average to 0): compared on
            # the advantages' scale (group-normalised, ~1) instead of its own
            row[f"{key}_rel"] = abs(x - y) / max(abs(x), 1.0 if key == "loss" else 1e-12)
        rows.append(row)
    diff = None
    try:
        wa, wb = lora_weights(reference, iterations), lora_weights(candidate, iterations)
        common = sorted(set(wa) & set(wb))
        diff = max((wa[k] - wb[k]).abs().max().item() for k in common) if common else None
        tensors = len(common)
    except (OSError, KeyError, RuntimeError) as error:
        tensors = f"unreadable: {error}"
    worst = max((r[f"{k}_rel"] for r in rows for k in ("reward_mean", "loss", "update_norm")), default=None)
    if exact:
        holds = (
            bool(rows)
            and all(r[k][0] == r[k][1] for r in rows for k in EXACT_KEYS)
            and all(abs(r["loss"][0] - r["loss"][1]) <= EXACT_LOSS_ABS for r in rows)
            and diff == 0.0
        )
        tolerance = {"exact": list(EXACT_KEYS), "loss_abs": EXACT_LOSS_ABS, "weights_abs": 0.0}
    else:
        holds = (
            worst is not None
            and worst <= TOLERANCE["relative"]
            and diff is not None
            and diff <= TOLERANCE["weights_in_lr"] * lr
        )
        tolerance = {**TOLERANCE, "weights_abs": TOLERANCE["weights_in_lr"] * lr}
    return {
        "reference": str(reference),
        "candidate": str(candidate),
        "iterations": rows,
        "lora_max_abs_diff": diff,
        "lora_tensors_compared": tensors,
        "lr": lr,
        "tolerance": tolerance,
        "worst_relative": worst,
        "holds": holds,
    }


def equivalence_table(report: dict) -> str:
    lines = [
        f"Reference `{Path(report['reference']).name}` vs candidate `{Path(report['candidate']).name}`",
        "",
        "| iteration | reward ref / cand | loss ref / cand | update norm ref / cand | worst rel |",
        "|---|---|---|---|---|",
    ]
    for r in report["iterations"]:
        worst = max(r[f"{k}_rel"] for k in ("reward_mean", "loss", "update_norm"))
        lines.append(
            f"| {r['iteration']} | {r['reward_mean'][0]:.6f} / {r['reward_mean'][1]:.6f} | "
            f"{r['loss'][0]:.6g} / {r['loss'][1]:.6g} | "
            f"{r['update_norm'][0]:.6g} / {r['update_norm'][1]:.6g} | "
            f"{worst:.2e} |"
        )
    lines += [
        "",
        f"Max abs difference of the trained LoRA weights after the checkpointed iterations: "
        f"{report['lora_max_abs_diff']} over {report['lora_tensors_compared']} tensors "
        f"(lr {report['lr']:g}).",
        _tolerance_line(report),
    ]
    return "\n".join(lines)


def _tolerance_line(report: dict) -> str:
    tol, holds = report["tolerance"], "yes" if report["holds"] else "NO"
    if "exact" in tol:
        return (
            f"Tolerance (deterministic kernels, same micro-batches in the same order): none — "
            f"{', '.join(tol['exact'])} and the weights bit for bit, the reported loss within "
            f"{tol['loss_abs']:g}. Holds: {holds}."
        )
    return (
        f"Tolerance (bf16): {tol['relative']:.0%} relative per iteration on reward and update norm, "
        f"{tol['relative']:g} absolute on the loss (an on-policy loss is ~0; the advantages' scale is ~1); "
        f"{tol['weights_abs']:.2g} abs on the weights (lr / 10). Holds: {holds}."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("systems")
    s.add_argument("root")
    s.add_argument("--out", required=True)
    s.add_argument("--hardware", default="")
    s.add_argument("--command", default="")
    e = sub.add_parser("equivalence")
    e.add_argument("reference")
    e.add_argument("candidate")
    e.add_argument("--out", required=True)
    e.add_argument("--iterations", type=int, default=3)
    e.add_argument(
        "--exact", action="store_true", help="bit-for-bit (deterministic kernels, same micro-batches)"
    )
    e.add_argument("--name", default="equivalence", help="output files <name>.json and <name>.md")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.what == "systems":
        runs = [d for d in sorted(Path(args.root).iterdir()) if d.is_dir() and (d / "config.yaml").is_file()]
        rows = [summarise_run(d) for d in runs]
        (out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
        head = [f"# Shared-device systems ({args.hardware})", "", f"Command: `{args.command}`", ""]
        (out / "summary.md").write_text("\n".join(head) + systems_table(rows) + "\n")
        print(systems_table(rows))
        return 0
    report = equivalence(Path(args.reference), Path(args.candidate), args.iterations, exact=args.exact)
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=1) + "\n")
    table = equivalence_table(report)
    (out / f"{args.name}.md").write_text(f"# GPU equivalence ({args.name})\n\n{table}\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
