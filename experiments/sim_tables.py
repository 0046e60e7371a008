"""Shared pieces of the simulated results tables (run_throughput.py, run_scaling.py, run_split.py).

Which cost model a model size uses (a measured ``experiments/results/costs/h200-<model>.json`` if one
exists, else the extrapolation of :mod:`experiments.extrapolated_costs`), how an H200 cost model is carried
to a profile's device types, the FlowGRPO workload each model runs, and how a table is written in the
``paper_figures`` results-table format (``paper_figures/README.md``: model, system, source,
experiment, samples_per_s, gpus, generators, trainers; extra columns are kept and ignored by the plots).
"""

from __future__ import annotations

import csv
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO))

from digenrl.runtime.profiles import HardwareProfile, load_profile  # noqa: E402
from digenrl.sim.costs import COSTS_DIR, CostModel, cost_path  # noqa: E402
from digenrl.sim.device_costs import DeviceCosts  # noqa: E402
from digenrl.sim.workload import Workload  # noqa: E402

MODELS = ("flux.1-dev", "qwen-image", "wan2.1-14b", "hunyuan-video")
#: --quick: the CPU-measured tiny model (no FLOP counting, seconds to simulate).
QUICK_MODEL = "tiny-sd3"
QUICK_COST_FILE = COSTS_DIR / "cpu-tiny-sd3.json"
PROFILES = ("a100-16", "h800-32", "hetero-h100-a100-16")
REFERENCE_DEVICE = "h200"  # relative_speed 1.0: the reference device of every profile (hardware_profiles/)
COLUMNS = (
    "experiment",
    "model",
    "system",
    "source",
    "samples_per_s",
    "images_per_gpu_s",
    "ratio_vs_colocated_sync",
    "gpus",
    "generators",
    "trainers",
    "profile",
    "model_name",
    "plan",
    "cost_file",
    "cost_source",
)


@dataclass(frozen=True)
class ModelCosts:
    """A reference-device cost model and where it came from (for the table's ``cost_file`` column)."""

    costs: CostModel
    cost_file: str
    cost_source: str

    @property
    def source_label(self) -> str:
        """``simulated`` or ``simulated, costs extrapolated from …`` (what a reader of the row must know)."""
        if self.cost_source.startswith("measured"):
            return f"simulated from costs {self.cost_source}"
        return f"simulated, costs {self.cost_source}"


def model_costs(
    model: str,
    extrapolated_dir: Path,
    costs_dir: Path = COSTS_DIR,
    cost_file: Path | None = None,
    workload: Workload | None = None,
) -> ModelCosts:
    """``cost_file`` if given; else the measured H200 cost file of ``model`` if present and it fits
    ``workload`` (:func:`cost_mismatch`), else the extrapolated one (written to ``extrapolated_dir`` so it
    never shadows a measured file in ``experiments/results/costs``). A ``cost_file`` that does not fit is
    an error; a measured file that does not fit is skipped, and the row's ``cost_source`` says why."""
    if cost_file is not None:
        costs = CostModel.load(cost_file)
        if costs.model != model:
            raise ValueError(f"cost file {cost_file} is for model {costs.model!r}, not {model!r}")
        mismatch = cost_mismatch(costs, workload)
        if mismatch:
            raise ValueError(f"cost file {cost_file} does not fit the {model} workload: {mismatch}")
        label = "measured" if costs.source == "measured" else costs.source
        return ModelCosts(costs, _rel(Path(cost_file)), f"{label} on {costs.device}")
    measured = cost_path(REFERENCE_DEVICE, model, costs_dir)
    skipped = ""
    if measured.is_file():
        costs = CostModel.load(measured)
        mismatch = cost_mismatch(costs, workload)
        if not mismatch:
            return ModelCosts(costs, _rel(measured), f"{costs.source} on {costs.device}")
        skipped = f" ({_rel(measured)} skipped: {mismatch})"
    from experiments.extrapolated_costs import extrapolated_cost_model

    costs = extrapolated_cost_model(model)
    path = costs.save(cost_path(REFERENCE_DEVICE, model, extrapolated_dir))
    return ModelCosts(costs, _rel(path), costs.source + skipped)


def cost_mismatch(costs: CostModel, workload: Workload | None) -> str:
    """Why ``costs`` cannot price ``workload`` of its model at the model's default resolution ("" if it
    can): a cost file prices one sample at the shape it was measured at (``meta`` height / width /
    frames), and the workload needs points for its guidance setting."""
    from digenrl.models import MODEL_SPECS

    reasons = []
    spec = MODEL_SPECS.get(costs.model)
    if spec is not None:
        expected = {
            "height": spec.default_height,
            "width": spec.default_width,
            "frames": spec.default_frames if spec.is_video else None,
        }
        measured = {k: costs.meta.get(k) for k in expected if k in costs.meta}
        if measured and any(measured[k] != expected[k] for k in measured):
            reasons.append(
                f"measured at {_shape(measured)}, the workload runs the model default {_shape(expected)}"
            )
    if workload is not None and not costs.has_cfg(workload.cfg):
        reasons.append(
            f"the {'CFG' if workload.cfg else 'no-CFG'} workload needs generator and training points for "
            "that setting, the file lacks one of them"
        )
    return "; ".join(reasons)


def _shape(values: dict[str, Any]) -> str:
    text = f"{values.get('height')}x{values.get('width')}"
    return text + (f"x{values['frames']}f" if values.get("frames") else "")


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def device_costs(profile: HardwareProfile, costs: CostModel) -> DeviceCosts:
    """Carry an H200 cost model to every device type of ``profile`` by ``relative_speed`` (H200 = 1.0),
    the same rule :class:`DeviceCosts` applies inside one profile."""
    by_type = {}
    for name, gpu in profile.gpu_types.items():
        if name == costs.device:
            by_type[name] = costs
        else:
            factor = 1.0 / gpu.relative_speed
            by_type[name] = costs.scaled(factor, factor, name)
    used = {profile.device_type(r).name for r in range(profile.world_size)}
    return DeviceCosts(profile, {k: v for k, v in by_type.items() if k in used})


def default_workload(model: str, quick: bool = False, iterations: int = 5) -> Workload:
    """The FlowGRPO workload of ``model`` (model defaults for steps and guidance, ``Workload.from_config``):
    images P=32 prompts × G=16 (FlowGRPO's group size), videos P=16 × G=8 with micro-batch 1 (memory);
    ``quick``: P=4 × G=4 and 4 steps, for tests."""
    from digenrl.config import Config, apply_overrides

    video = model in ("wan2.1-14b", "hunyuan-video", "wan2.1-1.3b")
    overrides: dict[str, Any] = {"model.name": model}
    if quick:
        overrides |= {"algo.prompts_per_iteration": 4, "algo.group_size": 4, "sampler.num_steps": 4}
    elif video:
        overrides |= {"algo.prompts_per_iteration": 16, "algo.group_size": 8, "trainer.micro_batch_size": 1}
    else:
        overrides |= {"algo.prompts_per_iteration": 32, "algo.group_size": 16}
    cfg = apply_overrides(Config(), overrides)
    return Workload.from_config(cfg, iterations=iterations)


def fragment_choices(prompts: int) -> list[int]:
    """Fragment sizes the planner tries: powers of two dividing P (1, 2, 4, …, P) — the divisors that
    matter for batching; odd divisors only lengthen the search."""
    out, f = [], 1
    while f <= prompts:
        if prompts % f == 0:
            out.append(f)
        f *= 2
    return out


def load(profile: str) -> HardwareProfile:
    return load_profile(profile)


def write_table(rows: Sequence[dict[str, Any]], out_dir: Path, stem: str, header: str) -> tuple[Path, Path]:
    """``<stem>.csv`` (results-table format, ``#`` header comment) and ``<stem>.md``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out_dir / f"{stem}.csv", out_dir / f"{stem}.md"
    with csv_path.open("w", newline="") as f:
        for line in header.splitlines():
            f.write(f"# {line}\n")
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _fmt(row.get(k, "")) for k in COLUMNS})
    lines = [header.replace("\n", "\n\n"), ""]
    shown = [c for c in COLUMNS if c not in ("experiment", "model")]
    lines.append("| " + " | ".join(shown) + " |")
    lines.append("|" + "---|" * len(shown))
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(c, "")) for c in shown) + " |")
    md_path.write_text("\n".join(lines) + "\n")
    return csv_path, md_path


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def header_lines(command: str, what: str) -> str:
    return (
        f"{what}\n"
        f"command: {command}\n"
        f"date: {time.strftime('%Y-%m-%d')}; hardware: none measured (every row is simulated by digenrl.sim)"
    )
