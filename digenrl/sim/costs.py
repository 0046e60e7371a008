"""Per-operation costs of one model on one device type, as data (docs/design.md §5, "Simulator
and planner": schedules are replayed from measured per-operation costs).

A :class:`CostModel` is a table of measured points, not a formula: the generator step time at a few
batch sizes (with and without classifier-free guidance), the VAE decode and reward time at a few batch
sizes, the training forward+backward time of one micro-batch at a few micro-batch sizes, and scalar costs
(optimizer step, TAG switch) and byte counts (weights to sync, gradients to all-reduce, trajectory bytes
per sample, weights moved by residency transitions). Times between measured points are linearly
interpolated; outside them linearly extrapolated from the two nearest points (see :func:`interpolate`).

Files live at ``experiments/results/costs/<device>-<model>.json`` (:func:`cost_path`); ``source`` says
whether the numbers were ``measured`` on that device or ``extrapolated from <device>`` by
:meth:`CostModel.scale_to` / :meth:`CostModel.scaled`. ``command`` records how the file was produced.
:func:`measure_costs` (implemented in :mod:`digenrl.sim.measure`, which imports torch) measures the
real components.

This module is dependency-light (stdlib only) so the simulator, the planner and the TSP runtime can
import it without torch.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from digenrl.runtime.profiles import GpuType

#: ``experiments/results/costs`` at the repository root (this file is digenrl/sim/costs.py).
COSTS_DIR = Path(__file__).resolve().parents[2] / "experiments" / "results" / "costs"
CFG_KEYS = {True: "cfg", False: "no_cfg"}
#: The CostModel fields that count bytes (validated as ints >= 0, printed in bytes).
BYTE_FIELDS = (
    "weight_sync_bytes",
    "grad_bytes",
    "fragment_bytes_per_sample",
    "unit_bytes",
    "cond_bytes_per_sample",
    "latent_bytes_per_sample",
    "param_bytes",
    "optimizer_bytes",
    "reward_param_bytes",
)
SOURCES = ("measured", "extrapolated")
FORMAT_VERSION = 1

#: Operations whose time scales with dense matmul/conv throughput (transformer steps, VAE, reward models).
COMPUTE_BOUND_TABLES = ("generator_step_points", "vae_decode_points", "reward_points", "train_points")
#: Operations that stream memory (AdamW is elementwise over parameters and states; TAG's switch copies
#: buffers and gradients), so their time scales with memory bandwidth.
MEMORY_BOUND_SCALARS = ("optimizer_step_s", "helper_switch_s")


def interpolate(points: Mapping[int, float], x: float) -> float:
    """Piecewise-linear value of measured ``points`` ``{batch: seconds}`` at ``x``.

    Between two measured batches: linear interpolation. Outside the measured range: linear
    extrapolation from the two nearest points. One point only: constant throughput (time ∝ batch).
    Below the smallest measured batch b₀ the result is floored at ``t(b₀)·x/b₀``: throughput does not
    grow as the batch shrinks (a GPU forward at batch 1 costs about what batch 4 costs, docs/design.md §1), so
    a smaller batch never gets a *higher* per-sample throughput than the smallest measured one. Above
    the largest measured batch the result is floored at the largest measured time (more work never
    takes less time). ``x = 0`` costs 0.
    """
    if not points:
        raise ValueError("interpolate: no measured points")
    if x < 0 or not math.isfinite(x):
        raise ValueError(f"batch must be a finite number >= 0, got {x!r}")
    if x == 0:
        return 0.0
    xs = sorted(points)
    ys = [float(points[b]) for b in xs]
    if len(xs) == 1:
        return ys[0] * x / xs[0]
    if x <= xs[0]:
        value = _line(xs[0], ys[0], xs[1], ys[1], x)
        return max(value, ys[0] * x / xs[0])
    if x >= xs[-1]:
        value = _line(xs[-2], ys[-2], xs[-1], ys[-1], x)
        return max(value, ys[-1])
    i = bisect.bisect_right(xs, x)
    return _line(xs[i - 1], ys[i - 1], xs[i], ys[i], x)


def _line(x0: float, y0: float, x1: float, y1: float, x: float) -> float:
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass
class CostModel:
    """Measured per-operation costs of ``model`` on device type ``device`` (seconds, bytes).

    Tables map a batch size to seconds:

    - ``generator_step_points[cfg|no_cfg][B]``: one sampler step for B samples (the transformer forward —
      of 2B with true CFG, as :meth:`digenrl.rollout.sampler.Sampler.velocity` batches it — plus the
      flow-SDE transition).
    - ``vae_decode_points[B]``, ``reward_points[B]``: decode B final latents; score B images.
    - ``train_points[cfg|no_cfg][m]``: forward + backward of ONE micro-batch of m training units
      (:meth:`digenrl.trainer.trainer.PolicyTrainer.accumulate`).

    Scalars: ``optimizer_step_s`` (clip + AdamW + zero_grad, :meth:`PolicyTrainer.step`),
    ``helper_switch_s`` (one TAG switch between training and generating, docs/design.md §3 (TAG)). Bytes:
    ``weight_sync_bytes`` (what a weight sync broadcasts: LoRA adapter or full weights), ``grad_bytes``
    (what the gradient all-reduce moves), ``fragment_bytes_per_sample`` (one sample's trajectory record
    shipped whole, as the separate baselines do: trained latents and next latents, log-probs, sigmas,
    step indices, condition once, reward, advantage; no clean latent), ``unit_bytes`` (one training-unit
    row of a GAP unit shard, ``TrajectoryBatch.select_units``: one transition *and its sample's
    condition*, which every unit row repeats), ``cond_bytes_per_sample`` (the text condition alone),
    ``latent_bytes_per_sample`` (one latent, the current state a TSP stage hands on), ``param_bytes`` /
    ``optimizer_bytes`` / ``reward_param_bytes`` (what colocated residency transitions move over the
    host↔device link).
    """

    device: str
    model: str
    generator_step_points: dict[str, dict[int, float]]
    vae_decode_points: dict[int, float]
    reward_points: dict[int, float]
    train_points: dict[str, dict[int, float]]
    optimizer_step_s: float
    weight_sync_bytes: int
    grad_bytes: int
    fragment_bytes_per_sample: int
    unit_bytes: int
    cond_bytes_per_sample: int
    latent_bytes_per_sample: int
    param_bytes: int
    optimizer_bytes: int
    reward_param_bytes: int = 0
    helper_switch_s: float = 0.0
    source: str = "measured"
    command: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.device, str) or not self.device:
            raise ValueError(f"CostModel.device must be a non-empty string, got {self.device!r}")
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"CostModel.model must be a non-empty string, got {self.model!r}")
        if not self.source.startswith(SOURCES):
            raise ValueError(
                f"CostModel.source must be 'measured' or 'extrapolated from <device>', got {self.source!r}"
            )
        for name in ("generator_step_points", "train_points"):
            by_flag = getattr(self, name)
            if not isinstance(by_flag, Mapping) or not by_flag:
                raise ValueError(f"CostModel.{name} must map 'cfg'/'no_cfg' to {{batch: seconds}}")
            unknown = sorted(set(by_flag) - set(CFG_KEYS.values()))
            if unknown:
                raise ValueError(f"CostModel.{name} has unknown key(s) {unknown}; allowed: cfg, no_cfg")
            setattr(self, name, {flag: _points(f"{name}.{flag}", pts) for flag, pts in by_flag.items()})
        self.vae_decode_points = _points("vae_decode_points", self.vae_decode_points)
        self.reward_points = _points("reward_points", self.reward_points)
        for name in ("optimizer_step_s", "helper_switch_s"):
            setattr(self, name, _non_negative(name, getattr(self, name)))
        for name in BYTE_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"CostModel.{name} must be an int >= 0 (bytes), got {value!r}")

    # ------------------------------------------------------------------ per-operation costs
    def generator_step_s(self, batch: int, cfg: bool) -> float:
        """Seconds of one sampler step for ``batch`` samples (CFG doubles the model batch)."""
        return interpolate(self._by_flag("generator_step_points", cfg), batch)

    def vae_decode_s(self, batch: int) -> float:
        return interpolate(self.vae_decode_points, batch)

    def reward_s(self, batch: int) -> float:
        return interpolate(self.reward_points, batch)

    def score_s(self, batch: int) -> float:
        """Decode + reward of ``batch`` finished samples (the generator's ``score`` phase)."""
        return self.vae_decode_s(batch) + self.reward_s(batch)

    def train_micro_batch_s(self, micro_batch: int, cfg: bool) -> float:
        """Forward + backward of one micro-batch of ``micro_batch`` training units."""
        return interpolate(self._by_flag("train_points", cfg), micro_batch)

    def train_unit_s(self, micro_batch: int, cfg: bool) -> float:
        """Forward + backward seconds *per unit* when units are trained ``micro_batch`` at a time.

        ``cfg`` is required (no default): the training forward repeats the rollout's guidance
        (Sampler.velocity), so its cost depends on it as much as the generator's does.
        """
        if micro_batch <= 0:
            raise ValueError(f"micro_batch must be > 0, got {micro_batch}")
        return self.train_micro_batch_s(micro_batch, cfg) / micro_batch

    def train_units_s(self, units: int, micro_batch: int, cfg: bool) -> float:
        """Seconds to accumulate ``units`` units in micro-batches of ``micro_batch`` (last one partial)."""
        if units < 0 or micro_batch <= 0:
            raise ValueError(f"units must be >= 0 and micro_batch > 0, got {units}, {micro_batch}")
        full, rest = divmod(units, micro_batch)
        total = full * self.train_micro_batch_s(micro_batch, cfg)
        return total + (self.train_micro_batch_s(rest, cfg) if rest else 0.0)

    def has_cfg(self, cfg: bool) -> bool:
        """Whether points for this guidance setting were measured (guidance-distilled models have none)."""
        return CFG_KEYS[bool(cfg)] in self.generator_step_points and CFG_KEYS[bool(cfg)] in self.train_points

    def _by_flag(self, table: str, cfg: bool) -> dict[int, float]:
        by_flag = getattr(self, table)
        key = CFG_KEYS[bool(cfg)]
        if key not in by_flag:
            raise ValueError(
                f"cost model {self.device}-{self.model} has no {table}[{key!r}] "
                f"(measured: {sorted(by_flag)}); guidance-distilled models have no separate CFG pass"
            )
        return by_flag[key]

    # ------------------------------------------------------------------ scaling to other devices
    def scaled(self, compute_factor: float, memory_factor: float, device: str) -> CostModel:
        """A copy whose compute-bound times are multiplied by ``compute_factor`` and memory-bound times by
        ``memory_factor``; bytes are unchanged. ``source`` becomes ``extrapolated from <self.device>``."""
        for name, value in (("compute_factor", compute_factor), ("memory_factor", memory_factor)):
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")

        def scale(points: dict[int, float]) -> dict[int, float]:
            return {b: t * compute_factor for b, t in points.items()}

        origin = self.source.removeprefix("extrapolated from ") if self.source != "measured" else self.device
        return replace(
            self,
            device=device,
            generator_step_points={k: scale(v) for k, v in self.generator_step_points.items()},
            vae_decode_points=scale(self.vae_decode_points),
            reward_points=scale(self.reward_points),
            train_points={k: scale(v) for k, v in self.train_points.items()},
            optimizer_step_s=self.optimizer_step_s * memory_factor,
            helper_switch_s=self.helper_switch_s * memory_factor,
            source=f"extrapolated from {origin}",
            meta={**self.meta, "compute_factor": compute_factor, "memory_factor": memory_factor},
        )

    def scale_to(self, gpu_type: GpuType, from_type: GpuType) -> CostModel:
        """Predict this model's costs on ``gpu_type`` from measurements on ``from_type``.

        Roofline-style first-order rule: DiT / VAE / reward forwards and backwards are dominated by dense
        bf16 matmuls and convolutions, so their time scales with the inverse of peak bf16 throughput
        (``bf16_tflops``; the measured ceilings ``measured_bf16_tflops`` are used when *both* types have
        one, never a measured value against a spec-sheet one). The optimizer step (AdamW streams params +
        two moments) and the TAG switch (buffer copies) are memory-bound and scale with ``hbm_gbps``.
        Byte counts do not change. The result says ``source = "extrapolated from <device>"``; measured
        files should replace it as soon as the device is available.
        """
        if from_type.measured_bf16_tflops is not None and gpu_type.measured_bf16_tflops is not None:
            compute = from_type.measured_bf16_tflops / gpu_type.measured_bf16_tflops
        else:
            compute = from_type.bf16_tflops / gpu_type.bf16_tflops
        memory = from_type.hbm_gbps / gpu_type.hbm_gbps
        return self.scaled(compute, memory, gpu_type.name)

    def with_reward(
        self,
        reward: str,
        reward_points: Mapping[int, float],
        reward_param_bytes: int,
        provenance: Mapping[str, Any],
    ) -> CostModel:
        """A copy scoring with another reward measured on its own (experiments/bench_reward.py): its
        ``reward_points`` and ``reward_param_bytes`` replace this model's, ``meta["reward"]`` names it and
        ``meta["reward_costs"]`` records how it was measured. Decode and every other cost are kept, so the
        caller must match device and image size (the reward cost depends on the decoded image, not on the
        generator)."""
        return replace(
            self,
            reward_points=dict(reward_points),
            reward_param_bytes=reward_param_bytes,
            meta={**self.meta, "reward": reward, "reward_costs": dict(provenance)},
        )

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["format"] = FORMAT_VERSION
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostModel:
        if not isinstance(data, Mapping):
            raise ValueError(f"a cost model must be a JSON object, got {type(data).__name__}")
        allowed = {f.name for f in fields(cls)} | {"format"}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ValueError(f"cost model has unknown key(s) {unknown}; allowed: {sorted(allowed)}")
        if data.get("format", FORMAT_VERSION) != FORMAT_VERSION:
            raise ValueError(f"cost model format {data.get('format')!r}; this reader needs {FORMAT_VERSION}")
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            raise ValueError(f"cost model is missing key(s) {missing}")
        return cls(**{k: v for k, v in data.items() if k != "format"})

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"cost file '{path}' does not exist")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"cost file '{path}' is not valid JSON: {error}") from error
        return cls.from_dict(data)

    def describe(self) -> str:
        """A printable table of every cost."""
        lines = [f"cost model {self.model} on {self.device} ({self.source})"]
        if self.command:
            lines.append(f"  produced by: {self.command}")
        for flag, pts in sorted(self.generator_step_points.items()):
            lines.append(f"  {f'generator step [{flag}]':<28}" + _fmt_points(pts, "B"))
        lines.append(f"  {'vae decode':<28}" + _fmt_points(self.vae_decode_points, "B"))
        lines.append(f"  {'reward':<28}" + _fmt_points(self.reward_points, "B"))
        for flag, pts in sorted(self.train_points.items()):
            lines.append(f"  {f'train micro-batch [{flag}]':<28}" + _fmt_points(pts, "m"))
        lines.append(f"  {'optimizer step':<28}{1e3 * self.optimizer_step_s:.3f} ms")
        lines.append(f"  {'TAG switch':<28}{1e3 * self.helper_switch_s:.3f} ms")
        for name in BYTE_FIELDS:
            lines.append(f"  {name:<28}{getattr(self, name):,} B")
        return "\n".join(lines)


def _points(name: str, raw: Any) -> dict[int, float]:
    """``{batch: seconds}`` with int keys (JSON stores them as strings), checked."""
    if not isinstance(raw, Mapping) or not raw:
        raise ValueError(f"CostModel.{name} must be a non-empty mapping {{batch: seconds}}, got {raw!r}")
    points: dict[int, float] = {}
    for key, value in raw.items():
        try:
            batch = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"CostModel.{name} key {key!r} is not an integer batch size") from None
        if batch <= 0 or str(batch) != str(key).strip():
            raise ValueError(f"CostModel.{name} key {key!r} must be a positive integer batch size")
        points[batch] = _non_negative(f"{name}[{batch}]", value)
    return dict(sorted(points.items()))


def _non_negative(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"CostModel.{name} must be a finite number >= 0 (seconds), got {value!r}")
    return float(value)


def _fmt_points(points: Mapping[int, float], letter: str) -> str:
    return "  ".join(f"{letter}={b}: {1e3 * t:.3f} ms" for b, t in sorted(points.items()))


# ----------------------------------------------------------------------------- files


def cost_path(device: str, model: str, root: str | Path | None = None) -> Path:
    """``<root>/<device>-<model>.json`` (root defaults to ``experiments/results/costs``)."""
    return Path(root if root is not None else COSTS_DIR) / f"{device}-{model}.json"


def load_costs(device: str, model: str, root: str | Path | None = None) -> CostModel:
    """Load ``<device>-<model>.json``; the error lists the cost files that do exist."""
    path = cost_path(device, model, root)
    if not path.is_file():
        folder = path.parent
        have = sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
        raise ValueError(
            f"no cost file for device={device!r} model={model!r} ({path}); available: {have or 'none'} "
            "(produce one with experiments/run_profile.py)"
        )
    return CostModel.load(path)


def measure_costs(model_name: str, device: str = "auto", **kwargs: Any) -> CostModel:
    """Measure the real components (see :func:`digenrl.sim.measure.measure_costs`; imports torch)."""
    from digenrl.sim.measure import measure_costs as _measure

    return _measure(model_name, device, **kwargs)
