"""Typed experiment configuration: dataclasses, YAML + ``key=value`` overrides, validation.

A run is described by one :class:`Config`. ``load_config(path, overrides)`` reads a YAML file and
applies command-line overrides written exactly as a user types them::

    system=colocated-sync profile=cpu-2 model=tiny-sd3 reward=brightness iterations=20 seed=3
    algo.group_size=8 trainer.lr=1e-3 sampler.num_steps=6

A bare section name (``model=…``, ``reward=…``) sets that section's ``name``. Every key is checked
against the dataclass fields and every name against its registry *at startup*, so a typo fails
with a message naming the key and the allowed values instead of deep inside torch.
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
    compile: bool = False  # torch.compile the transformer's repeated blocks (digenrl/models/optimize.py)
    autocast: bool = (
        False  # 16-bit autocast over the transformer: LoRA matmuls in bf16 (FlowModel.set_autocast)
    )


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
    """FlowGRPO hyper-parameters (defaults: FlowGRPO reference configs, see ALGORITHM.md)."""

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
    deepspeed_stage: int = 2
    activation_checkpointing: bool = False


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
    scorers: int = 0  # ranks that only run a heavy reward model (needs a reward with weights)


@dataclass
class SyncConfig:
    """Trainer → generator weight sync after each optimizer step."""

    mode: str = "auto"  # auto (lora adapter when trainer.mode=lora, else full) | full | lora
    bucket_mb: float = 64.0  # flat-buffer size per broadcast
    verify_checksum: bool = True  # compare generator and trainer weight checksums after every sync


@dataclass
class AsyncConfig:
    """UniRL-style asynchronous buffer of ``separate-async`` (references/000)."""

    max_inflight: int = 1  # generations in flight; the reference measured that only 1 avoids transfer stalls
    max_staleness: int = 0  # policy versions a buffered group may lag the trainer; 0 = on-policy


@dataclass
class GapConfig:
    """GAP: stream fragments of whole prompt groups to the trainer (system ``digenrl``)."""

    enabled: bool = True
    fragment_groups: int = 1  # prompt groups per fragment; a group never straddles fragments


@dataclass
class TspConfig:
    """TSP: the generator pool as D data-parallel pipelines × ``stages`` stages of denoising steps."""

    stages: int = 1  # S; 1 = plain data parallelism


@dataclass
class TagConfig:
    """TAG: trainer GPUs generate fragments while they have nothing to train (not built yet)."""

    enabled: bool = False


@dataclass
class TcssConfig:
    """TCSS: generators start iteration k+1 with θ_k; at most one version stale (not built yet)."""

    enabled: bool = False


@dataclass
class ResidencyConfig:
    """Colocated layouts: which roles keep their state on the device while idle (references/001).

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


@dataclass
class Config:
    """One experiment."""

    system: str = "colocated-sync"
    profile: str = "cpu-1"
    iterations: int = 10
    seed: int = 0
    out_dir: str = "runs/tiny"
    checkpoint_every: int = 0  # iterations between checkpoints; 0 = only at the end
    resume: bool = False  # continue from the latest checkpoint in out_dir
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


def _set(obj: Any, path: list[str], value: Any, full_key: str) -> None:
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
                for k, v in value.items():
                    _set(current, [str(k)], v, f"{full_key}.{k}")
                return
            if "name" in _field_types(type(current)):
                # ``model=tiny-flux`` is shorthand for ``model.name=tiny-flux``.
                _set(current, ["name"], value, f"{full_key}.name")
                return
            if "enabled" in _field_types(type(current)) and isinstance(value, bool):
                # ``gap=false`` is shorthand for ``gap.enabled=false``.
                _set(current, ["enabled"], value, f"{full_key}.enabled")
                return
            raise ConfigError(f"{full_key} is a section; set its keys as {full_key}.<key>=value")
        _set(current, path[1:], value, full_key)
        return
    if len(path) > 1:
        raise ConfigError(
            f"{'.'.join(full_key.split('.')[: -len(path) + 1])} is not a section (in {full_key!r})"
        )
    setattr(obj, name, _coerce(full_key, value, types_[name]))


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


def apply_overrides(cfg: Config, overrides: dict[str, Any] | list[str]) -> Config:
    items = [parse_override(o) for o in overrides] if isinstance(overrides, list) else list(overrides.items())
    for key, value in items:
        _set(cfg, key.split("."), value, key)
    return cfg


def load_config(
    path: str | Path | None = None, overrides: list[str] | dict[str, Any] | None = None
) -> Config:
    """Build a :class:`Config` from a YAML file (optional) and overrides; does not validate names."""
    cfg = Config()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping at top level")
        for key, value in data.items():
            _set(cfg, [str(key)], value, str(key))
    if overrides:
        apply_overrides(cfg, overrides)
    return cfg


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


# --------------------------------------------------------------------------- validation


def _one_of(key: str, value: str, allowed: list[str] | tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(allowed)}")


def _positive(key: str, value: float | int | None) -> None:
    if value is not None and value <= 0:
        raise ConfigError(f"{key} must be > 0, got {value}")


def validate_config(cfg: Config, world_size: int | None = None) -> None:
    """Check every value that can be checked before any process group or model exists.

    Registries are imported here (not at module import) so that ``config`` stays a leaf module.
    """
    from digenrl.models.specs import MODEL_SPECS
    from digenrl.rewards.registry import available_rewards
    from digenrl.runtime.profiles import available_profiles, load_profile
    from digenrl.systems import available_systems

    _one_of("system", cfg.system, available_systems())
    _one_of("profile", cfg.profile, available_profiles()) if not cfg.profile.endswith(".yaml") else None
    _one_of("model.name", cfg.model.name, sorted(MODEL_SPECS))
    _one_of("model.dtype", cfg.model.dtype, ("float32", "bfloat16", "float16"))
    if cfg.model.autocast and cfg.model.dtype == "float32":
        raise ConfigError(
            "model.autocast=true needs model.dtype=bfloat16 or float16 (autocast runs the transformer in "
            "its 16-bit dtype); got model.dtype=float32"
        )
    rewards = available_rewards()
    if cfg.reward.weights:
        for name in cfg.reward.weights:
            _one_of("reward.weights key", name, rewards)
    else:
        _one_of("reward.name", cfg.reward.name, rewards)
    _one_of("reward.nonfinite_policy", cfg.reward.nonfinite_policy, ("drop-group", "abort"))
    _one_of("sampler.sde_type", cfg.sampler.sde_type, ("sde", "cps", "dance"))
    _one_of("algo.timestep_selection", cfg.algo.timestep_selection, ("first", "shuffled", "fast-window"))
    _one_of("algo.adv_std", cfg.algo.adv_std, ("group", "global"))
    _one_of("algo.cfg_grad", cfg.algo.cfg_grad, ("cond", "both"))
    _one_of("trainer.mode", cfg.trainer.mode, ("lora", "full"))
    _one_of("trainer.backend", cfg.trainer.backend, ("auto", "none", "ddp", "fsdp2", "deepspeed"))
    if cfg.runtime.backend is not None:
        _one_of("runtime.backend", cfg.runtime.backend, ("gloo", "nccl"))

    if cfg.iterations < 1:
        raise ConfigError(f"iterations must be >= 1, got {cfg.iterations}")
    if cfg.algo.group_size < 2:
        raise ConfigError(
            f"algo.group_size must be >= 2 (advantages need a group), got {cfg.algo.group_size}"
        )
    _positive("algo.prompts_per_iteration", cfg.algo.prompts_per_iteration)
    if not 0.0 < cfg.algo.timestep_fraction <= 1.0:
        raise ConfigError(f"algo.timestep_fraction must be in (0, 1], got {cfg.algo.timestep_fraction}")
    _positive("algo.clip_range", cfg.algo.clip_range)
    _positive("algo.adv_clamp", cfg.algo.adv_clamp)
    _positive("algo.num_updates_per_batch", cfg.algo.num_updates_per_batch)
    _positive("algo.fast_window", cfg.algo.fast_window)
    if cfg.algo.kl_beta < 0:
        raise ConfigError(f"algo.kl_beta must be >= 0, got {cfg.algo.kl_beta}")
    if cfg.algo.kl_beta > 0 and cfg.trainer.mode != "lora":
        raise ConfigError(
            "algo.kl_beta > 0 needs trainer.mode=lora (the reference is the adapter-disabled model)"
        )
    _positive("sampler.num_steps", cfg.sampler.num_steps)
    if cfg.sampler.num_steps is not None and cfg.sampler.num_steps < 2:
        raise ConfigError(f"sampler.num_steps must be >= 2, got {cfg.sampler.num_steps}")
    if cfg.sampler.noise_level is not None and cfg.sampler.noise_level < 0:
        raise ConfigError(f"sampler.noise_level must be >= 0, got {cfg.sampler.noise_level}")
    if cfg.sampler.samples_per_forward < 0:
        raise ConfigError(f"sampler.samples_per_forward must be >= 0, got {cfg.sampler.samples_per_forward}")
    _positive("trainer.lr", cfg.trainer.lr)
    _positive("trainer.micro_batch_size", cfg.trainer.micro_batch_size)
    _positive("trainer.lora_rank", cfg.trainer.lora_rank)
    _positive("trainer.grad_clip", cfg.trainer.grad_clip)
    if len(cfg.trainer.betas) != 2 or not all(0 <= b < 1 for b in cfg.trainer.betas):
        raise ConfigError(f"trainer.betas must be two numbers in [0, 1), got {cfg.trainer.betas}")
    _positive("runtime.timeout_s", cfg.runtime.timeout_s)
    _positive("gap.fragment_groups", cfg.gap.fragment_groups)
    _positive("tsp.stages", cfg.tsp.stages)
    if cfg.checkpoint_every < 0:
        raise ConfigError(f"checkpoint_every must be >= 0, got {cfg.checkpoint_every}")
    for key in ("height", "width", "frames"):
        _positive(f"model.{key}", getattr(cfg.model, key))

    profile = load_profile(cfg.profile)
    if world_size is not None and world_size > profile.world_size:
        raise ConfigError(
            f"{world_size} ranks were launched but profile={cfg.profile!r} has only {profile.world_size} "
            f"devices; launch at most {profile.world_size} or choose a larger profile"
        )
    if world_size is not None:
        from digenrl.systems import system_requirements

        system_requirements(cfg.system).check(cfg, world_size)
