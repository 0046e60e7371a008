"""Typed experiment configuration: dataclasses, YAML + ``key=value`` overrides.

A run is described by one :class:`Config`. ``load_config(path, overrides)`` reads a YAML file and
applies command-line overrides written exactly as a user types them::

    system=colocated-sync profile=cpu-2 model=tiny-sd3 reward=brightness iterations=20 seed=3
    algo.group_size=8 trainer.lr=1e-3 sampler.num_steps=6

A bare section name (``model=…``, ``reward=…``) sets that section's ``name``. Parsing checks every key
against the dataclass fields and every value against its type, naming the key on error. Checks that need
the registries (model, reward, profile and system names) and each system's declaration of the knobs it
honours live in :mod:`digenrl.validation`; this module imports nothing from the package, so every other
module can import it.

``load_config`` remembers which keys the user set (the YAML file and the overrides), so validation can
reject a knob the chosen system does not honour only when somebody asked for it (:func:`explicit_keys`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """An invalid configuration; the message names the offending key and what is allowed."""


@dataclass
class ModelConfig:
    """Which generator to train (a key of ``digenrl.models.MODEL_SPECS``) and how to build it."""

    name: str = "tiny-sd3"
    pretrained_path: str | None = None  # local diffusers-style directory; None = random weights
    dtype: str = "float32"  # parameter/compute dtype of the transformer: float32 | bfloat16 | float16
    height: int | None = None  # pixels; None = the model's default
    width: int | None = None
    frames: int | None = None  # video models only
    attention_backend: str = "native"
    # torch.compile the transformer's repeated blocks (digenrl/models/optimize.py); None = on for a CUDA
    # device, off on CPU (the GPU path the cost files measure, docs/design.md §5)
    compile: bool | None = None
    # 16-bit autocast over the transformer: LoRA matmuls in bf16 (FlowModel.set_autocast); None = on for a
    # CUDA device when model.dtype is 16-bit
    autocast: bool | None = None

    def optimised(self, device_type: str) -> tuple[bool, bool]:
        """(compile, autocast) a run on ``device_type`` (``cuda`` / ``cpu``) executes: the keys as set, else
        the GPU path (compiled + autocast) on CUDA and the eager path elsewhere."""
        gpu = device_type == "cuda"
        compile_ = gpu if self.compile is None else self.compile
        autocast = (gpu and self.dtype in ("bfloat16", "float16")) if self.autocast is None else self.autocast
        return compile_, autocast


@dataclass
class SamplerConfig:
    """The rollout sampler (FlowGRPO flow-SDE by default). ``None`` takes the model's default."""

    num_steps: int | None = None
    sde_type: str = "sde"  # sde | cps | dance
    noise_level: float | None = None  # a in sigma_t = a*sqrt(sigma/(1-sigma)); eta for dance
    guidance_scale: float | None = None  # CFG scale; <= 1 disables CFG for true-CFG models
    shift: float | None = None  # static sigma shift; None = model default (dynamic for FLUX)
    samples_per_forward: int = 0  # max samples in one transformer forward; 0 = a whole rollout batch


@dataclass
class AlgoConfig:
    """FlowGRPO hyper-parameters (defaults: FlowGRPO reference configs, docs/algorithm.md)."""

    group_size: int = 4  # G samples per prompt
    prompts_per_iteration: int = 4  # P prompts per logical batch (B = P * G)
    timestep_fraction: float = 0.99
    timestep_selection: str = "first"  # first | shuffled | fast-window
    fast_window: int = 2
    clip_range: float = 1e-4
    kl_beta: float = 0.0
    adv_std: str = "group"  # group | global
    adv_clamp: float = 5.0
    num_updates_per_batch: int = 1
    # with CFG, the training gradient flows through: cond = the conditional branch only (unconditional
    # prediction detached), both = both branches; see digenrl/rollout/sampler.py Sampler.velocity
    cfg_grad: str = "cond"


#: ZeRO stages of trainer.backend=deepspeed (3 partitions parameters too; docs/design.md §3)
DEEPSPEED_STAGES = (0, 1, 2, 3)
CHECKPOINT_FORMATS = ("auto", "full", "sharded")


@dataclass
class TrainerConfig:
    """How the policy is updated."""

    mode: str = "lora"  # lora | full
    lora_rank: int = 32
    lora_alpha: int = 64
    lora_targets: list[str] | None = None  # None = the family's attention projections
    lr: float = 3e-4
    weight_decay: float = 1e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    grad_clip: float = 1.0
    micro_batch_size: int = 4  # training units per forward/backward
    backend: str = "auto"  # auto | none | ddp | fsdp2 | deepspeed
    deepspeed_stage: int = 2  # ZeRO stage, one of DEEPSPEED_STAGES
    activation_checkpointing: bool = False
    # a step whose gradient or resulting parameters are not finite is never committed; "stop" raises naming
    # the iteration, "skip" drops the step (weights and optimizer state stay, counted in the metrics)
    nonfinite: str = "stop"
    # checkpoint layout, one of CHECKPOINT_FORMATS: "sharded" = every trainer rank writes its own shards of
    # weights and optimizer state (torch.distributed.checkpoint); "full" = one rank writes full tensors;
    # "auto" = sharded for FSDP2 full fine-tuning, full otherwise (README "Runs")
    checkpoint_format: str = "auto"


@dataclass
class RewardConfig:
    """The reward (a key of the reward registry) or a weighted sum of several."""

    name: str = "brightness"
    weights: dict[str, float] | None = None  # {reward name: weight}; overrides ``name`` when set
    weights_path: str | None = None  # local directory of a reward model's weights
    nonfinite_policy: str = "drop-group"  # drop-group | abort


@dataclass
class DataConfig:
    """Prompt source: ``builtin`` (a small fixed list shipped with the package) or a text file."""

    prompts: str = "builtin"


@dataclass
class PoolConfig:
    """How many ranks each pool gets. All zero = colocated (every rank generates and trains).

    Separate layouts give ranks ``[0, trainers)`` to the trainer pool (rank 0 writes metrics and
    checkpoints), the next ``generators`` ranks to the generator pool, then ``scorers``.
    """

    trainers: int = 0
    generators: int = 0
    # ranks that only decode and run the reward model (a reward with weights), fed by the generators'
    # last stage (digenrl/rollout/remote_scoring.py); separate-sync, separate-async and digenrl
    scorers: int = 0


@dataclass
class SyncConfig:
    """Trainer → generator weight sync after each optimizer step."""

    mode: str = "auto"  # auto (lora adapter when trainer.mode=lora, else full) | full | lora
    bucket_mb: float = 64.0  # flat-buffer size per broadcast
    verify_checksum: bool = True  # compare generator and trainer weight checksums after every sync


@dataclass
class AsyncConfig:
    """UniRL-style asynchronous buffer of ``separate-async`` (docs/references.md [000])."""

    max_inflight: int = 1  # generations in flight; the reference measured that only 1 avoids transfer stalls
    max_staleness: int = 0  # policy versions a buffered group may lag the trainer; 0 = on-policy


@dataclass
class GapConfig:
    """GAP: stream fragments of whole prompt groups to the trainer (system ``digenrl``,
    docs/design.md §3 "GAP")."""

    enabled: bool = True  # false: the trainer waits for every fragment before training (ablation)
    fragment_groups: int = 1  # prompt groups per fragment; a group never straddles fragments
    # who generates fragment f: "dynamic" = the first free producer claims the next fragment (atomic
    # tickets on the c10d store; TAG helpers claim from the tail); "round-robin" = pipeline f mod D
    assignment: str = "dynamic"
    # the order a trainer takes fragments in: "index" (0, 1, 2, …: a fixed accumulation order, so a run
    # is bit-reproducible) or "arrival" (the lowest-numbered fragment that is ready first)
    train_order: str = "index"


@dataclass
class TspConfig:
    """TSP: the generator pool as D data-parallel pipelines × ``stages`` stages of denoising steps."""

    stages: int = 1  # S; 1 = plain data parallelism
    # fixed stage boundaries [0, b_1, …, T] for every pipeline (e.g. an even split for an ablation);
    # None = balanced by the predicted step costs (digenrl/tsp/stage_plan.py)
    boundaries: list[int] | None = None


@dataclass
class TagConfig:
    """TAG: a trainer rank with no training unit ready generates fragments itself (docs/design.md §3
    "TAG"). A ready training unit always wins; helper work never commits or disturbs a gradient."""

    enabled: bool = True
    # "auto": before each iteration, predict the makespan from measured costs with and without helper
    # fragments (the simulator, digenrl/sim) and help only as much as the prediction says shortens it;
    # "always": help whenever idle and a fragment is left to claim
    policy: str = "auto"
    # most fragments one trainer rank generates per iteration; 0 = no limit (policy "auto" picks at most this)
    max_fragments: int = 0
    # move pending gradients to host memory while generating (frees device memory; restored bit-exactly)
    park_grads: bool = False


@dataclass
class TcssConfig:
    """TCSS: generators start iteration k+1 with θ_k while the trainer finishes k; θ_{k+1} takes effect at
    a fragment boundary, so every trajectory has one policy version and is at most one version stale
    (docs/design.md §3 "TCSS"). Opt-in: it changes the algorithm."""

    enabled: bool = False
    # which fragments of iteration k+1 use θ_k, fixed by the plan so a run is reproducible: a fragment
    # index s (fragments [0, s) use θ_k, [s, F) θ_{k+1}) or "auto" = F (all of them); "timing": θ_{k+1}
    # applies at whichever fragment boundary follows its arrival (not reproducible).
    # digenrl/async_policy/tcss.py
    switch: str = "auto"


@dataclass
class ResidencyConfig:
    """Colocated layouts: which roles keep their state on the device while idle (docs/references.md
    [001]).

    The rollout shares the trainer's weights in DigenRL's colocated systems, so ``train`` parks the
    optimizer state during generation and scoring; ``reward`` parks a reward model's weights.
    """

    train_resident: bool = True
    reward_resident: bool = True


@dataclass
class RuntimeConfig:
    """Distributed runtime knobs."""

    backend: str | None = None  # gloo | nccl; None = nccl on CUDA, gloo otherwise
    timeout_s: float = 300.0  # every distributed wait fails after this, naming rank and peer
    # a real-size model (not tiny-*) on a CPU device is refused at startup with its memory estimate unless
    # this is true (digenrl/validation.py validate_devices)
    allow_large_cpu_model: bool = False


@dataclass
class Config:
    """One experiment."""

    system: str = "colocated-sync"
    profile: str = "cpu-1"
    iterations: int = 10
    seed: int = 0
    out_dir: str = "runs/tiny"
    checkpoint_every: int = 10  # iterations between checkpoints (and always one at the end); 0 = end only
    checkpoint_keep: int = 2  # newest complete checkpoints kept; older ones go once a new one is published
    resume: bool = False  # continue the run in out_dir from its latest checkpoint (README: "Runs")
    overwrite: bool = False  # a fresh run into an out_dir that holds a run deletes that run's files first
    model: ModelConfig = field(default_factory=ModelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    data: DataConfig = field(default_factory=DataConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    pools: PoolConfig = field(default_factory=PoolConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    asynchrony: AsyncConfig = field(default_factory=AsyncConfig)
    residency: ResidencyConfig = field(default_factory=ResidencyConfig)
    gap: GapConfig = field(default_factory=GapConfig)
    tsp: TspConfig = field(default_factory=TspConfig)
    tag: TagConfig = field(default_factory=TagConfig)
    tcss: TcssConfig = field(default_factory=TcssConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- parsing


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check/convert ``value`` to the annotated type ``tp``; errors name ``key``."""
    inner, optional = _unwrap_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{key} may not be null")
    origin = typing.get_origin(inner)
    if inner is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    if inner is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if inner is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key} must be a number, got {value!r}")
    if inner is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key} must be a string, got {value!r}")
    if origin is list:
        (item_tp,) = typing.get_args(inner)
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return [_coerce(f"{key}[{i}]", v, item_tp) for i, v in enumerate(value)]
    if origin is dict:
        key_tp, val_tp = typing.get_args(inner)
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {value!r}")
        return {_coerce(f"{key} key", k, key_tp): _coerce(f"{key}.{k}", v, val_tp) for k, v in value.items()}
    raise ConfigError(f"{key}: unsupported type {inner!r}")  # pragma: no cover - programming error


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _set(obj: Any, path: list[str], value: Any, full_key: str) -> list[str]:
    """Set ``path`` below ``obj``; returns the dotted leaf keys it set (a mapping value sets several)."""
    types_ = _field_types(type(obj))
    name = path[0]
    if name not in types_:
        prefix = full_key[: len(full_key) - len(".".join(path))]
        allowed = ", ".join(prefix + n for n in types_)
        raise ConfigError(f"unknown config key {full_key!r}; allowed keys here: {allowed}")
    current = getattr(obj, name)
    if dataclasses.is_dataclass(current):
        if len(path) == 1:
            if isinstance(value, dict):
                nested = [_set(current, [str(k)], v, f"{full_key}.{k}") for k, v in value.items()]
                return [key for keys in nested for key in keys]
            if "name" in _field_types(type(current)):
                # ``model=tiny-flux`` is shorthand for ``model.name=tiny-flux``.
                return _set(current, ["name"], value, f"{full_key}.name")
            if "enabled" in _field_types(type(current)) and isinstance(value, bool):
                # ``gap=false`` is shorthand for ``gap.enabled=false``.
                return _set(current, ["enabled"], value, f"{full_key}.enabled")
            raise ConfigError(f"{full_key} is a section; set its keys as {full_key}.<key>=value")
        return _set(current, path[1:], value, full_key)
    if len(path) > 1:
        raise ConfigError(
            f"{'.'.join(full_key.split('.')[: -len(path) + 1])} is not a section (in {full_key!r})"
        )
    setattr(obj, name, _coerce(full_key, value, types_[name]))
    return [full_key]


def _record(cfg: Config, keys: list[str], source: str) -> None:
    """Remember that ``keys`` were set by the user, and where (for :func:`explicit_keys`)."""
    explicit = cfg.__dict__.setdefault("_explicit", {})
    for key in keys:
        explicit[key] = source


def explicit_keys(cfg: Config) -> dict[str, str]:
    """The dotted keys the user set, each with where it was set (a YAML path or "the command line").

    Defaults are not listed: a system may ignore a section at its defaults, but a knob somebody set and
    the system does not honour is an error (:mod:`digenrl.validation`). A Config built in code has none.
    """
    return dict(cfg.__dict__.get("_explicit", {}))


ALIASES = {"tsp_stages": "tsp.stages"}
"""Top-level spellings of nested keys, as the mechanisms are usually written (``tsp_stages=2``)."""


def parse_override(text: str) -> tuple[str, Any]:
    """``"algo.group_size=8"`` → ``("algo.group_size", 8)``; values are parsed as YAML scalars."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key=value")
    key, raw = text.split("=", 1)
    key = ALIASES.get(key.strip(), key.strip())
    if not key:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"cannot parse the value of {key}: {raw!r} ({exc})") from exc
    if key.split(".")[-1] in _STRING_KEYS and value is not None and not isinstance(value, str):
        value = raw  # names like ``profile=1`` or ``out_dir=2024`` stay strings
    return key, value


_STRING_KEYS = {"name", "system", "profile", "out_dir", "pretrained_path", "weights_path", "prompts"}


def apply_overrides(
    cfg: Config, overrides: dict[str, Any] | list[str], *, source: str = "the command line"
) -> Config:
    items = [parse_override(o) for o in overrides] if isinstance(overrides, list) else list(overrides.items())
    for key, value in items:
        _record(cfg, _set(cfg, key.split("."), value, key), source)
    return cfg


def load_config(
    path: str | Path | None = None, overrides: list[str] | dict[str, Any] | None = None
) -> Config:
    """Build a :class:`Config` from a YAML file (optional) and overrides; does not validate names
    (:func:`digenrl.validation.validate_config` does)."""
    cfg = Config()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ConfigError(f"config file {where}: not valid YAML ({problem})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping at top level")
        for key, value in data.items():
            _record(cfg, _set(cfg, [str(key)], value, str(key)), str(path))
    if overrides:
        apply_overrides(cfg, overrides)
    return cfg


def save_config(cfg: Config, path: str | Path, *, run_id: str | None = None) -> None:
    """Write ``cfg`` as YAML (atomically: a crash leaves the old file or the new one). ``run_id`` goes into
    a leading comment, so the file still loads as a config (``--config out_dir/config.yaml``)."""
    path = Path(path)
    header = f"# run_id: {run_id}\n" if run_id else ""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(header + yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    tmp.replace(path)


# --------------------------------------------------------------------------- run identity

RESUMABLE_KEYS = (
    "iterations",
    "resume",
    "overwrite",
    "out_dir",
    "checkpoint_every",
    "checkpoint_keep",
    "trainer.checkpoint_format",
    "runtime.timeout_s",
)
"""Keys a resumed run may set differently from the checkpoint it continues (README, "Runs"): how long the
run goes on, where, how often and in which format it saves (the loader reads the format from the
checkpoint), how long a wait may take. Everything else defines what the run computes (the system, the
model, the algorithm, the layout), so a resume that changes it is refused instead of mixing two runs'
data in one out_dir."""


def dotted_items(tree: dict[str, Any]) -> dict[str, Any]:
    """A ``Config.to_dict()`` as the dotted keys a user types: ``{"trainer": {"lr": 1}}`` →
    ``{"trainer.lr": 1}`` (mapping-valued fields such as ``reward.weights`` stay one value)."""
    sections = {name for name, tp in _field_types(Config).items() if dataclasses.is_dataclass(tp)}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if key in sections and isinstance(value, dict):
            out.update({f"{key}.{sub}": item for sub, item in value.items()})
        else:
            out[key] = value
    return out


class _Absent:
    """A key one of two configs does not have (written by another version of the package)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Absent)

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "(absent)"


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Every key outside :data:`RESUMABLE_KEYS` whose value differs between two ``Config.to_dict()``s,
    as ``"key: <saved> in the checkpoint, <current> now"`` lines (empty: the run may resume)."""
    old, new = dotted_items(saved), dotted_items(current)
    absent = _Absent()
    return [
        f"{key}: {old.get(key, absent)!r} in the checkpoint, {new.get(key, absent)!r} now"
        for key in sorted(old.keys() | new.keys())
        if key not in RESUMABLE_KEYS and old.get(key, absent) != new.get(key, absent)
    ]
