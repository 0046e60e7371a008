"""The planner's memory estimate of a rank against the peak memory of real runs (docs/design.md §4: a plan
may only claim a colocated rank is memory-bound where this estimate holds).

For each run folder: its ``config.yaml`` (the run's model, knobs and batch), its hardware profile (or
``--profile`` where the run recorded ``auto``), the cost file of its device type and model, and the
largest ``peak_mem_gib`` of its ``metrics.jsonl`` (``torch.cuda.max_memory_allocated`` per iteration);
the estimate is :func:`digenrl.planning.memory.check_config`'s peak of the run's first rank with its parts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from digenrl.config import load_config
from digenrl.costs.cost_model import CostModel, cost_path
from digenrl.planning.memory import check_config
from digenrl.runtime.hardware.profiles import AUTO
from digenrl.trainer.run_dir import PROFILE_FILE, run_profile

GIB = 2**30
#: the goal the estimate is held to (issue text: within 10 % of the measured peak)
GOAL = 0.10


def measured_peak_gib(run: Path) -> float | None:
    peaks = []
    for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            if record.get("peak_mem_gib") is not None:
                peaks.append(float(record["peak_mem_gib"]))
    return max(peaks) if peaks else None


def memory_row(run: Path, costs_dir: Path, profile: str | None = None) -> dict[str, Any]:
    """One run: its configuration, measured peak, estimated peak and the estimate's parts (GiB)."""
    overrides = [f"profile={profile}"] if profile else []
    cfg = load_config(str(run / "config.yaml"), overrides)
    if cfg.profile == AUTO and not (run / PROFILE_FILE).is_file():
        raise ValueError(
            f"{run}: the run recorded profile=auto and not what it resolved to; name the machine's "
            "profile with --profile"
        )
    prof = run_profile(run, cfg.profile)
    device = prof.device_type(0).name
    costs = CostModel.load(cost_path(device, cfg.model.name, costs_dir))
    ranks = check_config(cfg, prof, {device: costs})
    estimate, peak = ranks[0].peak / GIB, measured_peak_gib(run)
    return {
        "run": run.name,
        "model": cfg.model.name,
        "device": device,
        "micro_batch": cfg.trainer.micro_batch_size,
        "checkpointing": cfg.trainer.activation_checkpointing,
        "samples": cfg.algo.prompts_per_iteration * cfg.algo.group_size,
        "measured_gib": peak,
        "estimated_gib": estimate,
        "error": (estimate - peak) / peak if peak else None,
        "capacity_gib": ranks[0].capacity / GIB,
        "parts_gib": {k: v / GIB for k, v in ranks[0].parts.items()},
    }


def report_markdown(rows: list[dict[str, Any]], command: str) -> str:
    lines = [
        "# The memory estimate against real runs",
        "",
        f"`{command}`",
        "",
        "Measured: the largest `peak_mem_gib` of the run's metrics (`torch.cuda.max_memory_allocated`).",
        f"Estimated: `digenrl/planning/memory.py` for the run's config; goal: within {GOAL:.0%}.",
        "",
        "| run | model | device | micro-batch | ckpt | samples | measured GiB | estimated GiB (error) "
        "| usable GiB | within goal |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        error = "—" if r["error"] is None else f"{100 * r['error']:+.1f}%"
        ok = "—" if r["error"] is None else ("yes" if abs(r["error"]) <= GOAL else "no")
        measured = "—" if r["measured_gib"] is None else f"{r['measured_gib']:.1f}"
        lines.append(
            f"| {r['run']} | {r['model']} | {r['device']} | {r['micro_batch']} | {r['checkpointing']} | "
            f"{r['samples']} | {measured} | {r['estimated_gib']:.1f} ({error}) | "
            f"{r['capacity_gib']:.1f} | {ok} |"
        )
    return "\n".join(lines) + "\n"
