"""Per-operation costs of one model on one device type, as data (docs/design.md §5, "Simulator
and planner": schedules are replayed from measured per-operation costs).

A :class:`CostModel` is a table of measured points, not a formula: the generator step time at a few
batch sizes (with and without classifier-free guidance), the VAE decode and reward time at a few batch
sizes, the training forward+backward time of one micro-batch at a few micro-batch sizes, the peak device
memory of a training and of a generating process at those sizes, and scalar costs (optimizer step, device
synchronisation of a TAG switch, per-message latency, weight load) and byte counts (weights to sync,
gradients to all-reduce, trajectory bytes per sample, what residency transitions move, text encoders,
VAE, reward model). Times between measured points are linearly interpolated; below them floored at the
smallest point's throughput; above the largest measured micro-batch a training time is the measured
training/forward ratio times the measured forward at that batch (:meth:`CostModel.train_micro_batch_s`).

``path`` says which code path was timed (``eager``: diffusers as it comes; ``compiled+autocast``: the
project's GPU path, ``model.compile=true model.autocast=true``), so a file is only used to predict runs
of that path (:func:`run_path`). Files are named ``<device>-<model>.json`` in a folder the caller names
(:func:`cost_path`; the committed ones are ``experiments/results/costs/``); ``source`` says whether the
numbers were ``measured`` on that device or ``extrapolated from <device>`` by :meth:`CostModel.scale_to` /
:meth:`CostModel.scaled`. ``command`` records how the file was produced.
:func:`digenrl.perf.measure_costs.measure_costs` measures the real components.

Format 2 (this reader) added ``path``, the memory fields, ``activation_checkpointing``,
``message_latency_s``, ``weight_load_s`` and replaced ``helper_switch_s`` by ``switch_sync_s``: format 1
timed a TAG switch as a round trip of parking the pending gradients to host memory, which the runtime
does only with ``tag.park_grads=true`` (docs/design.md §3 (TAG)); the simulator now prices whatever a
switch moves by its bytes (:mod:`digenrl.sim.residency`). A format-1 file loads with that number kept in
``meta["v1_helper_switch_s"]``.

Beyond the standard library this module imports one rule of the trainer's, how units fall into
micro-batches (:func:`digenrl.data.micro_batches.split_units`), so the prices follow what runs.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from digenrl.data.micro_batches import split_units

if TYPE_CHECKING:
    from digenrl.runtime.hardware.profiles import GpuType

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
    "text_encoder_bytes",
    "vae_param_bytes",
)
#: Scalar seconds of a cost model (validated as finite numbers >= 0).
SECOND_FIELDS = ("optimizer_step_s", "switch_sync_s", "message_latency_s", "weight_load_s")
SOURCES = ("measured", "extrapolated")
#: The code path a cost file timed: diffusers eager, or the project's optimised GPU path (regional
#: torch.compile; with autocast the fp32 LoRA matmuls run in 16 bits), docs/design.md §5.
PATHS = ("eager", "compiled", "compiled+autocast")
FORMAT_VERSION = 2

#: Operations whose time scales with dense matmul/conv throughput (transformer steps, VAE, reward models).
COMPUTE_BOUND_TABLES = ("generator_step_points", "vae_decode_points", "reward_points", "train_points")
#: Operations that stream device memory (AdamW is elementwise over parameters and states; loading synced
#: weights copies them), so their time scales with memory bandwidth. A switch's device synchronisation and
#: a message's latency do not depend on the GPU.
MEMORY_BOUND_SCALARS = ("optimizer_step_s", "weight_load_s")


def run_path(compile: bool, autocast: bool) -> str:
    """The :data:`PATHS` entry a run with ``model.compile`` / ``model.autocast`` executes."""
    if compile:
        return "compiled+autocast" if autocast else "compiled"
    return "eager"


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
    ``switch_sync_s`` (the fixed part of one TAG switch between training and generating: a device
    synchronisation; what a switch moves is priced by its bytes, docs/design.md §3 (TAG)),
    ``message_latency_s`` (added to every point-to-point message and collective: NCCL launch plus the
    c10d-store handshake of a buffered send), ``weight_load_s`` (a generator applying synced weights to
    its model). Bytes:
    ``weight_sync_bytes`` (what a weight sync broadcasts: LoRA adapter or full weights), ``grad_bytes``
    (what the gradient all-reduce moves), ``fragment_bytes_per_sample`` (one sample's trajectory record
    shipped whole, as the separate baselines do: trained latents and next latents, log-probs, sigmas,
    step indices, condition once, reward, advantage; no clean latent), ``unit_bytes`` (one training-unit
    row of a GAP unit shard, ``TrajectoryBatch.select_units``: one transition *and its sample's
    condition*, which every unit row repeats), ``cond_bytes_per_sample`` (the text condition alone),
    ``latent_bytes_per_sample`` (one latent: the current state x a TSP stage hands on, beside the
    condition and the record buffers, docs/design.md §3 (TSP)), ``param_bytes`` /
    ``optimizer_bytes`` / ``reward_param_bytes`` (what colocated residency transitions move over the
    host↔device link), ``text_encoder_bytes`` / ``vae_param_bytes`` (the text encoders and the VAE every
    rank holds next to the transformer, ``digenrl/systems/components.py``).

    Memory (bytes, measured peaks of ``torch.cuda.max_memory_allocated``; empty = not measured, then
    the simulator cannot check feasibility and says so): ``train_peak_bytes[cfg|no_cfg][m]`` — one
    training process at micro-batch m (transformer weights, trainable state, optimizer state, gradients,
    activations; no text encoders or VAE: the benchmark feeds random conditions);
    ``generator_peak_bytes[cfg|no_cfg][B]`` — one generating process at batch B (weights + activations).
    ``activation_checkpointing``: the training points were measured with it on.
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
    text_encoder_bytes: int = 0
    vae_param_bytes: int = 0
    switch_sync_s: float = 0.0
    message_latency_s: float = 0.0
    weight_load_s: float = 0.0
    path: str = "eager"
    activation_checkpointing: bool = False
    train_peak_bytes: dict[str, dict[int, int]] = field(default_factory=dict)
    generator_peak_bytes: dict[str, dict[int, int]] = field(default_factory=dict)
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
        for name in SECOND_FIELDS:
            setattr(self, name, _non_negative(name, getattr(self, name)))
        if self.path not in PATHS:
            raise ValueError(
                f"CostModel.path={self.path!r} is not allowed; choose one of: {', '.join(PATHS)}"
            )
        if not isinstance(self.activation_checkpointing, bool):
            raise ValueError(
                "CostModel.activation_checkpointing must be true or false, got "
                f"{self.activation_checkpointing!r}"
            )
        for name in ("train_peak_bytes", "generator_peak_bytes"):
            by_flag = getattr(self, name)
            if not isinstance(by_flag, Mapping):
                raise ValueError(f"CostModel.{name} must map 'cfg'/'no_cfg' to {{batch: bytes}}")
            unknown = sorted(set(by_flag) - set(CFG_KEYS.values()))
            if unknown:
                raise ValueError(f"CostModel.{name} has unknown key(s) {unknown}; allowed: cfg, no_cfg")
            setattr(self, name, {f: _byte_points(f"{name}.{f}", pts) for f, pts in by_flag.items()})
        for name in BYTE_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"CostModel.{name} must be an int >= 0 (bytes), got {value!r}")
        # memo of computed times (a simulation asks for the same few thousands of times); not a field, so
        # equality, JSON and dataclasses.replace ignore it. Mutating a table afterwards: call forget().
        self.__dict__["_memo"] = {}

    def forget(self) -> None:
        """Drop the memo of computed times (after changing a table in place)."""
        self.__dict__["_memo"] = {}

    # ------------------------------------------------------------------ per-operation costs
    def generator_step_s(self, batch: int, cfg: bool) -> float:
        """Seconds of one sampler step for ``batch`` samples (CFG doubles the model batch)."""
        key = ("step", batch, bool(cfg))
        memo = self.__dict__["_memo"]
        if key not in memo:
            memo[key] = interpolate(self._by_flag("generator_step_points", cfg), batch)
        return memo[key]

    def vae_decode_s(self, batch: int) -> float:
        return interpolate(self.vae_decode_points, batch)

    def reward_s(self, batch: int) -> float:
        return interpolate(self.reward_points, batch)

    def score_s(self, batch: int) -> float:
        """Decode + reward of ``batch`` finished samples (the generator's ``score`` phase)."""
        return self.vae_decode_s(batch) + self.reward_s(batch)

    def train_micro_batch_s(self, micro_batch: int, cfg: bool, checkpointing: bool | None = None) -> float:
        """Forward + backward of one micro-batch of ``micro_batch`` training units.

        Inside the measured micro-batches: interpolation. Above the largest measured one (m₀): the measured
        training/forward ratio at m₀ times the measured forward (generator step) at ``micro_batch``, so the
        training cost grows with the batch the way the measured forward does instead of along a straight
        line through two small batches. ``checkpointing`` (None = as measured): activation checkpointing
        recomputes the forward once more in the backward, so turning it on adds one forward of the
        micro-batch and turning it off (a file measured with it) removes one."""
        key = ("train", micro_batch, bool(cfg), checkpointing)
        memo = self.__dict__["_memo"]
        if key not in memo:
            memo[key] = self._train_micro_batch_s(micro_batch, cfg, checkpointing)
        return memo[key]

    def _train_micro_batch_s(self, micro_batch: int, cfg: bool, checkpointing: bool | None) -> float:
        points = self._by_flag("train_points", cfg)
        largest = max(points)
        if micro_batch > largest and self.has_forward(cfg):
            seconds = self.train_forward_ratio(cfg) * self.generator_step_s(micro_batch, cfg)
        else:
            seconds = interpolate(points, micro_batch)
        if checkpointing is None or checkpointing == self.activation_checkpointing:
            return seconds
        forward = self.generator_step_s(micro_batch, cfg)
        return seconds + forward if checkpointing else max(seconds - forward, 0.5 * seconds)

    def train_forward_ratio(self, cfg: bool) -> float:
        """Training seconds of a micro-batch over the forward (generator step) seconds of as many samples,
        at the largest measured micro-batch: what every extrapolation of training cost multiplies by."""
        points = self._by_flag("train_points", cfg)
        largest = max(points)
        return points[largest] / self.generator_step_s(largest, cfg)

    def has_forward(self, cfg: bool) -> bool:
        return CFG_KEYS[bool(cfg)] in self.generator_step_points

    def train_unit_s(self, micro_batch: int, cfg: bool, checkpointing: bool | None = None) -> float:
        """Forward + backward seconds *per unit* when units are trained ``micro_batch`` at a time.

        ``cfg`` is required (no default): the training forward repeats the rollout's guidance
        (Sampler.velocity), so its cost depends on it as much as the generator's does.
        """
        if micro_batch <= 0:
            raise ValueError(f"micro_batch must be > 0, got {micro_batch}")
        return self.train_micro_batch_s(micro_batch, cfg, checkpointing) / micro_batch

    def train_units_s(
        self, units: int, micro_batch: int, cfg: bool, checkpointing: bool | None = None
    ) -> float:
        """Seconds to accumulate ``units`` units in micro-batches of ``micro_batch`` (last one partial,
        :func:`digenrl.data.micro_batches.split_units`)."""
        full, rest = split_units(units, micro_batch)
        total = full * self.train_micro_batch_s(micro_batch, cfg, checkpointing)
        return total + (self.train_micro_batch_s(rest, cfg, checkpointing) if rest else 0.0)

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

    # ------------------------------------------------------------------ memory
    def has_memory(self, cfg: bool) -> bool:
        """Whether peak memory was measured for this guidance setting (else feasibility is unknown)."""
        key = CFG_KEYS[bool(cfg)]
        return bool(self.train_peak_bytes.get(key)) and bool(self.generator_peak_bytes.get(key))

    def train_peak(self, micro_batch: int, cfg: bool) -> float:
        """Peak bytes of a training process at ``micro_batch`` (as measured: with or without activation
        checkpointing, :attr:`activation_checkpointing`); linear in the micro-batch between and beyond the
        measured points (activations grow linearly with it)."""
        return _memory_interpolate(self.train_peak_bytes[CFG_KEYS[bool(cfg)]], micro_batch)

    def generator_peak(self, batch: int, cfg: bool) -> float:
        """Peak bytes of a generating process at ``batch`` samples per forward."""
        return _memory_interpolate(self.generator_peak_bytes[CFG_KEYS[bool(cfg)]], batch)

    # ------------------------------------------------------------------ scaling to other devices
    def scaled(self, compute_factor: float, memory_factor: float, device: str) -> CostModel:
        """A copy whose compute-bound times are multiplied by ``compute_factor`` and memory-bound times by
        ``memory_factor``; bytes are unchanged. ``source`` becomes ``extrapolated from <self.device>``. Of a
        measured hybrid-engine switch (``meta["engine_switch"]``) only the re-shard, a device copy, carries
        over (times ``memory_factor``); its host copies belong to the measured machine's link, so the
        simulator prices them from the profile's instead."""
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
            **{name: getattr(self, name) * memory_factor for name in MEMORY_BOUND_SCALARS},
            source=f"extrapolated from {origin}",
            meta={
                **self.meta,
                "compute_factor": compute_factor,
                "memory_factor": memory_factor,
                **_scaled_switch(self.meta, memory_factor),
            },
        )

    def scale_to(self, gpu_type: GpuType, from_type: GpuType) -> CostModel:
        """Predict this model's costs on ``gpu_type`` from measurements on ``from_type``.

        Roofline-style first-order rule: DiT / VAE / reward forwards and backwards are dominated by dense
        bf16 matmuls and convolutions, so their time scales with the inverse of peak bf16 throughput
        (``bf16_tflops``; the measured ceilings ``measured_bf16_tflops`` are used when *both* types have
        one, never a measured value against a spec-sheet one). The optimizer step (AdamW streams params +
        two moments) and loading synced weights are memory-bound and scale with ``hbm_gbps``. Byte counts,
        memory peaks, the switch synchronisation and message latency do not change. The result says
        ``source = "extrapolated from <device>"``; measured files should replace it as soon as the device
        is available.
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
        """A copy scoring with another reward measured on its own (``experiments/measure.py reward``): its
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
        version = data.get("format", FORMAT_VERSION)
        if version == 1:
            data = _from_format_1(data)
        elif version != FORMAT_VERSION:
            raise ValueError(f"cost model format {version!r}; this reader needs 1 or {FORMAT_VERSION}")
        allowed = {f.name for f in fields(cls)} | {"format"}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ValueError(f"cost model has unknown key(s) {unknown}; allowed: {sorted(allowed)}")
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
        ckpt = ", activation checkpointing" if self.activation_checkpointing else ""
        lines = [f"cost model {self.model} on {self.device} ({self.source}; path {self.path}{ckpt})"]
        if self.command:
            lines.append(f"  produced by: {self.command}")
        for flag, pts in sorted(self.generator_step_points.items()):
            lines.append(f"  {f'generator step [{flag}]':<28}" + _fmt_points(pts, "B"))
        lines.append(f"  {'vae decode':<28}" + _fmt_points(self.vae_decode_points, "B"))
        lines.append(f"  {'reward':<28}" + _fmt_points(self.reward_points, "B"))
        for flag, pts in sorted(self.train_points.items()):
            lines.append(f"  {f'train micro-batch [{flag}]':<28}" + _fmt_points(pts, "m"))
        for name, table in (
            ("train peak", self.train_peak_bytes),
            ("generator peak", self.generator_peak_bytes),
        ):
            for flag, pts in sorted(table.items()):
                cells = "  ".join(f"{b}: {v / 2**30:.1f} GiB" for b, v in sorted(pts.items()))
                lines.append(f"  {f'{name} [{flag}]':<28}{cells}")
        for name in SECOND_FIELDS:
            lines.append(f"  {name:<28}{1e3 * getattr(self, name):.3f} ms")
        for name in BYTE_FIELDS:
            lines.append(f"  {name:<28}{getattr(self, name):,} B")
        return "\n".join(lines)


def _from_format_1(data: Mapping[str, Any]) -> dict[str, Any]:
    """A format-1 file as format 2: its ``helper_switch_s`` (a round trip of parking the pending gradients,
    which only ``tag.park_grads=true`` does) moves to ``meta``; ``meta["path"]`` names the code path."""
    out = {k: v for k, v in data.items() if k not in ("format", "helper_switch_s")}
    meta = dict(out.get("meta", {}))
    if "helper_switch_s" in data:
        meta["v1_helper_switch_s"] = data["helper_switch_s"]
    out["meta"] = meta
    if "path" not in out:
        settings = str(meta.get("trainer_path_settings", ""))
        if meta.get("path") == "optimized":
            out["path"] = "compiled+autocast" if "'autocast': True" in settings else "compiled"
        else:
            out["path"] = "eager"
    return out


def _points(name: str, raw: Any) -> dict[int, float]:
    """``{batch: seconds}`` with int keys (JSON stores them as strings), checked."""
    if not isinstance(raw, Mapping) or not raw:
        raise ValueError(f"CostModel.{name} must be a non-empty mapping {{batch: seconds}}, got {raw!r}")
    points: dict[int, float] = {}
    for key, value in raw.items():
        points[_batch_key(name, key)] = _non_negative(f"{name}[{key}]", value)
    return dict(sorted(points.items()))


def _byte_points(name: str, raw: Any) -> dict[int, int]:
    """``{batch: bytes}`` with int keys, checked (may be empty: not measured)."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"CostModel.{name} must be a mapping {{batch: bytes}}, got {raw!r}")
    points: dict[int, int] = {}
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"CostModel.{name}[{key}] must be an int > 0 (bytes), got {value!r}")
        points[_batch_key(name, key)] = value
    return dict(sorted(points.items()))


def _batch_key(name: str, key: Any) -> int:
    try:
        batch = int(key)
    except (TypeError, ValueError):
        raise ValueError(f"CostModel.{name} key {key!r} is not an integer batch size") from None
    if batch <= 0 or str(batch) != str(key).strip():
        raise ValueError(f"CostModel.{name} key {key!r} must be a positive integer batch size")
    return batch


def _memory_interpolate(points: Mapping[int, int], x: float) -> float:
    """Peak bytes at batch ``x``: linear through the measured points, continued linearly beyond them
    (one point: the static part is unknown, so the peak is taken as constant — a lower bound)."""
    if not points:
        raise ValueError("no measured memory peaks")
    xs = sorted(points)
    if len(xs) == 1:
        return float(points[xs[0]])
    if x <= xs[0]:
        return max(0.0, _line(xs[0], points[xs[0]], xs[1], points[xs[1]], x))
    if x >= xs[-1]:
        return _line(xs[-2], points[xs[-2]], xs[-1], points[xs[-1]], x)
    i = bisect.bisect_right(xs, x)
    return _line(xs[i - 1], points[xs[i - 1]], xs[i], points[xs[i]], x)


def _non_negative(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"CostModel.{name} must be a finite number >= 0 (seconds), got {value!r}")
    return float(value)


def _fmt_points(points: Mapping[int, float], letter: str) -> str:
    return "  ".join(f"{letter}={b}: {1e3 * t:.3f} ms" for b, t in sorted(points.items()))


# ----------------------------------------------------------------------------- files


def cost_path(device: str, model: str, root: str | Path) -> Path:
    """``<root>/<device>-<model>.json`` (the committed files: ``experiments/results/costs``, a folder the
    ``experiments/`` scripts pass)."""
    return Path(root) / f"{device}-{model}.json"


def _scaled_switch(meta: dict[str, Any], memory_factor: float) -> dict[str, Any]:
    """``meta["engine_switch"]`` for another device (:meth:`CostModel.scaled`): each mode's re-shard only."""
    switch = meta.get("engine_switch")
    if not switch:
        return {}
    return {
        "engine_switch": {
            mode: {"reshard_s": float(v["reshard_s"]) * memory_factor}
            for mode, v in switch.items()
            if "reshard_s" in v
        }
    }


def load_costs(device: str, model: str, root: str | Path) -> CostModel:
    """Load ``<root>/<device>-<model>.json``; the error lists the cost files that do exist."""
    path = cost_path(device, model, root)
    if not path.is_file():
        folder = path.parent
        have = sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
        raise ValueError(
            f"no cost file for device={device!r} model={model!r} ({path}); available: {have or 'none'} "
            "(produce one with experiments/measure.py costs)"
        )
    return CostModel.load(path)
