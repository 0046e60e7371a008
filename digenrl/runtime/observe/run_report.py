"""What a user reads at the start and at the end of a run (rank 0 prints both).

The start banner says what is about to run (system, model, profile, world, pools, mechanisms, out_dir,
shared-device mode and what it is for, and the run: new, or resumed at which iteration);
the closing summary says what happened, from ``metrics.jsonl`` after the per-rank event logs were folded
in (:func:`digenrl.runtime.observe.metrics.add_event_summary`): reward first → last, the held-out evaluation's
reward first → last (``eval.every``), steady-state samples/s
(the first iteration — compilation, pipeline fill — excluded when there are later ones), each pool's busy
fraction, the model FLOPs per iteration against the matmul ceiling (overall and per phase,
digenrl/costs/flops.py), and the bubble-free bound — the samples/s a perfect schedule of the same busy
device-seconds would reach (docs/design.md §5) — plus where the metrics, the trace and the checkpoints
are. Iterations are named as in ``metrics.jsonl`` (0-based), like the progress lines.

For a run that crashed (it never reached its closing summary, and its ``trace.json`` is missing or
stale), ``python -m digenrl.runtime.observe.run_report OUT_DIR`` rebuilds ``trace.json`` from the event logs
the ranks left — every record up to each rank's death (``digenrl/runtime/observe/events.py``) — and prints the
summary of every iteration in ``metrics.jsonl`` (:func:`report_run`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Protocol

from digenrl.config import Config
from digenrl.runtime.observe.chrome_trace import merge_chrome_trace
from digenrl.runtime.observe.event_summary import steady_window
from digenrl.runtime.observe.metrics import read_metrics, with_event_summary
from digenrl.runtime.reproducibility.determinism import BANNER as DETERMINISTIC_BANNER


class StartedRun(Protocol):
    """How a run started, as the banner says it (:class:`digenrl.trainer.run_dir.RunStart` is one)."""

    run_id: str
    start_iteration: int
    note: str

    @property
    def resumed(self) -> bool: ...


def start_banner(
    cfg: Config, world_size: int, pools: str, mechanisms: str = "", run: StartedRun | None = None
) -> str:
    from digenrl.runtime.hardware.profiles import AUTO, load_profile

    profile = f"auto ({load_profile(AUTO).description})" if cfg.profile == AUTO else cfg.profile
    lines = [
        f"[digenrl] system {cfg.system} | model {cfg.model.name} | profile {profile} | "
        f"{world_size} rank(s): {pools}",
        f"[digenrl] {cfg.iterations} iterations of {cfg.algo.prompts_per_iteration} prompts x "
        f"{cfg.algo.group_size} samples, reward {_reward(cfg)} | out_dir {cfg.out_dir}",
    ]
    if mechanisms:
        lines.insert(1, f"[digenrl] {mechanisms}")
    if cfg.runtime.share_device:
        lines.append(
            f"[digenrl] shared-device mode (runtime.share_device=true): {world_size} rank(s) share the GPU, "
            "collectives on gloo, point-to-point transfers through pinned host memory. It is for testing "
            "every CUDA path of the schedule on one GPU; its timings are not a multi-GPU result"
        )
    if cfg.runtime.deterministic:
        lines.append(f"[digenrl] {DETERMINISTIC_BANNER}")
    if run is not None:
        if run.note:
            lines.append(f"[digenrl] {run.note}")
        what = f"resumed at iteration {run.start_iteration}" if run.resumed else "new run"
        lines.append(f"[digenrl] run {run.run_id} ({what})")
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
        f"[digenrl] done: {len(records)} iteration(s) ({_span(first, last)}), "
        f"reward {first['reward_mean']:+.4f} -> {last['reward_mean']:+.4f}",
        f"[digenrl] {rate:.2f} samples/s over {_span(steady[0], last)}" + _bound(window, samples),
    ]
    evals = [r for r in records if "eval_reward_mean" in r]
    if evals:
        lines.append(
            f"[digenrl] eval reward on held-out prompts: {_eval(evals[0])} -> {_eval(evals[-1])} "
            f"({len(evals)} evaluation(s); sample grids in {Path(out_dir) / 'samples'})"
        )
    busy = _busy(steady)
    if busy:
        pools = ", ".join(f"{role} {100 * f:.0f}%" for role, f in busy.items())
        lines.append(f"[digenrl] busy fraction: {pools}")
    mismatch = next((r["profile_mismatch"] for r in records if r.get("profile_mismatch")), None)
    if mismatch:
        lines.append(f"[digenrl] WARNING: {mismatch} (runtime.allow_profile_mismatch=true)")
    skipped = [r["iteration"] for r in records if r.get("nonfinite_skipped")]
    if skipped:
        lines.append(
            f"[digenrl] non-finite updates skipped (trainer.nonfinite=skip) at iterations "
            f"{', '.join(map(str, skipped))}"
        )
    bound = _loop_bound(steady)
    if bound:
        lines.append(bound)
    stale = [r.get("stale_fraction") for r in steady if r.get("stale_fraction") is not None]
    if stale and max(stale) > 0:
        lines.append(f"[digenrl] one-version-stale samples (TCSS): {100 * statistics.mean(stale):.0f}%")
    out = Path(out_dir)
    profiled = [r["iteration"] for r in records if r.get("profiled")]
    if profiled:
        lines.append(
            f"[digenrl] iteration {profiled[0]} ran under the kernel profiler (its time includes the "
            f"profiler's overhead): device time per phase and kernel kind in {out / 'profile'}/rank<r>.md"
        )
    lines.append(
        f"[digenrl] metrics {out / 'metrics.jsonl'} | trace {out / 'trace.json'} (https://ui.perfetto.dev) | "
        f"checkpoints {out / 'checkpoints'}"
    )
    return "\n".join(lines)


def _eval(record: dict[str, Any]) -> str:
    mean = record["eval_reward_mean"]
    shown = f"{mean:+.4f}" if mean is not None else "non-finite"
    return f"{shown} (policy v{record['eval_policy_version']})"


def _span(first: dict[str, Any], last: dict[str, Any]) -> str:
    a, b = first["iteration"], last["iteration"]
    return f"iteration {a}" if a == b else f"iterations {a}-{b}"


def _bound(window: dict[str, float], samples: int) -> str:
    if window["bubble_free_bound_s"] <= 0 or window["window_s"] <= 0:
        return ""
    bound = samples / window["bubble_free_bound_s"]
    achieved = window["bubble_free_bound_s"] / window["window_s"]
    return f" (bubble-free bound {bound:.2f} samples/s; the run reached {100 * achieved:.0f}% of it)"


def _loop_bound(steady: list[dict[str, Any]]) -> str:
    """Model FLOPs per iteration by phase, the matmul ceiling and the loop's fraction of it, overall
    (wall-weighted over the steady iterations) and per phase (digenrl/costs/flops.py); "" for records
    without FLOPs (a run from before they were counted)."""
    with_flops = [r for r in steady if r.get("flops")]
    if not with_flops:
        return ""
    tflop = {k: statistics.mean(r["flops"][k] for r in with_flops) / 1e12 for k in with_flops[-1]["flops"]}
    phases = ", ".join(f"{k} {v:.3g}" for k, v in tflop.items() if k != "total")
    head = f"[digenrl] model FLOPs per iteration {tflop['total']:.4g} TFLOP ({phases})"
    last = with_flops[-1]
    if last.get("ceiling_tflops") is None:
        return f"{head}; no fraction of the bound: {last.get('bound_note', 'no ceiling')}"
    timed = [r for r in with_flops if r.get("fraction_of_bound") is not None]
    wall = sum(r["wall_s"] for r in timed)
    overall = sum(r["fraction_of_bound"] * r["wall_s"] for r in timed) / wall if wall > 0 else 0.0
    per_phase = []
    for phase in ("rollout", "score", "train", "optimizer", "sync"):
        values = [
            r["fraction_of_bound_by_phase"][phase]
            for r in with_flops
            if (r.get("fraction_of_bound_by_phase") or {}).get(phase) is not None
        ]
        if values:
            per_phase.append(f"{phase} {100 * statistics.mean(values):.0f}%")
    phase_text = f" (per phase: {', '.join(per_phase)})" if per_phase else ""
    return (
        f"{head}; matmul ceiling {last['ceiling_tflops']:g} TFLOP/s ({last.get('ceiling_source', '')}); "
        f"the loop ran at {100 * overall:.0f}% of its bound{phase_text}"
    )


def _busy(steady: list[dict[str, Any]]) -> dict[str, float]:
    by_role: dict[str, list[float]] = {}
    for record in steady:
        for role, fraction in (record.get("busy_fraction") or {}).items():
            by_role.setdefault(role, []).append(fraction)
    return {role: statistics.mean(values) for role, values in sorted(by_role.items())}


def report_run(out_dir: str | Path) -> str:
    """Rebuild ``out_dir/trace.json`` from its event logs and return the closing summary of every iteration
    in its ``metrics.jsonl``, with the event summary folded in memory: ``metrics.jsonl`` is only read (a
    job may still be appending to it; a finished or resumed run folds it in itself)."""
    merge_chrome_trace(out_dir)  # ValueError naming out_dir when it holds no event logs
    return closing_summary(with_event_summary(read_metrics(out_dir), out_dir), out_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m digenrl.runtime.observe.run_report",
        description="Rebuild OUT_DIR/trace.json from the event logs and print the run's summary "
        "(for a run that crashed; a finished run printed it at its end).",
    )
    parser.add_argument("out_dir", help="the run's out_dir")
    args = parser.parse_args(argv)
    try:
        print(report_run(args.out_dir))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
