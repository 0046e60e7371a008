"""Summarise the full-loop runs of experiments/gpu/h200_loops.sh: one row per run directory.

Each run is a plain ``run_train.py`` colocated run; its ``metrics.jsonl`` holds per-iteration seconds and the
FLOP accounting of :mod:`digenrl.costs.flops`. A row reports medians over the iterations after the first
(the first compiles), the peak memory over all iterations, and the code path the run executed (from its
resolved ``config.yaml``). ``loop.json`` beside a run (written by the script) names the config file and the
``command``, ``hardware`` and ``date`` of the call that ran it; they win over the command line's, which only
fill in for runs without them (a warm device keeps earlier calls' runs, and the summary of a later call
must not stamp its own command on them).

    python experiments/gpu/loops_summary.py RUNS_DIR --out OUT_DIR [--command "..."] [--hardware "..."]

Writes ``OUT_DIR/summary.json`` (a list of objects with ``model``, ``config``, ``prompts``, ``samples_per_s``,
``rollout_s``, ``train_s``, ``score_s``, ``fraction_of_bound``, ``peak_mem_gib``, ``path``, the call's
``hardware``, ``command`` and ``date``, and more) and ``summary.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from pathlib import Path

import yaml

from digenrl.runtime.observe.metrics import read_metrics


def _median(values: list[float], digits: int = 4) -> float | None:
    """Median of the values present; ratios take ``digits=6`` (1 - 2e-5 must not print as 1.0)."""
    values = [v for v in values if v is not None]
    return round(statistics.median(values), digits) if values else None


def code_path(cfg: dict) -> str:
    """What the run executed: the system when it is not colocated-sync, compile / autocast as resolved on a
    GPU (None = on), cuDNN SDPA, FP8, the compiled VAE, Qwen-Image's masked text, colocated-overlap's scorer
    on the default stream."""
    model = cfg.get("model", {})
    compiled = model.get("compile") is not False
    autocast = model.get("autocast") is not False and model.get("dtype") in ("bfloat16", "float16")
    path = "compiled+autocast" if compiled and autocast else "compiled" if compiled else "eager"
    if autocast and not compiled:
        path = "autocast"
    if model.get("cudnn_sdpa", "auto") == "disabled":
        path += ", cuDNN SDPA off"
    if model.get("fp8"):
        path += ", FP8"
    if model.get("compile_vae"):
        path += ", VAE compiled"
    if model.get("text_padding") == "mask" and "qwen" in str(model.get("name")):
        path += ", text padded + masked"
    system = cfg.get("system", "colocated-sync")
    if system != "colocated-sync":
        path = f"{system}: {path}"
        if system == "colocated-overlap" and cfg.get("runtime", {}).get("score_stream") is False:
            path += ", scored on the default stream"
    return path


def _score_s(row: dict) -> float | None:
    """One iteration's decode + reward seconds (``model.compile_vae``'s target): the slowest role's."""
    scores = [p["score"] for p in (row.get("phase_seconds") or {}).values() if "score" in p]
    return max(scores) if scores else None


def summarise_run(run: Path, *, hardware: str = "", command: str = "", date: str = "") -> dict:
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    rows = read_metrics(run)
    # the iterations after the first (it compiles), but not one run under the kernel profiler (slower)
    steady = [r for r in rows[1:] if not r.get("profiled")]
    later = steady or rows
    source = json.loads((run / "loop.json").read_text()) if (run / "loop.json").exists() else {}
    algo = cfg.get("algo", {})
    by_phase: dict[str, float | None] = {}
    for phase in ("rollout", "score", "train", "optimizer"):
        by_phase[phase] = _median([r.get("fraction_of_bound_by_phase", {}).get(phase) for r in later])
    return {
        "run": run.name,
        "model": cfg["model"]["name"],
        "config": source.get("config"),
        "prompts": f"{algo.get('prompts_per_iteration')} x {algo.get('group_size')}",
        "samples": rows[-1].get("samples") if rows else None,
        "iterations": len(rows),
        # the iterations the medians are over (0: only the compiling one ran, or none finished)
        "steady_iterations": len(steady),
        "status": "ok" if rows else "no iteration finished (the call's log says why)",
        "samples_per_s": _median([r.get("samples_per_s") for r in later]),
        "rollout_s": _median([r.get("rollout_s") for r in later]),
        "train_s": _median([r.get("train_s") for r in later]),
        "score_s": _median([_score_s(r) for r in later]),
        "first_iteration_s": round(rows[0]["wall_s"], 2) if rows else None,
        "fraction_of_bound": _median([r.get("fraction_of_bound") for r in later]),
        "fraction_of_bound_by_phase": by_phase,
        "ratio_mean": _median([r.get("ratio_mean") for r in later], digits=6),
        "ratio_min": min((r["ratio_min"] for r in later if r.get("ratio_min") is not None), default=None),
        "peak_mem_gib": round(max((r.get("peak_mem_gib") or 0.0) for r in rows), 2) if rows else None,
        # the steady iterations' allocator retries (runs before metrics carried them: None)
        "alloc_retries": _median([r.get("alloc_retries") for r in later]),
        "path": code_path(cfg),
        # which tree ran it when not the call's own (h200_loops.sh BASELINE: "baseline <commit>")
        "code": source.get("code"),
        "hardware": source.get("hardware") or hardware,
        "command": source.get("command") or command,
        "date": source.get("date") or date,
        "profile": _profile(run),
    }


def _profile(run: Path) -> dict | None:
    """Rank 0's kernel profile of the run's profiled iteration (runtime.profile_iteration): per phase wall,
    device-busy and idle seconds, the busy seconds by kernel kind and, for profiles that have them
    (digenrl/runtime/observe/idle_gaps.py), the idle gaps' largest causes and the host syncs; None when the
    run was not profiled."""
    path = run / "profile" / "rank0.json"
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    return {
        "iteration": summary["iteration"],
        "busy_fraction": summary["busy_fraction"],
        "phases": {
            phase: {
                "wall_s": row["wall_s"],
                "device_busy_s": row["device_busy_s"],
                "idle_s": row["idle_s"],
                "busy_by_kind_s": {k: round(v, 4) for k, v in row["busy_by_kind_s"].items()},
            }
            | (
                {
                    "idle_causes_s": {c["name"]: round(c["seconds"], 4) for c in row["idle_gaps"]["causes"]},
                    "host_syncs": row["host_syncs"]["count"],
                }
                if "idle_gaps" in row
                else {}
            )
            for phase, row in summary["phases"].items()
        },
    }


def _calls(rows: list[dict]) -> str:
    """The calls that made the rows: one line per command, with its GPU, date and rows."""
    calls: dict[tuple[str, str, str], list[str]] = {}
    for r in rows:
        calls.setdefault((r["command"], r["hardware"], r["date"]), []).append(r["run"])
    return "".join(
        f"Command: `{command}` ({hardware or 'GPU not named'}, {date}): {', '.join(runs)}\n"
        for (command, hardware, date), runs in calls.items()
    )


def table(rows: list[dict]) -> str:
    lines = [
        "| run | model | config | prompts | path | samples/s | rollout s | train s | fraction of bound "
        "(rollout / train) | score s | ratio (min) | peak GiB | iterations (steady) |",
        "|---" * 13 + "|",
    ]
    for r in rows:
        ph = r["fraction_of_bound_by_phase"]
        path = r["path"] + (f" ({r['code']})" if r.get("code") else "")
        cells = [r["run"], r["model"], r["config"], r["prompts"], path, r["samples_per_s"]]
        cells += [r["rollout_s"], r["train_s"], f"{r['fraction_of_bound']} ({ph['rollout']} / {ph['train']})"]
        cells += [r["score_s"]]
        cells += [f"{r['ratio_mean']} ({r['ratio_min']})", r["peak_mem_gib"]]
        cells += [f"{r['iterations']} ({r.get('steady_iterations', '?')})"]
        if r.get("status", "ok") != "ok":
            cells = [*cells[:5], r["status"], *[""] * 6, r["iterations"]]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", help="directory holding one run directory per loop")
    p.add_argument("--out", required=True)
    p.add_argument("--command", default="bash experiments/gpu/h200_loops.sh")
    p.add_argument(
        "--hardware", default="", help="the GPU's name (nvidia-smi), for rows whose loop.json has none"
    )
    p.add_argument("--date", default=None, help="for rows whose loop.json has none (default: today, UTC)")
    args = p.parse_args(argv)
    date = args.date or datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    runs = sorted(d for d in Path(args.runs).iterdir() if (d / "metrics.jsonl").exists())
    rows = []
    for run in runs:
        try:
            rows.append(summarise_run(run, hardware=args.hardware, command=args.command, date=date))
        except (OSError, KeyError, ValueError) as exc:  # a run cut short: say so, keep the others
            print(f"[loops_summary] {run.name}: not summarised ({type(exc).__name__}: {exc})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    md = f"# Full loops ({args.hardware})\n\n" + _calls(rows) + "\n" + table(rows)
    for run in runs:  # each profiled run's kernel tables (digenrl/runtime/observe/iteration_profile.py)
        profile = run / "profile" / "rank0.md"
        if profile.exists():
            md += f"\n## {run.name}: kernel profile\n\n" + profile.read_text().split("\n", 1)[1]
    (out / "summary.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
