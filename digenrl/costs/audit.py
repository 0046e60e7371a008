"""Which cost files are stale, and exactly what a GPU call must re-measure (docs/design.md §5: the simulator
is only as good as its costs, so a cost that does not match what runs is flagged, never silently used).

A cost file is *stale* for a workload when (:func:`audit`):

* it timed another code path than the runtime runs on a GPU profile (``compiled+autocast``: with
  ``model.compile`` / ``model.autocast`` unset, a CUDA run compiles and autocasts,
  :meth:`digenrl.config.ModelConfig.optimised`), or its generator points come from the eager path (a
  ``compiled`` generator point matches: the generator benchmark has no fp32 LoRA adapter for autocast to
  act on, and the adapter's rank-32 matmuls are a sliver of a step);
* the workload trains at a micro-batch above the largest measured one (then the training time is the
  measured training/forward ratio × the measured forward, :meth:`CostModel.train_micro_batch_s` — an
  extrapolation), or the CFG training points were measured with another ``algo.cfg_grad`` than the
  runtime's default;
* it has no measured memory peaks (the planner cannot check which plans fit);
* a point was derived rather than measured (:mod:`digenrl.costs.extrapolation`: another shape, another
  model, full fine-tuning, a heavy reward).

:func:`missing_measurements` turns the stale points of the committed H200 files into benchmark commands —
what ``experiments/gpu/h200_refresh_costs.sh`` runs in one device call (``python experiments/measure.py
missing`` prints them, :func:`digenrl.reports.cli.missing`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from digenrl.costs.cost_model import CFG_KEYS, CostModel, cost_path

#: The path a GPU run executes by default (model.compile / model.autocast unset on a CUDA device).
GPU_PATH = "compiled+autocast"
#: The runtime's default CFG training gradient (digenrl.config.AlgoConfig.cfg_grad).
DEFAULT_CFG_GRAD = "cond"


class TrainingShape(Protocol):
    """What of a workload the audit reads (:class:`digenrl.plan.workload.Workload` is one)."""

    @property
    def cfg(self) -> bool: ...
    @property
    def micro_batch_size(self) -> int: ...


def audit(
    costs: CostModel, workload: TrainingShape | None = None, expected_path: str = GPU_PATH
) -> list[str]:
    """Why ``costs`` does not price ``workload`` from measurements of what runs (empty: it does)."""
    reasons = []
    if costs.path != expected_path:
        reasons.append(f"timed the {costs.path} path; a GPU run executes {expected_path}")
    generator_path = costs.meta.get("generator_path")
    if (
        generator_path
        and generator_path != costs.path
        and not (generator_path == "compiled" and costs.path == GPU_PATH)
    ):
        reasons.append(f"generator points timed on the {generator_path} path, training on {costs.path}")
    if workload is not None:
        flag = CFG_KEYS[workload.cfg]
        measured = sorted(costs.train_points.get(flag, {}))
        if measured and workload.micro_batch_size > measured[-1]:
            reasons.append(
                f"training measured at micro-batch {', '.join(map(str, measured))}; the workload trains "
                f"{workload.micro_batch_size} (extrapolated by the training/forward ratio)"
            )
        if not costs.has_memory(workload.cfg):
            reasons.append("no measured memory peaks: which plans fit is not checked")
        if workload.cfg and costs.meta.get("cfg_grad", DEFAULT_CFG_GRAD) != DEFAULT_CFG_GRAD:
            reasons.append(
                f"CFG training measured with cfg_grad={costs.meta.get('cfg_grad')}; the runtime default is "
                f"{DEFAULT_CFG_GRAD}"
            )
    reasons += [f"derived: {step}" for step in costs.meta.get("derivation", [])]
    return reasons


@dataclass(frozen=True)
class Measurement:
    """One benchmark a GPU call must run, and the stale points it replaces."""

    model: str
    kind: str  # generator | trainer
    args: tuple[str, ...]
    replaces: str

    def command(self, out: str = "$WORK") -> str:
        args = " ".join(self.args)
        return f"python3 experiments/measure.py {self.kind} --model {self.model} {args} --out {out}"


def missing_measurements(costs_dir: Path) -> list[Measurement]:
    """The benchmarks that replace every stale point of the committed H200 cost files (module docstring)."""
    out: list[Measurement] = []
    common = (
        "--modes",
        "lora",
        "--paths",
        "optimized",
        "--compile",
        "--autocast",
        "--warmup",
        "1",
        "--iters",
        "2",
    )
    for model, budget_mbs in (
        ("sd3.5-medium", (4, 8, 16)),
        ("flux.1-dev", (1, 2, 4)),
        ("qwen-image", (1, 2, 4)),
    ):
        path = cost_path("h200", model, costs_dir)
        if not path.is_file():
            continue
        costs = CostModel.load(path)
        cfg = CFG_KEYS[True] in costs.generator_step_points
        stale_cfg = cfg and costs.meta.get("cfg_grad", DEFAULT_CFG_GRAD) != DEFAULT_CFG_GRAD
        measured = set(costs.train_points.get(CFG_KEYS[False], {}))
        wanted = [m for m in budget_mbs if m not in measured or costs.path != GPU_PATH or stale_cfg]
        if wanted:
            args = (
                "--micro-batch-sizes",
                ",".join(map(str, wanted)),
                "--samples",
                str(max(wanted)),
                "--train-steps",
                "1",
                "--cfg",
                "both" if cfg else "off",
                "--cfg-grad",
                DEFAULT_CFG_GRAD,
                *common,
            )
            if model != "sd3.5-medium":
                args = (*args, "--eager-sdpa", "safe")
            missing = sorted(set(wanted) - measured)
            out.append(
                Measurement(
                    model,
                    "trainer",
                    args,
                    f"training at micro-batch {','.join(map(str, wanted))} on the {GPU_PATH} path"
                    + (f" (never measured: {missing})" if missing else "")
                    + (f", CFG with cfg_grad={DEFAULT_CFG_GRAD}" if stale_cfg else ""),
                )
            )
        if costs.meta.get("generator_path", costs.path) == "eager":
            batches = sorted({b for pts in costs.generator_step_points.values() for b in pts})
            out.append(
                Measurement(
                    model,
                    "generator",
                    (
                        "--batch-sizes",
                        ",".join(map(str, batches)),
                        "--cfg",
                        "both" if cfg else "off",
                        "--compile",
                        "--warmup",
                        "2",
                        "--iters",
                        "4",
                    ),
                    f"generator step at batch {','.join(map(str, batches))} on the compiled path (eager "
                    "measured)",
                )
            )
    return out
