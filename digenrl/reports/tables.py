"""The simulated results tables: throughput per model × profile × system, scaling with the GPU count, and
the generator : trainer split (``python experiments/simulate.py throughput|scaling|split``).

Fair rows (docs/design.md §4):

* every row states its ``staleness``; ``digenrl`` (on-policy) is compared with the staleness-0 baselines,
  ``digenrl s=1`` (TCSS allowed) with ``separate-async s=1`` — and, since its plan space contains them,
  with every on-policy plan too;
* each baseline is tuned over its own knobs and gets the memory knobs it can run
  (:class:`~digenrl.planning.planner.Planner`); on a heterogeneous profile the colocated systems appear twice,
  with equal work per GPU (``colocated.split=equal``) and work proportional to GPU speed (``… speed-split``,
  ``colocated.split=speed``, the strongest colocated plan);
* ``digenrl`` is the best plan of a plan space that contains every baseline of equal staleness, so it is
  never below them; its row names the plan (``plan``, and ``run`` = the ``run_train.py`` overrides), the
  best plan of DigenRL's own mechanisms next to it (``mechanisms``), and — where a baseline plan won — why
  (``note``);
* every row carries the bubble-free bound of its plan (samples/s of a perfect schedule of the same busy
  device-seconds), the validation error of the simulator where a real run of that configuration exists
  (``validation_error``, from ``experiments/results/validation/*.json``), the cost file and whether it is
  stale (:mod:`digenrl.costs.audit`).

Scenarios (:func:`scenarios`): LoRA post-training of SD3.5-medium, FLUX.1-dev, Qwen-Image, Wan2.1-14B and
HunyuanVideo at each model's default resolution, plus where disaggregation can matter — full fine-tuning of
FLUX.1-dev (12 B) and FLUX.1-dev with a 7 B vision-language reward model. Costs come from the measured H200
files, carried where nothing measured the configuration (:mod:`digenrl.costs.extrapolation`), then to each
profile's device types by ``relative_speed`` — except a type with a measured file of its own (the H100's
SD3.5-medium and FLUX.1-dev files), which is used as measured (:func:`measured_types`).

Tables are written in the ``paper_figures`` results-table format (``paper_figures/README.md``; extra
columns are kept and ignored by the plots): ``<stem>.csv`` with a ``#`` header (command, date) and
``<stem>.md``.
"""

from __future__ import annotations

import csv
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from digenrl.costs.audit import audit
from digenrl.costs.cost_model import CostModel, cost_path
from digenrl.costs.device_costs import DeviceCosts
from digenrl.costs.sample_costs import SampleVariance
from digenrl.plan.rollout_defaults import rollout_defaults
from digenrl.plan.run_plan import RunPlan
from digenrl.plan.workload import Workload
from digenrl.planning.planner import Planner, PlannerResult, PlanScore
from digenrl.reports.folders import Folders
from digenrl.runtime.hardware.profiles import HardwareProfile, NodeGroup, load_profile

PROFILES = ("a100-16", "h800-32", "hetero-h100-a100-16", "hetero-h100-h200-16")
#: relative_speed 1.0: the reference device of every profile (digenrl/runtime/hardware/hardware_profiles/)
REFERENCE_DEVICE = "h200"
#: --quick: the CPU-measured tiny model (seconds to simulate; tests), from its cost file on ``cpu``.
QUICK_MODEL = "tiny-sd3"
QUICK_DEVICE = "cpu"
QUICK_PROFILES = ("h200-8",)
#: Models without an H200 file of their own, and the measured model they are carried from.
CARRIED_FROM = {"hunyuan-video": "wan2.1-14b"}
VIDEO_MODELS = ("wan2.1-14b", "hunyuan-video", "wan2.1-1.3b")
#: what a scenario's label gets with per-sample variance (``throughput --variance``)
VARIANCE_SUFFIX = " +variance"
COLUMNS = (
    "experiment",
    "model",
    "system",
    "source",
    "staleness",
    "samples_per_s",
    "images_per_gpu_s",
    "regime",
    "ratio_vs_colocated_sync",
    "ratio_vs_best_fair_baseline",
    "mechanisms_ratio_vs_best_fair_baseline",
    "bubble_free_samples_per_s",
    "validation_error",
    "gpus",
    "generators",
    "trainers",
    "profile",
    "model_name",
    "scenario",
    "variance",
    "plan",
    "run",
    "memory",
    "mechanisms",
    "note",
    "cost_file",
    "cost_source",
    "stale",
)


# ----------------------------------------------------------------------------- scenarios and costs


@dataclass(frozen=True)
class Scenario:
    """One workload of a table: ``label`` names its figure panel, ``variant`` how its costs are derived
    from the model's measured file (``lora``, ``full``: full fine-tuning, ``heavy-reward``: a 7 B VLM
    reward)."""

    label: str
    model: str
    variant: str
    workload: Workload
    frames: int | None = None  # video: frames per clip (None = the model's default)


def default_workload(model: str, quick: bool = False, iterations: int = 5) -> Workload:
    """The FlowGRPO workload of ``model`` (model defaults for steps and guidance, ``Workload.from_config``):
    images P=32 prompts × G=16 (FlowGRPO's group size), videos P=16 × G=8 with micro-batch 1 (memory);
    ``quick``: P=8 × G=4 and 4 steps, for tests."""
    from digenrl.config import Config, apply_overrides

    overrides: dict[str, Any] = {"model.name": model}
    if quick:
        overrides |= {"algo.prompts_per_iteration": 8, "algo.group_size": 4, "sampler.num_steps": 4}
    elif model in VIDEO_MODELS:
        overrides |= {"algo.prompts_per_iteration": 16, "algo.group_size": 8, "trainer.micro_batch_size": 1}
    else:
        overrides |= {"algo.prompts_per_iteration": 32, "algo.group_size": 16}
    cfg = apply_overrides(Config(), overrides)
    return Workload.from_config(cfg, iterations=iterations)


def scenarios(quick: bool = False, names: Sequence[str] | None = None) -> list[Scenario]:
    """The table's workloads (module docstring); ``names`` selects by label or model."""
    if quick:
        return [Scenario(QUICK_MODEL, QUICK_MODEL, "lora", default_workload(QUICK_MODEL, quick=True))]
    out = [
        Scenario(m, m, "lora", default_workload(m))
        for m in ("sd3.5-medium", "flux.1-dev", "qwen-image", "wan2.1-14b")
    ]
    # HunyuanVideo at its default 720p x 129 frames needs ~77 GiB of activations per unit even with
    # activation checkpointing (no plan fits an 80 GB GPU without sequence parallelism, which this project
    # lacks): the table runs 33-frame clips, the shape Wan2.1-14B was measured at
    out.append(Scenario("hunyuan-video 33f", "hunyuan-video", "lora", default_workload("hunyuan-video"), 33))
    flux = default_workload("flux.1-dev")
    out.append(Scenario("flux.1-dev full-FT", "flux.1-dev", "full", replace(flux, trainer_mode="full")))
    out.append(Scenario("flux.1-dev + 7B reward", "flux.1-dev", "heavy-reward", flux))
    if names:
        unknown = set(names) - {s.label for s in out} - {s.model for s in out}
        if unknown:
            raise ValueError(f"unknown scenario(s) {sorted(unknown)}; choose from {[s.label for s in out]}")
        out = [s for s in out if s.label in names or s.model in names]
    return out


def with_variance(chosen: Sequence[Scenario], variance: SampleVariance) -> list[Scenario]:
    """``chosen`` with per-sample variance (``simulate.py throughput --variance FILE``): each label gets
    `` +variance`` (its own panel and rows, beside the rows without variance) and its rows name the
    distributions in the ``variance`` column (:attr:`SampleVariance.label`: measured or assumed)."""
    return [
        replace(s, label=s.label + VARIANCE_SUFFIX, workload=replace(s.workload, variance=variance))
        for s in chosen
    ]


@dataclass(frozen=True)
class ModelCosts:
    """A reference-device cost model for a scenario and where it came from."""

    costs: CostModel
    cost_file: str
    stale: tuple[str, ...]

    @property
    def cost_source(self) -> str:
        return f"{self.costs.source} (path {self.costs.path})"

    @property
    def source_label(self) -> str:
        return f"simulated from costs {self.costs.source}"


def quick_cost_file(folders: Folders) -> Path:
    """The CPU cost file of :data:`QUICK_MODEL` (``--quick``)."""
    return cost_path(QUICK_DEVICE, QUICK_MODEL, folders.costs)


def scenario_costs(scenario: Scenario, folders: Folders, cost_file: Path | None = None) -> ModelCosts:
    """The measured file of the scenario's model in ``folders.costs`` (or ``cost_file``), carried to the
    scenario (module docstring of :mod:`digenrl.costs.extrapolation`), with the audit of what is stale."""
    from digenrl.costs import extrapolation

    model = CARRIED_FROM.get(scenario.model, scenario.model)
    path = Path(cost_file) if cost_file is not None else cost_path(REFERENCE_DEVICE, model, folders.costs)
    costs = CostModel.load(path)
    if cost_file is None and costs.model != model:
        raise ValueError(f"cost file {path} is for model {costs.model!r}, not {model!r}")
    frames = scenario.frames or _frames(scenario.model)
    if scenario.model != costs.model:
        costs = extrapolation.carry_to_model(costs, scenario.model, frames)
    if scenario.model in VIDEO_MODELS and costs.meta.get("frames") not in (None, frames):
        costs = extrapolation.reshape(costs, frames)
    if scenario.workload.cfg:
        costs = extrapolation.with_cfg_training(costs)
    if not costs.has_cfg(scenario.workload.cfg):
        raise ValueError(
            f"{path} has no points for the {'CFG' if scenario.workload.cfg else 'no-CFG'} workload"
        )
    if scenario.variant == "full":
        costs = extrapolation.full_finetune(costs)
    elif scenario.variant == "heavy-reward":
        costs = extrapolation.with_reward_model(costs)
    expected = "eager" if costs.device == "cpu" else "compiled+autocast"
    return ModelCosts(costs, folders.relative(path), tuple(audit(costs, scenario.workload, expected)))


def measured_types(profile: HardwareProfile, scenario: Scenario, folders: Folders) -> dict[str, CostModel]:
    """The scenario's cost model per device type of ``profile`` that has a measured file of its own
    (``<type>-<model>.json`` beside the H200 one, e.g. ``h100-sd3.5-medium.json``), carried to the scenario
    as the H200 file is (:func:`scenario_costs`)."""
    out = {}
    model = CARRIED_FROM.get(scenario.model, scenario.model)
    for name in profile.gpu_types:
        path = cost_path(name, model, folders.costs)
        if name != REFERENCE_DEVICE and path.is_file():
            out[name] = replace(scenario_costs(scenario, folders, path).costs, device=name)
    return out


def _frames(model: str) -> int | None:
    return rollout_defaults(model).frames


def device_costs(
    profile: HardwareProfile, costs: CostModel, measured: dict[str, CostModel] | None = None
) -> DeviceCosts:
    """The cost model of every device type of ``profile``: a type's own measured file where ``measured``
    has one (no scaling between types: comparative advantage per phase is what was measured), else the
    H200 model carried by ``relative_speed`` (H200 = 1.0), the rule :class:`DeviceCosts` applies inside
    one profile."""
    measured = measured or {}
    by_type = {}
    for name, gpu in profile.gpu_types.items():
        if name == costs.device:
            by_type[name] = costs
        elif name in measured:
            by_type[name] = measured[name]
        else:
            factor = 1.0 / gpu.relative_speed
            by_type[name] = costs.scaled(factor, factor, name)
    used = {profile.device_type(r).name for r in range(profile.world_size)}
    return DeviceCosts(profile, {k: v for k, v in by_type.items() if k in used})


def fragment_choices(prompts: int) -> list[int]:
    """Fragment sizes the planner tries: powers of two dividing P (1, 2, 4, …, P) — the divisors that
    matter for batching; odd divisors only lengthen the search."""
    out, f = [], 1
    while f <= prompts:
        if prompts % f == 0:
            out.append(f)
        f *= 2
    return out


def sub_cluster(base: HardwareProfile, nodes: int) -> HardwareProfile:
    """``base`` (one node group) cut to ``nodes`` nodes, named ``<type>-<gpus>``."""
    if len(base.nodes) != 1 or not 1 <= nodes <= base.nodes[0].count:
        raise ValueError(f"nodes must be in [1, {base.nodes[0].count}] of a one-group profile, got {nodes}")
    group = replace(base.nodes[0], count=nodes)
    name = f"{group.gpu}-{nodes * group.devices_per_node}"
    return replace(base, name=name, nodes=(NodeGroup(group.count, group.devices_per_node, group.gpu),))


# ----------------------------------------------------------------------------- one comparison


@dataclass
class Comparison:
    """Every row of one scenario on one profile: tuned baselines, DigenRL at staleness 0 and ≤ 1, the
    best plan of DigenRL's own mechanisms at each staleness (None: none can run), and that plan with TCSS's
    timing-driven switch (``tcss.switch=timing``, not reproducible) where it uses TCSS."""

    baselines: dict[str, PlanScore | None]
    digenrl: dict[int, PlannerResult]
    mechanisms: dict[int, PlanScore | None]
    timing_switch: dict[int, PlanScore | None] = field(default_factory=dict)

    def best_baseline(self, staleness: int) -> PlanScore:
        return max(
            (s for s in self.baselines.values() if s is not None and s.staleness <= staleness),
            key=lambda s: s.samples_per_s,
        )


def compare(
    profile: HardwareProfile,
    costs: DeviceCosts,
    workload: Workload,
    *,
    max_stages: int = 4,
    planning_iterations: int = 5,
    trainer_counts: Sequence[int] | None = None,
    log: Callable[[str], None] | None = None,
) -> Comparison:
    planner = Planner(profile, costs, workload, planning_iterations=planning_iterations, log=log)
    baselines = planner.baselines(max_staleness=1)
    fragments = fragment_choices(workload.prompts_per_iteration)
    searches, mechanisms = {}, {}
    for s in (0, 1):
        options = {"max_staleness": s, "max_stages": max_stages, "fragment_groups": fragments}
        searches[s] = planner.search(
            **options, trainer_counts=trainer_counts, include_baselines=trainer_counts is None
        )
        try:
            mechanisms[s] = planner.search(**options, include_baselines=False).best
        except ValueError:  # no plan of the mechanisms can run (memory, or a one-GPU profile)
            mechanisms[s] = None
    timing = {
        s: planner.score(m.plan.with_(tcss_switch="timing"))
        for s, m in mechanisms.items()
        if m is not None and m.plan.tcss
    }
    return Comparison(baselines, searches, mechanisms, timing)


def _bubbles(score: PlanScore) -> str:
    return ", ".join(f"{role} busy {100 * f:.0f}%" for role, f in sorted(score.busy_fraction.items()))


#: a ``digenrl`` row below this fraction of its bubble-free bound says in its note where the bubble is
BOUND_NOTE_FRACTION = 0.9


def why_not_digenrl(result: PlannerResult, mech: PlanScore | None) -> str:
    """One sentence when the best plan is a baseline point of DigenRL's plan space, or when the best plan
    stays below :data:`BOUND_NOTE_FRACTION` of its bubble-free bound ('' otherwise)."""
    best = result.best
    if best.plan.system == "digenrl":
        fraction = (
            best.samples_per_s / best.bubble_free_samples_per_s if best.bubble_free_samples_per_s else 1
        )
        if fraction >= BOUND_NOTE_FRACTION:
            return ""
        busy = best.busy_fraction
        trainer, generator = busy.get("trainer", 0.0), busy.get("generator", 0.0)
        if trainer >= generator:
            why = (
                f"the trainer pool sets the pace (busy {100 * trainer:.0f}%) and training cannot move to "
                f"the generators (only generation moves, by TAG), so they idle {100 * (1 - generator):.0f}% "
                "of the time"
            )
        else:
            why = (
                f"the generator pool sets the pace (busy {100 * generator:.0f}%) and the trainers idle "
                f"{100 * (1 - trainer):.0f}% of the time waiting for fragments beyond what TAG's helper "
                "work fills"
            )
        return (
            f"{100 * fraction:.0f}% of its bubble-free bound, which spreads the busy seconds over every GPU: "
            f"{why}; no plan the planner searched does better"
        )
    if mech is None:
        return f"the {best.plan.system} point of DigenRL's plan space wins: no plan of its mechanisms fits"
    return (
        f"the {best.plan.system} point of DigenRL's plan space wins ({_bubbles(best)}); the best plan of its "
        f"mechanisms reaches {mech.samples_per_s / best.samples_per_s:.2f}x of it ({_bubbles(mech)})"
    )


def _row(score: PlanScore, label: str, profile: HardwareProfile, **extra: Any) -> dict[str, Any]:
    separate = not score.plan.colocated
    return {
        "system": label,
        "source": "simulated",
        "staleness": score.staleness,
        "samples_per_s": score.samples_per_s,
        "images_per_gpu_s": score.samples_per_s / profile.world_size,
        "bubble_free_samples_per_s": score.bubble_free_samples_per_s,
        "gpus": profile.world_size,
        "generators": score.plan.generators if separate else "",
        "trainers": score.plan.trainers if separate else "",
        "profile": profile.name,
        "plan": score.plan.describe(),
        "run": " ".join(score.plan.overrides()),
        "memory": "; ".join(score.notes),
        **extra,
    }


def regime_of(profile: HardwareProfile, scenario: Scenario, label: str, score: PlanScore | None) -> str:
    """The regimes a row represents (:data:`REGIMES`), ``;``-joined: ``identical`` or ``mixed`` GPUs;
    ``switch`` for the hybrid engine's rows (its offload/onload and re-shard costs: measured where the
    cost file has ``meta.engine_switch``, else modelled from the profile's host link); ``memory`` where
    memory shaped the row's plan (the fit lowered a knob, parked or offloaded state) or no plan of it fits;
    ``multi-node full FT`` where a full fine-tune's shards span nodes; ``variance`` where per-sample costs
    are drawn (``--variance``)."""
    types = {profile.device_type(r).name for r in range(profile.world_size)}
    tags = ["mixed" if len(types) > 1 else "identical"]
    if label.startswith("colocated-engine"):
        tags.append("switch")
    if score is None or memory_shaped(score.plan, scenario.workload):
        tags.append("memory")
    if scenario.workload.trainer_mode == "full" and profile.num_nodes > 1:
        tags.append("multi-node full FT")
    if scenario.workload.variance is not None:
        tags.append("variance")
    return ";".join(tags)


def memory_shaped(plan: RunPlan, workload: Workload) -> bool:
    """Whether the memory fit had to give something up for ``plan`` to fit: state parked off the GPU
    between phases, activation checkpointing turned on, or a smaller micro-batch or generator forward
    than the workload's (raising a batch where memory allows is not a memory limit)."""
    lowered_mb = plan.micro_batch_size is not None and plan.micro_batch_size < workload.micro_batch_size
    lowered_spf = (
        plan.samples_per_forward is not None
        and workload.samples_per_forward > 0
        and 0 < plan.samples_per_forward < workload.samples_per_forward
    )
    checkpointing = bool(plan.activation_checkpointing) and not workload.activation_checkpointing
    return not plan.train_resident or not plan.reward_resident or checkpointing or lowered_mb or lowered_spf


#: every regime tag a row can carry (:func:`regime_of`; ``variance`` from ``--variance`` rows)
REGIMES = ("identical", "mixed", "switch", "memory", "multi-node full FT", "variance")


def comparison_rows(
    comparison: Comparison, profile: HardwareProfile, scenario: Scenario, mc: ModelCosts, experiment: str
) -> list[dict[str, Any]]:
    """The rows of one comparison (module docstring): baselines, then ``digenrl`` and ``digenrl s=1``.

    ``ratio_vs_best_fair_baseline``: a row's samples/s over the best baseline of at most its staleness.
    The fair set is every baseline row of the panel, each tuned over its own knobs: colocated-sync and
    colocated-overlap (on mixed GPUs also with the fair speed split: full-size micro-batches, uneven
    counts), the hybrid engine colocated-engine, separate-sync and separate-async.
    ``mechanisms_ratio_vs_best_fair_baseline``: the same ratio for the best plan that uses at least one
    mechanism, so a tie reached by falling back to a baseline plan is visible."""
    common = {
        "experiment": experiment,
        "model_name": scenario.model,
        "scenario": scenario.label,
        "variance": "" if scenario.workload.variance is None else scenario.workload.variance.label,
        "cost_file": mc.cost_file,
        "cost_source": mc.cost_source,
        "stale": "; ".join(mc.stale),
    }
    rows = []
    colocated = comparison.baselines.get("colocated-sync")
    for label, score in comparison.baselines.items():
        regime = regime_of(profile, scenario, label, score)
        if score is None:  # a zero bar, and why
            rows.append(
                {
                    **common,
                    "system": label,
                    "source": "simulated",
                    "regime": regime,
                    "samples_per_s": 0.0,
                    "profile": profile.name,
                    "gpus": profile.world_size,
                    "note": "no plan of it can run here (memory, or the runtime's start-up checks)",
                }
            )
            continue
        best_fair = comparison.best_baseline(score.staleness)
        rows.append(
            {
                **common,
                **_row(score, label, profile),
                "regime": regime,
                "ratio_vs_best_fair_baseline": score.samples_per_s / best_fair.samples_per_s,
            }
        )
    for staleness, result in comparison.digenrl.items():
        label = "digenrl" if staleness == 0 else f"digenrl s={staleness}"
        best_base = comparison.best_baseline(staleness)
        mech = comparison.mechanisms[staleness]
        timing = comparison.timing_switch.get(staleness)
        rows.append(
            {
                **common,
                **_row(result.best, label, profile),
                "regime": regime_of(profile, scenario, label, result.best),
                "staleness": staleness,
                "ratio_vs_best_fair_baseline": result.best.samples_per_s / best_base.samples_per_s,
                "mechanisms_ratio_vs_best_fair_baseline": ""
                if mech is None
                else mech.samples_per_s / best_base.samples_per_s,
                "mechanisms": ""
                if mech is None
                else f"{mech.samples_per_s:.4g} samples/s: {mech.plan.describe()}"
                + (
                    ""
                    if timing is None
                    else f"; with tcss.switch=timing {timing.samples_per_s:.4g} samples/s"
                ),
                "note": why_not_digenrl(result, mech),
            }
        )
    for row in rows:
        if colocated is not None and row.get("samples_per_s"):
            row["ratio_vs_colocated_sync"] = row["samples_per_s"] / colocated.samples_per_s
    return rows


# ----------------------------------------------------------------------------- validation errors


def _results_relative(path: str) -> str:
    """A cost-file path as the tables name it (from ``experiments/results/`` on), wherever it was run."""
    marker = "experiments/results/"
    return path[path.index(marker) :] if marker in path else path


@dataclass(frozen=True)
class ValidationRecord:
    """One real run compared with the simulator by ``simulate.py validate``."""

    model: str
    profile: str
    system: str
    cost_file: str  # relative to the repository root, as the tables' ``cost_file`` column
    relative_error: float  # simulated vs measured samples/s


def validation_errors(folder: Path) -> list[ValidationRecord]:
    """Every comparison of every ``*.json`` report of ``simulate.py validate`` in ``folder``."""
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        data = json.loads(path.read_text())
        for row in data.get("rows", []):
            if {"model", "profile", "system", "relative_error", "cost_file"} <= set(row):
                out.append(
                    ValidationRecord(
                        row["model"], row["profile"], row["system"], _results_relative(row["cost_file"]),
                        row["relative_error"],
                    )
                )  # fmt: skip
    return out


def attach_validation(rows: list[dict[str, Any]], records: Sequence[ValidationRecord]) -> None:
    """Fill ``validation_error`` from the real runs of the row's model and system priced by the row's own
    cost file: the error on the row's profile, else the error on the profile the run had, named (a
    single-GPU run checks the per-operation costs every profile's row is carried from). Only the model's
    plain workload (``scenario`` = model) takes it: a full fine-tuning or heavy-reward scenario prices work
    that no validation run did."""
    for row in rows:
        plain = row.get("scenario", row.get("model_name")) == row.get("model_name")
        key = (row.get("model_name"), row.get("system"), row.get("cost_file"))
        matches = [r for r in records if plain and (r.model, r.system, r.cost_file) == key]
        same_profile = [r for r in matches if r.profile == row.get("profile")]
        if same_profile:
            row["validation_error"] = f"{100 * same_profile[-1].relative_error:+.1f}%"
        elif matches:
            record = matches[-1]
            row["validation_error"] = f"{100 * record.relative_error:+.1f}% (on {record.profile})"
        else:
            row["validation_error"] = "no measurement"


# ----------------------------------------------------------------------------- writing


def write_table(rows: Sequence[dict[str, Any]], out_dir: Path, stem: str, header: str) -> tuple[Path, Path]:
    """``<stem>.csv`` (results-table format, ``#`` header comment) and ``<stem>.md``, each replaced
    atomically (a table rewritten as panels end is never seen half-written)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out_dir / f"{stem}.csv", out_dir / f"{stem}.md"
    csv_tmp, md_tmp = csv_path.with_suffix(".csv.tmp"), md_path.with_suffix(".md.tmp")
    with csv_tmp.open("w", newline="") as f:
        for line in header.splitlines():
            f.write(f"# {line}\n")
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _fmt(row.get(k, "")) for k in COLUMNS})
    hidden = ("experiment", "model", "model_name", "profile", "cost_file", "run", "scenario")
    shown = [c for c in COLUMNS if c not in hidden]
    lines = [header.replace("\n", "\n\n"), ""]
    for panel in dict.fromkeys(r["model"] for r in rows):
        lines += [f"### {panel}", "", "| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
        for row in (r for r in rows if r["model"] == panel):
            lines.append("| " + " | ".join(_fmt(row.get(c, "")) for c in shown) + " |")
        lines.append("")
    md_tmp.write_text("\n".join(lines) + "\n")
    os.replace(csv_tmp, csv_path)
    os.replace(md_tmp, md_path)
    return csv_path, md_path


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "/")


def header_lines(commands: Sequence[str], what: str) -> str:
    if isinstance(commands, str):  # one command is a list of one, not a sequence of characters
        raise TypeError("header_lines takes a list of commands")
    lines = [what, *(f"command: {c}" for c in commands)]
    lines.append(
        f"date: {time.strftime('%Y-%m-%d')}; hardware: none measured here (every row is simulated by "
        "digenrl.sim from the cost files it names)"
    )
    return "\n".join(lines)


def panel_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows by profile (:data:`PROFILES` order) then scenario (:func:`scenarios` order, a ``+variance``
    panel right after its scenario's); stable within a panel, so a merged table reads like one written in
    a single run."""
    labels = [s.label for s in scenarios()]

    def key(row: dict[str, Any]) -> tuple[int, int, bool]:
        profile, scenario = row.get("profile"), str(row.get("scenario"))
        base = scenario.removesuffix(VARIANCE_SUFFIX)
        return (
            PROFILES.index(profile) if profile in PROFILES else len(PROFILES),
            labels.index(base) if base in labels else len(labels),
            base != scenario,
        )

    return sorted(rows, key=key)


def read_table(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """(the ``command:`` lines of its header, its rows as strings) of a table :func:`write_table` wrote."""
    lines = path.read_text().splitlines()
    commands = [line.split(":", 1)[1].strip() for line in lines if line.startswith("# command:")]
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    return commands, rows


# ----------------------------------------------------------------------------- the three tables


def throughput_rows(
    scenario: Scenario,
    profile_name: str,
    folders: Folders,
    *,
    max_stages: int,
    cost_file: Path | None = None,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Every system's row for ``scenario`` on ``profile_name`` (simulated)."""
    start = time.perf_counter()
    profile = load_profile(profile_name)
    mc = scenario_costs(scenario, folders, cost_file)
    measured = {} if cost_file is not None else measured_types(profile, scenario, folders)
    costs = device_costs(profile, mc.costs, measured)
    comparison = compare(
        profile,
        costs,
        scenario.workload,
        max_stages=max_stages,
        log=lambda line: log(f"[throughput] {scenario.label} @ {profile_name}: {line}"),
    )
    rows = comparison_rows(comparison, profile, scenario, mc, "main")
    for row in rows:
        row["model"] = f"{scenario.label} @ {profile_name}"
    best = comparison.digenrl[0].best
    log(
        f"[throughput] {scenario.label} @ {profile_name}: digenrl {best.samples_per_s:.4g} samples/s "
        f"({best.plan.describe()}) [{time.perf_counter() - start:.1f} s]"
    )
    return rows


def _panel(args: tuple[Scenario, str, Folders, int, Path | None]) -> list[dict[str, Any]]:
    scenario, profile, folders, max_stages, cost_file = args
    return throughput_rows(
        scenario, profile, folders, max_stages=max_stages, cost_file=cost_file, log=_flushed_print
    )


def _flushed_print(line: str) -> None:
    print(line, flush=True)


def panel_rows(
    panels: Sequence[tuple[Scenario, str]],
    folders: Folders,
    *,
    max_stages: int,
    cost_file: Path | None = None,
    jobs: int = 1,
) -> Iterator[list[dict[str, Any]]]:
    """:func:`throughput_rows` of every (scenario, profile) panel, one list per panel as each ends (so a
    caller can write the table as it grows). ``jobs`` > 1 searches panels in that many worker processes;
    a panel's search is sequential and deterministic, so the rows do not depend on ``jobs`` (only the order
    panels end in does: :func:`panel_order` sorts a table)."""
    work = [(scenario, profile, folders, max_stages, cost_file) for scenario, profile in panels]
    if jobs <= 1 or len(work) <= 1:
        for item in work:
            yield _panel(item)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    context = multiprocessing.get_context("spawn")  # no forked torch / thread state in the workers
    with ProcessPoolExecutor(max_workers=min(jobs, len(work)), mp_context=context) as pool:
        futures = {pool.submit(_panel, item): item for item in work}
        for future in as_completed(futures):
            error = future.exception()
            if error is not None:  # stop at once naming the panel; the table keeps the panels that ended
                scenario, profile = futures[future][:2]
                pool.shutdown(wait=False, cancel_futures=True)
                raise RuntimeError(f"panel {scenario.label} @ {profile} failed: {error}") from error
            yield future.result()


def scaling_rows(
    scenario: Scenario,
    base: HardwareProfile,
    nodes: Sequence[int],
    folders: Folders,
    *,
    max_stages: int,
    cost_file: Path | None,
) -> list[dict[str, Any]]:
    """Strong scaling: the same logical batch on ``base`` cut to each node count."""
    mc = scenario_costs(scenario, folders, cost_file)
    rows = []
    for n in nodes:
        start = time.perf_counter()
        profile = sub_cluster(base, n)
        comparison = compare(
            profile, device_costs(profile, mc.costs), scenario.workload, max_stages=max_stages
        )
        new = comparison_rows(comparison, profile, scenario, mc, "scaling")
        for row in new:
            row["model"] = scenario.label
        rows += new
        print(
            f"[scaling] {scenario.label} on {profile.name}: digenrl "
            f"{comparison.digenrl[0].best.samples_per_s:.4g} samples/s [{time.perf_counter() - start:.1f} s]",
            flush=True,
        )
    return rows


def split_rows(
    scenario: Scenario, profile: HardwareProfile, folders: Folders, *, max_stages: int, cost_file: Path | None
) -> list[dict[str, Any]]:
    """For every trainer count: separate-sync with that split and DigenRL's mechanisms restricted to it."""
    mc = scenario_costs(scenario, folders, cost_file)
    costs = device_costs(profile, mc.costs)
    planner = Planner(profile, costs, scenario.workload, planning_iterations=5)
    fragments = fragment_choices(scenario.workload.prompts_per_iteration)
    world = profile.world_size
    rows = []
    common = {
        "experiment": "split",
        "model": scenario.label,
        "model_name": scenario.model,
        "scenario": scenario.label,
        "cost_file": mc.cost_file,
        "cost_source": mc.cost_source,
        "stale": "; ".join(mc.stale),
    }
    for trainers in range(1, world):
        sync = planner.best_of(p for p in planner.baseline_plans("separate-sync") if p.trainers == trainers)
        try:
            best = planner.search(
                trainer_counts=[trainers],
                max_stages=max_stages,
                fragment_groups=fragments,
                include_baselines=False,
            ).best
        except ValueError:
            best = None
        for label, score in (("separate-sync", sync), ("digenrl", best)):
            if score is None:
                continue
            row = {**common, **_row(score, label, profile)}
            row["generators"], row["trainers"] = world - trainers, trainers
            rows.append(row)
    return rows
