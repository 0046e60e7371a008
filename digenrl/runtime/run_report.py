"""What a user reads at the start and at the end of a run (rank 0 prints both).

The start banner says what is about to run (system, model, profile, world, pools, mechanisms, out_dir);
the closing summary says what happened, from ``metrics.jsonl`` after the per-rank event logs were folded
in (:func:`digenrl.runtime.metrics.add_event_summary`): reward first → last, steady-state samples/s
(the first iteration — compilation, pipeline fill — excluded when there are later ones), each pool's busy
fraction, and the bubble-free bound — the samples/s a perfect schedule of the same busy device-seconds
would reach (docs/design.md §5) — plus where the metrics, the trace and the checkpoints are.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from digenrl.config import Config
from digenrl.runtime.event_summary import steady_window


def start_banner(cfg: Config, world_size: int, pools: str, mechanisms: str = "") -> str:
    lines = [
        f"[digenrl] system {cfg.system} | model {cfg.model.name} | profile {cfg.profile} | "
        f"{world_size} rank(s): {pools}",
        f"[digenrl] {cfg.iterations} iterations of {cfg.algo.prompts_per_iteration} prompts x "
        f"{cfg.algo.group_size} samples, reward {_reward(cfg)} | out_dir {cfg.out_dir}",
    ]
    if mechanisms:
        lines.insert(1, f"[digenrl] {mechanisms}")
    return "\n".join(lines)


def _reward(cfg: Config) -> str:
    if cfg.reward.weights:
        return " + ".join(f"{weight:g}*{name}" for name, weight in cfg.reward.weights.items())
    return cfg.reward.name


def closing_summary(records: list[dict[str, Any]], out_dir: str | Path) -> str:
    """The end-of-run summary of ``records`` (``metrics.jsonl`` lines with the event summary folded in,
    the per-rank event logs of ``out_dir`` for the run-level bound)."""
    if not records:
        return "[digenrl] no iteration ran"
    steady = records[1:] if len(records) > 1 else records
    samples = sum(r["samples"] for r in steady)
    wall = sum(r["wall_s"] for r in steady)
    rate = samples / wall if wall > 0 else 0.0
    window = steady_window(out_dir, steady[0]["iteration"])
    first, last = records[0], records[-1]
    lines = [
        f"[digenrl] done: {len(records)} iteration(s) (iterations {first['iteration'] + 1}-"
        f"{last['iteration'] + 1}), reward {first['reward_mean']:+.4f} -> {last['reward_mean']:+.4f}",
        f"[digenrl] {rate:.2f} samples/s over iterations {steady[0]['iteration'] + 1}-{last['iteration'] + 1}"
        + _bound(window, samples),
    ]
    busy = _busy(steady)
    if busy:
        pools = ", ".join(f"{role} {100 * f:.0f}%" for role, f in busy.items())
        lines.append(f"[digenrl] busy fraction: {pools}")
    stale = [r.get("stale_fraction") for r in steady if r.get("stale_fraction") is not None]
    if stale and max(stale) > 0:
        lines.append(f"[digenrl] one-version-stale samples (TCSS): {100 * statistics.mean(stale):.0f}%")
    out = Path(out_dir)
    lines.append(
        f"[digenrl] metrics {out / 'metrics.jsonl'} | trace {out / 'trace.json'} (https://ui.perfetto.dev) | "
        f"checkpoints {out / 'checkpoints'}"
    )
    return "\n".join(lines)


def _bound(window: dict[str, float], samples: int) -> str:
    if window["bubble_free_bound_s"] <= 0 or window["window_s"] <= 0:
        return ""
    bound = samples / window["bubble_free_bound_s"]
    achieved = window["bubble_free_bound_s"] / window["window_s"]
    return f" (bubble-free bound {bound:.2f} samples/s; the run reached {100 * achieved:.0f}% of it)"


def _busy(steady: list[dict[str, Any]]) -> dict[str, float]:
    by_role: dict[str, list[float]] = {}
    for record in steady:
        for role, fraction in (record.get("busy_fraction") or {}).items():
            by_role.setdefault(role, []).append(fraction)
    return {role: statistics.mean(values) for role, values in sorted(by_role.items())}
