"""Start-up validation of a :class:`~digenrl.config.Config`: every value that can be checked before any
process group or model exists, with a :class:`~digenrl.config.ConfigError` naming the key.

Four kinds of checks:

* values: names against their registries (models, rewards, profiles, systems, attention backends),
  numbers against their ranges (finite, positive, …);
* consistency between keys and with the model spec (``model.autocast`` needs a 16-bit dtype,
  ``model.height`` a multiple of the latent factor, ``trainer.lora_targets`` must match modules of the
  model — checked on a ``meta``-device transformer, no weights allocated);
* files: ``data.prompts``, ``model.pretrained_path`` and ``out_dir`` exist / are writable;
* the system's own contract. Each system declares the knobs it honours (``System.knobs``: the
  system-specific sections and keys it reads) and its own start-up checks (``System.check``). A key of a
  system-specific section that the user set and the chosen system does not honour is rejected, naming
  the key, where it was set and the systems that do honour it — a silently ignored ``tag=true`` on a
  baseline would make an ablation table lie.

:func:`validate_devices` adds what depends on the machine and the launch (``runtime.backend=nccl`` needs
GPUs and torchrun; a real-size model on a CPU needs ``runtime.allow_large_cpu_model=true``). Everything
here runs before any process group or model exists, so a bad run fails in seconds, not after the model
is built.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from digenrl.config import CHECKPOINT_FORMATS, DEEPSPEED_STAGES, Config, ConfigError, explicit_keys

#: Sections (and keys) that only some systems read; everything else is shared by every system.
SYSTEM_SPECIFIC = ("pools", "sync", "asynchrony", "residency", "gap", "tsp", "tag", "tcss")

_DTYPE_NAMES = ("float32", "bfloat16", "float16")
_FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max


def one_of(key: str, value: str, allowed: list[str] | tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(allowed)}")


def positive(key: str, value: float | int | None) -> None:
    """``value`` is None or a finite number > 0."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{key} must be a finite number > 0, got {value}")


def non_negative(key: str, value: float | int) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"{key} must be a finite number >= 0, got {value}")


def honours(knobs: tuple[str, ...], key: str) -> bool:
    """Whether a system declaring ``knobs`` (sections like "gap", keys like "pools.trainers") reads a key."""
    return any(key == knob or key.startswith(knob + ".") for knob in knobs)


def check_knobs(cfg: Config) -> None:
    """Reject every user-set key of a system-specific section that ``cfg.system`` does not honour."""
    from digenrl.systems import available_systems, get_system

    knobs = get_system(cfg.system).knobs
    for key, source in sorted(explicit_keys(cfg).items()):
        if key.split(".")[0] not in SYSTEM_SPECIFIC or honours(knobs, key):
            continue
        users = [name for name in available_systems() if honours(get_system(name).knobs, key)]
        value = _lookup(cfg, key)
        hint = f"systems that use it: {', '.join(users)}" if users else "no system uses it yet"
        raise ConfigError(
            f"{key}={_yaml_value(value)} (set in {source}) is not used by system={cfg.system!r}; remove it "
            f"or choose a system that honours it ({hint})"
        )


def _lookup(cfg: Config, key: str) -> object:
    value: object = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


def _yaml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def validate_config(cfg: Config, world_size: int | None = None) -> None:
    """Check every value that can be checked before any process group or model exists.

    ``world_size`` (the launched ranks) enables the checks that depend on it: the profile must have that
    many devices, and the system's own checks (pool split, divisibility, mechanism settings).
    """
    from digenrl.models.specs import MODEL_SPECS
    from digenrl.rewards.registry import available_rewards
    from digenrl.runtime.profiles import available_profiles, load_profile
    from digenrl.systems import available_systems, get_system

    one_of("system", cfg.system, available_systems())
    if not cfg.profile.endswith(".yaml"):
        one_of("profile", cfg.profile, available_profiles())
    one_of("model.name", cfg.model.name, sorted(MODEL_SPECS))
    one_of("model.dtype", cfg.model.dtype, _DTYPE_NAMES)
    if cfg.model.autocast and cfg.model.dtype == "float32":
        raise ConfigError(
            "model.autocast=true needs model.dtype=bfloat16 or float16 (autocast runs the transformer in "
            "its 16-bit dtype); got model.dtype=float32"
        )
    rewards = available_rewards()
    if cfg.reward.weights:
        for name in cfg.reward.weights:
            one_of("reward.weights key", name, rewards)
    else:
        one_of("reward.name", cfg.reward.name, rewards)
    one_of("reward.nonfinite_policy", cfg.reward.nonfinite_policy, ("drop-group", "abort"))
    one_of("sampler.sde_type", cfg.sampler.sde_type, ("sde", "cps", "dance"))
    one_of("algo.timestep_selection", cfg.algo.timestep_selection, ("first", "shuffled", "fast-window"))
    one_of("algo.adv_std", cfg.algo.adv_std, ("group", "global"))
    one_of("algo.cfg_grad", cfg.algo.cfg_grad, ("cond", "both"))
    one_of("trainer.mode", cfg.trainer.mode, ("lora", "full"))
    one_of("trainer.backend", cfg.trainer.backend, ("auto", "none", "ddp", "fsdp2", "deepspeed"))
    one_of("trainer.nonfinite", cfg.trainer.nonfinite, ("stop", "skip"))
    if cfg.trainer.nonfinite == "skip" and cfg.trainer.backend == "deepspeed":
        raise ConfigError(
            "trainer.nonfinite=skip cannot restore the optimizer state DeepSpeed owns; use "
            "trainer.nonfinite=stop with trainer.backend=deepspeed (or another backend)"
        )
    if cfg.trainer.deepspeed_stage not in DEEPSPEED_STAGES:
        raise ConfigError(
            f"trainer.deepspeed_stage={cfg.trainer.deepspeed_stage} is not supported; choose one of "
            f"{', '.join(map(str, DEEPSPEED_STAGES))} (ZeRO stages)"
        )
    if "trainer.deepspeed_stage" in explicit_keys(cfg) and cfg.trainer.backend != "deepspeed":
        raise ConfigError(
            f"trainer.deepspeed_stage is set but trainer.backend={cfg.trainer.backend!r}; it only applies "
            "to trainer.backend=deepspeed"
        )
    check_checkpoint_format(cfg)
    if cfg.runtime.backend is not None:
        one_of("runtime.backend", cfg.runtime.backend, ("gloo", "nccl"))
    one_of("gap.assignment", cfg.gap.assignment, ("dynamic", "round-robin"))
    one_of("gap.train_order", cfg.gap.train_order, ("index", "arrival"))
    one_of("tag.policy", cfg.tag.policy, ("auto", "always"))

    if cfg.iterations < 1:
        raise ConfigError(f"iterations must be >= 1, got {cfg.iterations}")
    if cfg.algo.group_size < 2:
        raise ConfigError(
            f"algo.group_size must be >= 2 (advantages need a group), got {cfg.algo.group_size}"
        )
    positive("algo.prompts_per_iteration", cfg.algo.prompts_per_iteration)
    if not 0.0 < cfg.algo.timestep_fraction <= 1.0:
        raise ConfigError(f"algo.timestep_fraction must be in (0, 1], got {cfg.algo.timestep_fraction}")
    positive("algo.clip_range", cfg.algo.clip_range)
    positive("algo.adv_clamp", cfg.algo.adv_clamp)
    positive("algo.num_updates_per_batch", cfg.algo.num_updates_per_batch)
    positive("algo.fast_window", cfg.algo.fast_window)
    non_negative("algo.kl_beta", cfg.algo.kl_beta)
    if cfg.algo.kl_beta > 0 and cfg.trainer.mode != "lora":
        raise ConfigError(
            "algo.kl_beta > 0 needs trainer.mode=lora (the reference is the adapter-disabled model)"
        )
    positive("sampler.num_steps", cfg.sampler.num_steps)
    if cfg.sampler.num_steps is not None and cfg.sampler.num_steps < 2:
        raise ConfigError(f"sampler.num_steps must be >= 2, got {cfg.sampler.num_steps}")
    if cfg.sampler.noise_level is not None:
        non_negative("sampler.noise_level", cfg.sampler.noise_level)
    if cfg.sampler.samples_per_forward < 0:
        raise ConfigError(f"sampler.samples_per_forward must be >= 0, got {cfg.sampler.samples_per_forward}")
    positive("trainer.lr", cfg.trainer.lr)
    non_negative("trainer.weight_decay", cfg.trainer.weight_decay)
    positive("trainer.eps", cfg.trainer.eps)
    positive("trainer.micro_batch_size", cfg.trainer.micro_batch_size)
    positive("trainer.lora_rank", cfg.trainer.lora_rank)
    positive("trainer.lora_alpha", cfg.trainer.lora_alpha)
    positive("trainer.grad_clip", cfg.trainer.grad_clip)
    if len(cfg.trainer.betas) != 2 or not all(0 <= b < 1 for b in cfg.trainer.betas):
        raise ConfigError(f"trainer.betas must be two numbers in [0, 1), got {cfg.trainer.betas}")
    first_step = cfg.trainer.lr / (1 - cfg.trainer.betas[0])  # AdamW's bias-corrected step size
    if first_step > _FLOAT32_MAX:
        raise ConfigError(
            f"trainer.lr={cfg.trainer.lr:g} overflows the optimizer: AdamW's first step size lr / (1 - "
            f"trainer.betas[0]) = {first_step:.3g} exceeds the largest float32 ({_FLOAT32_MAX:.3g})"
        )
    positive("runtime.timeout_s", cfg.runtime.timeout_s)
    positive("gap.fragment_groups", cfg.gap.fragment_groups)
    positive("tsp.stages", cfg.tsp.stages)
    if cfg.tag.max_fragments < 0:
        raise ConfigError(f"tag.max_fragments must be >= 0 (0 = no limit), got {cfg.tag.max_fragments}")
    if cfg.checkpoint_every < 0:
        raise ConfigError(f"checkpoint_every must be >= 0, got {cfg.checkpoint_every}")
    if cfg.checkpoint_keep < 0:
        raise ConfigError(
            f"checkpoint_keep must be >= 0 (0 = keep every checkpoint), got {cfg.checkpoint_keep}"
        )
    if cfg.resume.enabled and cfg.overwrite:
        raise ConfigError(
            "resume=true and overwrite=true contradict each other: resume continues the run in out_dir, "
            "overwrite deletes it; set one of them"
        )
    if cfg.resume.step is not None and (cfg.resume.step < 0 or not cfg.resume.enabled):
        raise ConfigError(
            f"resume.step={cfg.resume.step} names the checkpoint to resume (step_<n>, n >= 0) and needs "
            "resume=true; set both, or neither"
        )
    for key in ("height", "width", "frames"):
        positive(f"model.{key}", getattr(cfg.model, key))
    check_model(cfg)
    check_files(cfg)

    check_knobs(cfg)
    profile = load_profile(cfg.profile)
    if world_size is not None and world_size > profile.world_size:
        raise ConfigError(
            f"{world_size} ranks were launched but profile={cfg.profile!r} has only {profile.world_size} "
            f"devices; launch at most {profile.world_size} or choose a larger profile"
        )
    if world_size is not None:
        get_system(cfg.system).check(cfg, world_size)


def check_checkpoint_format(cfg: Config) -> None:
    """``trainer.checkpoint_format=sharded`` only where the trainer state is sharded FSDP2 state: LoRA
    checkpoints are small and stay full; DDP replicates and DeepSpeed reads full tensors through its own
    accessors (digenrl/trainer/checkpoint.py)."""
    tcfg = cfg.trainer
    one_of("trainer.checkpoint_format", tcfg.checkpoint_format, CHECKPOINT_FORMATS)
    if tcfg.checkpoint_format != "sharded":
        return
    if tcfg.mode != "full":
        raise ConfigError(
            f"trainer.checkpoint_format=sharded needs trainer.mode=full; trainer.mode={tcfg.mode!r} saves "
            "only the adapter, which stays in the full format (use trainer.checkpoint_format=auto or full)"
        )
    if tcfg.backend not in ("auto", "fsdp2"):
        raise ConfigError(
            f"trainer.checkpoint_format=sharded needs trainer.backend=fsdp2 (or auto); trainer.backend="
            f"{tcfg.backend!r} cannot write sharded checkpoints (use trainer.checkpoint_format=auto or full)"
        )


# ------------------------------------------------------------------------------------- model and files


def check_model(cfg: Config) -> None:
    """What the model spec decides: resolution and frames, the attention backend, the pretrained
    directory's layout, and that ``trainer.lora_targets`` name modules of the transformer."""
    from digenrl.models.bundle import check_pretrained_dir
    from digenrl.models.flow_model import latent_shape_for
    from digenrl.models.specs import get_model_spec

    spec = get_model_spec(cfg.model.name)
    height, width = cfg.model.height or spec.default_height, cfg.model.width or spec.default_width
    try:
        latent_shape_for(spec, height, width, cfg.model.frames, key_prefix="model.")
        if cfg.model.pretrained_path is not None:
            check_pretrained_dir(spec, cfg.model.pretrained_path)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.model.attention_backend != "native":  # diffusers' default always exists: skip importing diffusers
        from digenrl.models.flow_model import available_attention_backends

        one_of("model.attention_backend", cfg.model.attention_backend, available_attention_backends())
    targets = cfg.trainer.lora_targets
    if targets is not None:
        if cfg.trainer.mode != "lora":
            raise ConfigError(
                f"trainer.lora_targets is set but trainer.mode={cfg.trainer.mode!r}; it only applies to "
                "trainer.mode=lora"
            )
        if not targets:
            raise ConfigError("trainer.lora_targets must be null (the family default) or a non-empty list")
        from digenrl.models.bundle import meta_transformer
        from digenrl.trainer.lora import check_lora_targets

        try:
            check_lora_targets(meta_transformer(spec, cfg.model.pretrained_path), list(targets), each=True)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def check_files(cfg: Config) -> None:
    """``data.prompts`` gives at least one prompt; ``out_dir`` can be created and written."""
    from digenrl.data.prompts import PromptSource

    try:
        PromptSource.from_config(cfg.data.prompts, cfg.seed)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    check_writable_dir("out_dir", cfg.out_dir)


def check_writable_dir(key: str, directory: str) -> None:
    """``directory`` exists as a writable folder, or its nearest existing ancestor is one (the run creates
    the rest); nothing is created here. An empty value is refused (it would mean the file system root)."""
    if not directory.strip():
        raise ConfigError(f"{key}={directory!r} must name a directory (e.g. {key}=runs/my-run)")
    probe = Path(directory).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        what = "exists and is not a directory" if probe == Path(directory).absolute() else "cannot be created"
        raise ConfigError(f"{key}={directory!r} {what}: {probe} is a file, not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{key}={directory!r} is not writable: no write permission on {probe}; choose a directory you "
            "can write to"
        )


# ------------------------------------------------------------------------------------- devices

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: LoRA adapters train in fp32: weight + gradient + two AdamW states.
_LORA_BYTES_PER_PARAM = 4 * 4
_GIB = 1024**3


def validate_devices(
    cfg: Config, world_size: int, *, distributed: bool, cuda_devices: int | None = None
) -> None:
    """Checks that depend on this machine and on how the run is launched.

    ``distributed``: the run uses a process group (under torchrun, or a plain run that starts its
    workers under torchrun). ``cuda_devices``: the GPUs this process sees (default: torch's count).
    """
    import torch

    from digenrl.runtime.distributed import planned_device_type

    gpus = torch.cuda.device_count() if cuda_devices is None else cuda_devices
    if cfg.runtime.backend == "nccl":
        if not distributed:
            raise ConfigError(
                "runtime.backend=nccl needs a process group, but this is a single process; launch with "
                "torchrun (or more than one rank), or leave runtime.backend unset"
            )
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        if gpus < local:
            raise ConfigError(
                f"runtime.backend=nccl needs one GPU per rank on a node ({local}), this machine has {gpus}; "
                "use runtime.backend=gloo (CPU) or a machine with GPUs"
            )
    from digenrl.runtime.profiles import load_profile

    backend = cfg.runtime.backend or load_profile(cfg.profile).backend  # as digenrl/launch.py starts it
    device = planned_device_type(backend, distributed=distributed, cuda_available=gpus > 0)
    if device == "cpu" and not cfg.model.name.startswith("tiny-") and not cfg.runtime.allow_large_cpu_model:
        where = "runtime.backend=gloo" if distributed and gpus else "no CUDA device"
        raise ConfigError(
            f"model.name={cfg.model.name!r} would run on the CPU ({where}) and needs about "
            f"{_memory_estimate(cfg)}; a real-size model on a CPU takes hours per iteration. Use GPUs, a "
            "tiny-* model, or set runtime.allow_large_cpu_model=true to run it anyway"
        )


def _memory_estimate(cfg: Config) -> str:
    """Memory of one training rank: parameters x dtype bytes, plus gradients and AdamW states."""
    from digenrl.models.bundle import bundle_parameter_counts, meta_transformer
    from digenrl.models.specs import get_model_spec
    from digenrl.trainer.lora import default_lora_targets, lora_parameter_count

    spec = get_model_spec(cfg.model.name)
    counts = bundle_parameter_counts(spec)
    dtype_bytes = _DTYPE_BYTES[cfg.model.dtype]
    weights = sum(counts.values()) * dtype_bytes
    if cfg.trainer.mode == "lora":
        targets = cfg.trainer.lora_targets or default_lora_targets(spec.family)
        adapter = lora_parameter_count(meta_transformer(spec), list(targets), cfg.trainer.lora_rank)
        trainer = adapter * _LORA_BYTES_PER_PARAM
        trained = f"LoRA adapter of {adapter / 1e6:.1f} M parameters in fp32 with gradients and AdamW states"
    else:
        trainer = 3 * counts["transformer"] * dtype_bytes
        trained = "gradients and AdamW states of the transformer"
    parts = ", ".join(f"{name} {n / 1e9:.2f} B" for name, n in counts.items())
    return (
        f"{(weights + trainer) / _GIB:.1f} GiB per training rank: weights {weights / _GIB:.1f} GiB ({parts} "
        f"parameters x {dtype_bytes} bytes of model.dtype={cfg.model.dtype}) + trainer {trainer / _GIB:.1f} "
        f"GiB ({trained}), activations not counted"
    )
