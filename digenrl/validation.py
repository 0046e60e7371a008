"""Start-up validation of a :class:`~digenrl.config.Config`: every value that can be checked before any
process group or model exists, with a :class:`~digenrl.config.ConfigError` naming the key.

Five kinds of checks, each driven by one declaration:

* declared values: every numeric key against the finite range its field declares (NaN and ±inf never
  pass), every enumeration key against its allowed values (``within`` / ``among`` in
  :mod:`digenrl.config`; :func:`check_declared`); names against their registries (models, rewards,
  profiles, systems, attention backends);
* consistency between keys and with the model spec (``model.autocast`` needs a 16-bit dtype,
  ``model.height`` a multiple of the latent factor, ``trainer.lora_targets`` must match modules of the
  model — checked on a ``meta``-device transformer, no weights allocated);
* files: the config file, ``profile`` (a file), ``data.prompts`` and ``data.eval_prompts`` (prompt sets
  that parse, give one metadata per prompt text and suit the reward), ``model.pretrained_path``,
  ``reward.weights_path`` exist and are readable text or folders of the right layout; ``out_dir`` is
  writable;
* knobs that are not read. Each system declares the knobs it honours (``System.knobs``: the
  system-specific sections and keys it reads) and its own start-up checks (``System.check``); every other
  knob that is read only in some settings has a row in :data:`KNOB_RULES`. A key the user set that the run
  would not read is rejected, naming the key, where it was set and when it is read — a silently ignored
  ``tag=true`` on a baseline or ``trainer.lora_rank`` on full fine-tuning would make an ablation table
  lie. One exception: a command-line override that switches a mechanism off (``system=``,
  ``trainer.mode=full``, ``tag=false``, …) also switches off what the config file set for it, so a shipped
  config runs as a baseline with one override.

:func:`validate_devices` adds what depends on the machine and the launch (``runtime.backend=nccl`` needs
GPUs and torchrun; a real-size model on a CPU needs ``runtime.allow_large_cpu_model=true``). Everything
here runs before any process group or model exists, so a bad run fails in seconds, not after the model
is built; the declared values and knob rules are checked first and import nothing heavy.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from digenrl.config import (
    COLOCATED_SYSTEMS,
    COMMAND_LINE,
    Config,
    ConfigError,
    Range,
    declared_fields,
    explicit_keys,
)

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from digenrl.models.spec_types import ModelSpec
    from digenrl.plan import RunPlan
    from digenrl.runtime.hardware.profiles import HardwareProfile

#: Sections (and keys) that only some systems read; everything else is shared by every system.
SYSTEM_SPECIFIC = (
    "pools",
    "sync",
    "asynchrony",
    "residency",
    "colocated",
    "engine",
    "gap",
    "tsp",
    "tag",
    "tcss",
)


def one_of(key: str, value: object, allowed: list | tuple) -> None:
    if value not in allowed:
        raise ConfigError(
            f"{key}={value!r} is not allowed; choose one of: {', '.join(str(a) for a in allowed)}"
        )


def check_declared(cfg: Config) -> None:
    """Every key against its field's declaration: a numeric value (each number of a list or mapping) in
    its finite range, an enumeration value among its choices (None = the default's meaning, always)."""
    for key, value, declared in declared_fields(cfg):
        if "choices" in declared and value is not None:
            one_of(key, value, declared["choices"])
        if "range" in declared:
            check_range(key, value, declared["range"])


def check_range(key: str, value: object, limits: Range) -> None:
    if value is None:
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            check_range(f"{key}[{i}]", item, limits)
        return
    if isinstance(value, dict):
        for name, item in value.items():
            check_range(f"{key}.{name}", item, limits)
        return
    assert isinstance(value, int | float), f"{key}: a range is declared for a non-numeric field"
    if value not in limits:
        finite = "" if math.isfinite(value) else ", and it is not a finite number"
        why = f" ({limits.why})" if limits.why else ""
        raise ConfigError(f"{key}={_yaml_value(value)} is outside its allowed range {limits}{why}{finite}")


# ------------------------------------------------------------------------------------- knobs not read


@dataclass(frozen=True)
class KnobRule:
    """``keys`` (dotted keys, or sections meaning each of their keys but ``deciding``) are read only when
    ``reads(cfg)``; ``when`` says so as a user sets it. ``deciding`` are the keys that decide it: their
    values appear in the error, and a command-line override of one of them switches off what the config
    file set for ``keys``. ``now`` overrides how the error shows them."""

    keys: tuple[str, ...]
    when: str
    deciding: tuple[str, ...]
    reads: Callable[[Config], bool]
    now: Callable[[Config], str] | None = None


def _true_cfg(cfg: Config) -> bool:
    """Whether the run guides by a second, unconditional forward (digenrl/rollout/sampler.py)."""
    from digenrl.models.specs import MODEL_SPECS

    spec = MODEL_SPECS.get(cfg.model.name)
    if spec is None:
        return True  # an unknown model: its name is reported, not this
    scale = spec.default_guidance_scale if cfg.sampler.guidance_scale is None else cfg.sampler.guidance_scale
    return spec.uses_true_cfg and scale > 1.0


def _guidance_now(cfg: Config) -> str:
    from digenrl.models.specs import MODEL_SPECS

    spec = MODEL_SPECS[cfg.model.name]
    if not spec.uses_true_cfg:
        return f"model.name={cfg.model.name!r}, which embeds the guidance scale (no CFG pass)"
    scale = spec.default_guidance_scale if cfg.sampler.guidance_scale is None else cfg.sampler.guidance_scale
    return f"sampler.guidance_scale={scale:g} (<= 1: no CFG)"


def _reward_runs_a_model(cfg: Config) -> bool:
    from digenrl.rewards.registry import available_rewards, reward_needs_weights

    names = list(cfg.reward.weights or [cfg.reward.name])
    return any(name not in available_rewards() or reward_needs_weights(name) for name in names)


def _gpu_profile(cfg: Config) -> bool:
    from digenrl.runtime.hardware.profiles import load_profile

    try:
        return load_profile(cfg.profile).backend == "nccl"
    except (ValueError, OSError):
        return True  # an unknown profile: its name is reported, not this


KNOB_RULES: tuple[KnobRule, ...] = (
    KnobRule(
        ("algo.fast_window",),
        "with algo.name=flowgrpo and algo.timestep_selection=fast-window",
        ("algo.name", "algo.timestep_selection"),
        lambda cfg: cfg.algo.name == "flowgrpo" and cfg.algo.timestep_selection == "fast-window",
    ),
    KnobRule(
        ("algo.timestep_selection",),
        "with algo.name=flowgrpo (MixGRPO's window or DiffusionNFT's own draw decide the trained steps)",
        ("algo.name",),
        lambda cfg: cfg.algo.name == "flowgrpo",
    ),
    KnobRule(
        ("algo.timestep_fraction",),
        "with algo.name=flowgrpo or diffusionnft (MixGRPO's window decides the trained steps)",
        ("algo.name",),
        lambda cfg: cfg.algo.name in ("flowgrpo", "diffusionnft"),
    ),
    KnobRule(
        ("algo.clip_range", "algo.ratio_norm", "algo.step_reweight", "algo.num_updates_per_batch"),
        "with a likelihood-ratio algorithm, algo.name=flowgrpo or mixgrpo (DiffusionNFT has no ratio)",
        ("algo.name",),
        lambda cfg: cfg.algo.name in ("flowgrpo", "mixgrpo"),
    ),
    KnobRule(
        ("algo.nft_beta", "algo.nft_ode_solver"),
        "with algo.name=diffusionnft",
        ("algo.name",),
        lambda cfg: cfg.algo.name == "diffusionnft",
    ),
    KnobRule(
        (
            "algo.mix_window",
            "algo.mix_stride",
            "algo.mix_shift_interval",
            "algo.mix_schedule",
            "algo.mix_ode_solver",
        ),
        "with algo.name=mixgrpo",
        ("algo.name",),
        lambda cfg: cfg.algo.name == "mixgrpo",
    ),
    KnobRule(
        ("algo.ratio_norm", "algo.step_reweight"),
        "with sampler.sde_type=sde (GRPO-Guard's formulas are those of the flow-SDE step)",
        ("sampler.sde_type",),
        lambda cfg: cfg.sampler.sde_type == "sde",
    ),
    KnobRule(
        ("algo.mix_stride", "algo.mix_shift_interval"),
        "with algo.mix_schedule=progressive (a random window is drawn anew every iteration)",
        ("algo.mix_schedule",),
        lambda cfg: cfg.algo.mix_schedule == "progressive",
    ),
    KnobRule(
        ("trainer.lora_rank", "trainer.lora_alpha", "trainer.lora_targets", "checkpoint.export_lora"),
        "with trainer.mode=lora",
        ("trainer.mode",),
        lambda cfg: cfg.trainer.mode == "lora",
    ),
    KnobRule(
        ("trainer.sharding",),
        "with trainer.mode=full (FSDP2 shards a full fine-tune; a LoRA adapter is replicated)",
        ("trainer.mode",),
        lambda cfg: cfg.trainer.mode == "full",
    ),
    KnobRule(
        ("trainer.deepspeed_stage",),
        "with trainer.backend=deepspeed",
        ("trainer.backend",),
        lambda cfg: cfg.trainer.backend == "deepspeed",
    ),
    KnobRule(
        ("algo.cfg_grad",),
        "with classifier-free guidance: a model without a guidance embedding and sampler.guidance_scale > 1",
        ("model.name", "sampler.guidance_scale"),
        _true_cfg,
        _guidance_now,
    ),
    KnobRule(
        ("runtime.costs_dir",),
        "with runtime.memory_check=true or runtime.share_device=true (the startup memory checks)",
        ("runtime.memory_check", "runtime.share_device"),
        lambda cfg: cfg.runtime.memory_check or cfg.runtime.share_device,
    ),
    KnobRule(
        ("runtime.share_device",),
        "with a GPU hardware profile (one whose backend is nccl): CPU profiles run every rank on the CPU",
        ("profile",),
        lambda cfg: _gpu_profile(cfg),
    ),
    KnobRule(("tag",), "with tag.enabled=true", ("tag.enabled",), lambda cfg: cfg.tag.enabled),
    KnobRule(("tcss",), "with tcss.enabled=true", ("tcss.enabled",), lambda cfg: cfg.tcss.enabled),
    KnobRule(("resume",), "with resume.enabled=true", ("resume.enabled",), lambda cfg: cfg.resume.enabled),
    # no row for gap: with gap.enabled=false the fragments still exist (the trainer waits for all of them),
    # so gap.fragment_groups, gap.assignment and gap.train_order are still read
    KnobRule(
        ("gap.fragment_groups",),
        "with gap.fragment_samples=0 (a fragment size in samples replaces it)",
        ("gap.fragment_samples",),
        lambda cfg: not cfg.gap.fragment_samples,
    ),
    KnobRule(
        ("reward.name",),
        "without reward.weights, or as one of its rewards (reward.weights replaces reward.name)",
        ("reward.weights",),
        lambda cfg: not cfg.reward.weights or cfg.reward.name in cfg.reward.weights,
    ),
    KnobRule(
        ("reward.url", "reward.timeout_s", "reward.retries", "reward.token_file"),
        "with reward=remote (reward.name or one of reward.weights)",
        ("reward.name", "reward.weights"),
        lambda cfg: "remote" in reward_names(cfg),
    ),
    KnobRule(
        ("reward.weights_path",),
        "with a reward that runs a model (reward.name or one of reward.weights)",
        ("reward.name", "reward.weights"),
        _reward_runs_a_model,
    ),
    KnobRule(
        ("eval",), "with eval.every > 0 (evaluation on)", ("eval.every",), lambda cfg: cfg.eval.every > 0
    ),
    KnobRule(("logger",), "with logger.wandb=true", ("logger.wandb",), lambda cfg: cfg.logger.wandb),
    KnobRule(
        ("runtime.score_stream",),
        "with system=colocated-overlap (its background scorer)",
        ("system",),
        lambda cfg: cfg.system == "colocated-overlap",
    ),
)
"""When each knob that only some settings read is read (one row per mechanism; a new knob read only in
some settings adds a row or joins one; a system-specific section's keys also go through System.knobs)."""


def check_unread_knobs(cfg: Config) -> None:
    """Reject every user-set key that :data:`KNOB_RULES` says this configuration does not read."""
    explicit = explicit_keys(cfg)
    for rule in KNOB_RULES:
        unread = [
            key
            for key in sorted(explicit)
            if honours(rule.keys, key)
            and key not in rule.deciding
            and not _switched_off(explicit, key, rule.deciding)
        ]
        if unread and not rule.reads(cfg):
            key = unread[0]
            now = rule.now(cfg) if rule.now else ", ".join(f"{d}={_shown(cfg, d)}" for d in rule.deciding)
            raise ConfigError(
                f"{key}={_shown(cfg, key)} (set in {explicit[key]}) is not read: it applies only "
                f"{rule.when}, and this run has {now}; remove it or change that"
            )


def check_knobs(cfg: Config) -> None:
    """Reject every user-set key of a system-specific section that ``cfg.system`` does not honour."""
    from digenrl.systems import available_systems, get_system

    knobs = get_system(cfg.system).knobs
    explicit = explicit_keys(cfg)
    for key, source in sorted(explicit.items()):
        if key.split(".")[0] not in SYSTEM_SPECIFIC or honours(knobs, key):
            continue
        if _switched_off(explicit, key, ("system",)):
            continue
        users = [name for name in available_systems() if honours(get_system(name).knobs, key)]
        hint = f"systems that use it: {', '.join(users)}" if users else "no system uses it yet"
        raise ConfigError(
            f"{key}={_shown(cfg, key)} (set in {source}) is not used by system={cfg.system!r}; remove it "
            f"or choose a system that honours it ({hint})"
        )


def honours(knobs: tuple[str, ...], key: str) -> bool:
    """Whether a system declaring ``knobs`` (sections like "gap", keys like "pools.trainers") reads a key."""
    return any(key == knob or key.startswith(knob + ".") for knob in knobs)


def _switched_off(explicit: dict[str, str], key: str, deciding: tuple[str, ...]) -> bool:
    """A knob from the config file whose mechanism a command-line override switched off (module docs)."""
    return explicit[key] != COMMAND_LINE and any(explicit.get(d) == COMMAND_LINE for d in deciding)


def _shown(cfg: Config, key: str) -> str:
    value: object = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return _yaml_value(value)


def _yaml_value(value: object) -> str:
    """A value as a user writes it after ``key=``, except that strings are quoted (as elsewhere here)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return repr(value) if isinstance(value, str) else str(value)


# ------------------------------------------------------------------------------------- the whole config


def validate_config(cfg: Config, world_size: int | None = None) -> None:
    """Check every value that can be checked before any process group or model exists.

    ``world_size`` (the launched ranks) enables the checks that depend on it: the profile must have that
    many devices, and the system's own checks (pool split, divisibility, mechanism settings).
    """
    from digenrl.systems import get_system

    check_declared(cfg)  # the system among config.SYSTEMS, each of which digenrl.systems registers
    profile = hardware_profile(cfg)
    check_unread_knobs(cfg)
    costs = cfg.runtime.costs_dir
    if costs is not None and not Path(costs).is_dir():
        raise ConfigError(
            f"runtime.costs_dir={costs!r} is not an existing directory (from {Path.cwd()}); it names the "
            "folder of the measured cost files (experiments/results/costs from the repository's root), or "
            "null to run without the startup memory checks"
        )

    from digenrl.models.specs import MODEL_SPECS

    one_of("model.name", cfg.model.name, sorted(MODEL_SPECS))
    if cfg.model.autocast and cfg.model.dtype == "float32":
        raise ConfigError(
            "model.autocast=true needs model.dtype=bfloat16 or float16 (autocast runs the transformer in "
            "its 16-bit dtype); got model.dtype=float32"
        )
    check_reward(cfg)
    from digenrl.runtime.comm.weight_sync import resolve_sync_mode

    try:
        resolve_sync_mode(cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.trainer.nonfinite == "skip" and cfg.trainer.backend == "deepspeed":
        raise ConfigError(
            "trainer.nonfinite=skip cannot restore the optimizer state DeepSpeed owns; use "
            "trainer.nonfinite=stop with trainer.backend=deepspeed (or another backend)"
        )
    check_checkpoint_format(cfg)
    if cfg.runtime.profile_iteration is not None and cfg.runtime.profile_iteration >= cfg.iterations:
        raise ConfigError(
            f"runtime.profile_iteration={cfg.runtime.profile_iteration} is never reached: the run has "
            f"iterations={cfg.iterations} (0 to {cfg.iterations - 1}); profile one of those"
        )
    if cfg.trainer.ema_decay > 0 and cfg.trainer.backend == "deepspeed" and cfg.trainer.deepspeed_stage == 3:
        raise ConfigError(
            "trainer.ema_decay > 0 cannot average ZeRO-3's partitioned parameters (DeepSpeed owns their "
            "layout); use trainer.deepspeed_stage <= 2, trainer.backend=fsdp2 (the EMA stays sharded like "
            "the weights) or trainer.ema_decay=0"
        )
    if cfg.algo.kl_beta > 0 and cfg.trainer.mode != "lora":
        raise ConfigError(
            "algo.kl_beta > 0 needs trainer.mode=lora (the reference is the adapter-disabled model)"
        )
    check_sampler(cfg)
    if len(cfg.trainer.betas) != 2:
        raise ConfigError(f"trainer.betas must be two numbers (AdamW's betas), got {cfg.trainer.betas}")
    if cfg.resume.enabled and cfg.overwrite:
        raise ConfigError(
            "resume=true and overwrite=true contradict each other: resume continues the run in out_dir, "
            "overwrite deletes it; set one of them"
        )
    check_model(cfg)
    check_fp8(cfg)
    check_files(cfg)
    check_evaluation(cfg)
    if cfg.runtime.share_device and cfg.runtime.backend == "nccl":
        raise ConfigError(
            "runtime.share_device=true with runtime.backend='nccl': NCCL refuses two ranks on one GPU; "
            "shared-device mode runs its collectives on gloo (leave runtime.backend unset or set it to gloo)"
        )

    check_knobs(cfg)
    check_sequence_parallel(cfg, profile, world_size)
    if world_size is not None and world_size > profile.world_size:
        raise ConfigError(
            f"{world_size} ranks were launched but profile={cfg.profile!r} has only {profile.world_size} "
            f"devices; launch at most {profile.world_size} or choose a larger profile"
        )
    if world_size is not None:
        get_system(cfg.system).check(cfg, launched_plan(cfg, profile, world_size))
        if cfg.system == "colocated-engine" and not cfg.engine.offload:
            from digenrl.planning.shared_device import engine_copies_error

            error = engine_copies_error(cfg, world_size)  # both copies of the policy on every device
            if error:
                raise ConfigError(error)
    if cfg.trainer.sharding == "hybrid":
        check_hybrid_sharding(cfg, profile, world_size)


def launched_plan(cfg: Config, profile: HardwareProfile, world_size: int) -> RunPlan:
    """The plan ``cfg`` runs on ``world_size`` launched ranks of ``profile`` (what its system builds and
    checks, :class:`digenrl.systems.base.System`), or a ConfigError saying why there is none."""
    from digenrl.plan import RunPlan

    try:
        return RunPlan.from_config(cfg, profile, world_size=world_size)
    except ValueError as error:
        raise ConfigError(f"system={cfg.system!r} on {world_size} ranks: {error}") from None


def check_sequence_parallel(cfg: Config, profile: HardwareProfile, world_size: int | None) -> None:
    """``trainer.sequence_parallel`` / ``sampler.sequence_parallel``: a system that runs it
    (:func:`digenrl.plan.sequence_shape.support_problem`), the same degree on ranks that both generate and
    train, no scorer ranks beside sharded generators, a model whose heads, tokens and diffusers plan allow
    it (:func:`digenrl.models.sequence_parallel.sequence_parallel_problem`), and groups of consecutive ranks
    that divide their pool and stay inside one node (the all-to-alls run on the intra-node link)."""
    from digenrl.plan.sequence_shape import group_problem, support_problem

    degrees = {"trainer.sequence_parallel": cfg.trainer.sequence_parallel}
    degrees["sampler.sequence_parallel"] = cfg.sampler.sequence_parallel
    on = {key: n for key, n in degrees.items() if n > 1}
    if not on:
        return
    t, colocated = cfg.trainer, cfg.system in COLOCATED_SYSTEMS
    split = cfg.colocated.split if colocated else "equal"
    for key, degree in on.items():
        problem = support_problem(key, degree, cfg.system, t.mode, t.backend, split)
        if problem:
            raise ConfigError(problem)
    if colocated and len(set(degrees.values())) > 1:
        raise ConfigError(
            f"trainer.sequence_parallel={t.sequence_parallel} and sampler.sequence_parallel="
            f"{cfg.sampler.sequence_parallel} differ, but under system={cfg.system!r} the same ranks "
            "generate and train with one model; set both to the same degree"
        )
    if cfg.pools.scorers:
        key, degree = next(iter(on.items()))
        raise ConfigError(
            f"{key}={degree} with pools.scorers={cfg.pools.scorers}: a scorer rank serves one request per "
            "fragment and per evaluation call, not one per rank of a sequence-parallel group; set "
            f"pools.scorers=0 or {key}=1"
        )
    from digenrl.models.flow_model import token_count_for
    from digenrl.models.sequence_parallel import sequence_parallel_problem
    from digenrl.models.specs import get_model_spec

    spec = get_model_spec(cfg.model.name)
    height, width = cfg.model.height or spec.default_height, cfg.model.width or spec.default_width
    tokens = token_count_for(spec, height, width, cfg.model.frames)
    for key, degree in on.items():
        problem = sequence_parallel_problem(spec, degree, tokens, key)
        if problem:
            raise ConfigError(problem)
    if world_size is None:
        return
    if colocated:
        pools = {"trainer.sequence_parallel": tuple(range(world_size))}
    else:
        from digenrl.systems.separate import separate_layout

        layout = separate_layout(cfg, launched_plan(cfg, profile, world_size))
        pools = {"trainer.sequence_parallel": layout.trainer_ranks}
        pools["sampler.sequence_parallel"] = layout.generator_ranks
    for key, ranks in pools.items():
        problem = group_problem(ranks, degrees[key], profile.node_of, key)
        if problem:
            raise ConfigError(f"{problem} (profile={cfg.profile!r})")


def check_hybrid_sharding(cfg: Config, profile: HardwareProfile, world_size: int | None) -> None:
    """``trainer.sharding=hybrid``: FSDP2 (``trainer.backend`` fsdp2 or auto) on trainer ranks that span two
    or more nodes of the profile with the same count on each (one rule:
    :func:`digenrl.rules.schedule.hybrid_sharding_problem`, which the planner checks too)."""
    from digenrl.rules.schedule import hybrid_sharding_problem

    ranks = launched_plan(cfg, profile, world_size).trainer_ranks() if world_size is not None else ()
    problem = hybrid_sharding_problem(
        ranks,
        profile.node_of if world_size is not None else None,
        mode=cfg.trainer.mode,
        backend=cfg.trainer.backend,
    )
    if problem:
        raise ConfigError(problem)


def hardware_profile(cfg: Config) -> HardwareProfile:
    """The hardware profile ``profile`` names: a shipped one by name, or a YAML file (errors name the key
    and the file)."""
    from digenrl.runtime.hardware.profiles import AUTO, available_profiles, is_profile_path, load_profile

    if not is_profile_path(cfg.profile):
        one_of("profile", cfg.profile, [AUTO, *available_profiles()])
    try:
        return load_profile(cfg.profile)
    except ValueError as exc:  # ConfigError included: a file that is missing, binary or malformed
        raise ConfigError(f"profile={cfg.profile!r}: {exc}") from None


def check_sampler(cfg: Config) -> None:
    """What the sampler settings need of each other, resolved with the model's defaults: the CPS sampler's
    noise level is a fraction (digenrl/algo/sde_step.py), FlowGRPO-Fast's SDE window lies in the first half
    of the steps (digenrl/algo/timesteps.py)."""
    from digenrl.models.specs import get_model_spec

    spec = get_model_spec(cfg.model.name)
    noise = spec.noise_level if cfg.sampler.noise_level is None else cfg.sampler.noise_level
    if cfg.sampler.sde_type == "cps" and noise > 1:
        default = " (the model's default)" if cfg.sampler.noise_level is None else ""
        raise ConfigError(
            f"sampler.noise_level={noise:g}{default} is too large for sampler.sde_type=cps, whose noise "
            "level is a fraction in [0, 1]; set sampler.noise_level <= 1"
        )
    steps = cfg.sampler.num_steps or spec.default_num_steps
    if cfg.algo.timestep_selection == "fast-window" and cfg.algo.fast_window > steps // 2:
        raise ConfigError(
            f"algo.fast_window={cfg.algo.fast_window} must be at most num_steps // 2 = {steps // 2} "
            f"(sampler.num_steps={steps}): FlowGRPO-Fast's SDE window lies in the first half of the steps"
        )
    if cfg.algo.name == "mixgrpo" and cfg.algo.mix_window > steps:
        raise ConfigError(
            f"algo.mix_window={cfg.algo.mix_window} must be at most sampler.num_steps={steps}: MixGRPO's SDE "
            "window is a run of denoising steps"
        )
    solver_key = {"mixgrpo": "algo.mix_ode_solver", "diffusionnft": "algo.nft_ode_solver"}.get(cfg.algo.name)
    solver = cfg.algo.mix_ode_solver if cfg.algo.name == "mixgrpo" else cfg.algo.nft_ode_solver
    if solver_key and solver == "dpm2" and cfg.tsp.stages > 1:
        raise ConfigError(
            f"{solver_key}=dpm2 cannot run with tsp.stages={cfg.tsp.stages}: the multistep solver "
            "reads the previous step's prediction, which a TSP stage boundary does not carry; set "
            f"tsp.stages=1 or {solver_key}=euler"
        )
    if cfg.algo.name == "diffusionnft":
        off_policy = [
            f"{key}={value}"
            for key, value, bad in (
                ("asynchrony.max_staleness", cfg.asynchrony.max_staleness, cfg.asynchrony.max_staleness > 0),
                ("tcss.enabled", "true", cfg.tcss.enabled),
            )
            if bad
        ]
        if off_policy:
            raise ConfigError(
                f"algo.name=diffusionnft needs on-policy data, but {', '.join(off_policy)} trains on samples "
                "of an older policy: DiffusionNFT's v_old is the sampling policy's velocity, which DigenRL "
                'takes from the current weights (docs/algorithm.md, "DiffusionNFT"); use an on-policy setting'
            )


def check_reward(cfg: Config) -> None:
    """Reward names against the registry; a reward that runs a model has the weights it needs."""
    from digenrl.rewards.registry import available_rewards, reward_class

    rewards = available_rewards()
    names = reward_names(cfg)
    for name in names:
        one_of("reward.weights key" if cfg.reward.weights else "reward.name", name, rewards)
    if cfg.reward.weights and not any(cfg.reward.weights.values()):
        raise ConfigError(
            f"reward.weights={cfg.reward.weights}: every weight is 0, so every sample's reward is 0 and "
            "nothing is learned; give at least one reward a non-zero weight"
        )
    path = cfg.reward.weights_path
    if path is not None and not Path(path).is_dir():
        raise ConfigError(
            f"reward.weights_path={path!r} is not an existing directory; it names the local folder of the "
            "reward model's weights"
        )
    check_remote_reward(cfg)
    needing = [n for n in names if reward_class(n).needs_weights and not reward_class(n).weights_optional]
    if needing and path is None:
        raise ConfigError(
            f"reward {needing[0]!r} runs a model and needs its weights: set reward.weights_path to a local "
            "directory (model hubs are not contacted)"
        )
    if path is not None:
        from digenrl.rewards.local_weights import require_files

        for name in names:  # the one reward with a model (several with one path are refused when built)
            if reward_class(name).weights_layout:
                try:
                    require_files(path, reward_class(name).weights_layout, f"{name!r} reward")
                except ValueError as exc:
                    raise ConfigError(str(exc)) from None


def check_checkpoint_format(cfg: Config) -> None:
    """``trainer.checkpoint_format=sharded`` only where the trainer state is sharded FSDP2 state: LoRA
    checkpoints are small and stay full; DDP replicates and DeepSpeed reads full tensors through its own
    accessors (digenrl/trainer/checkpoint.py)."""
    tcfg = cfg.trainer
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


def reward_names(cfg: Config) -> list[str]:
    """The registry names of the configured reward: ``reward.name``, or the parts of ``reward.weights``."""
    return list(cfg.reward.weights) if cfg.reward.weights else [cfg.reward.name]


def check_remote_reward(cfg: Config) -> None:
    """A remote reward needs ``reward.url=http://HOST:PORT``; the three remote keys are read only with it
    (:data:`KNOB_RULES`), their ranges are declared in :class:`~digenrl.config.RewardConfig`."""
    from urllib.parse import urlsplit

    from digenrl.rewards.remote import read_token_file, url_credentials_problem

    if "remote" not in reward_names(cfg):
        return
    url = cfg.reward.url
    if not url:
        raise ConfigError(
            "reward=remote needs reward.url=http://HOST:PORT (a server started with python -m "
            "digenrl.rewards.serve --reward NAME --port PORT)"
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"reward.url={url!r} is not a valid URL ({exc})") from None
    problem = url_credentials_problem(url)
    if problem:
        raise ConfigError(f"reward.url {problem}")  # the URL itself is not repeated: it holds a secret
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise ConfigError(f"reward.url={url!r} must look like http://HOST:PORT (scheme, host and port)")
    if not 1 <= port <= 65535:
        raise ConfigError(f"reward.url={url!r}: port {port} is not a TCP port (1-65535)")
    if cfg.reward.token_file is not None:
        try:
            read_token_file(cfg.reward.token_file)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


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
        latent = latent_shape_for(spec, height, width, cfg.model.frames, key_prefix="model.")
        if cfg.model.pretrained_path is not None:
            check_pretrained_dir(spec, cfg.model.pretrained_path)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    check_position_table(spec, height, width, latent)
    check_iteration_memory(cfg, spec, latent)
    if cfg.model.attention_backend != "native":  # diffusers' default always exists: skip importing diffusers
        from digenrl.models.flow_model import available_attention_backends

        one_of("model.attention_backend", cfg.model.attention_backend, available_attention_backends())
    targets = cfg.trainer.lora_targets
    if targets is not None and cfg.trainer.mode == "lora":  # KNOB_RULES: only LoRA reads them
        if not targets:
            raise ConfigError("trainer.lora_targets must be null (the family default) or a non-empty list")
        from digenrl.models.bundle import meta_transformer
        from digenrl.trainer.lora import check_lora_targets

        try:
            check_lora_targets(meta_transformer(spec, cfg.model.pretrained_path), list(targets), each=True)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def check_position_table(spec: ModelSpec, height: int, width: int, latent: tuple[int, ...]) -> None:
    """A transformer with a fixed table of positions (SD3's ``pos_embed_max_size``, in patches per side,
    diffusers ``PatchEmbed``) cannot take a larger image: refuse it here, not at the first forward."""
    limit = spec.transformer_config.get("pos_embed_max_size")
    if not limit:
        return
    from digenrl.models.specs import get_family

    patch = get_family(spec.family).patch_size(spec.transformer_config)[1]
    for key, pixels, cells in (("model.height", height, latent[-2]), ("model.width", width, latent[-1])):
        if cells // patch > limit:
            largest = pixels * limit // (cells // patch)
            raise ConfigError(
                f"{key}={pixels} is larger than {spec.name} can take: its position table covers {limit} "
                f"patches per side ({largest} pixels); use at most {largest}"
            )


def check_iteration_memory(cfg: Config, spec: ModelSpec, latent: tuple[int, ...]) -> None:
    """An iteration keeps every sample's trajectory (the latent of each of ``num_steps + 1`` points, fp32)
    until it is trained on; refuse ``algo.prompts_per_iteration`` x ``algo.group_size`` whose trajectories
    alone exceed this machine's memory (they would fail late, or swap the machine to a halt)."""
    samples = cfg.algo.prompts_per_iteration * cfg.algo.group_size
    steps = cfg.sampler.num_steps or spec.default_num_steps
    need = samples * (steps + 1) * math.prod(latent) * 4
    try:
        have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return
    if need > have:
        raise ConfigError(
            f"algo.prompts_per_iteration={cfg.algo.prompts_per_iteration} x algo.group_size="
            f"{cfg.algo.group_size} = {samples} samples per iteration: their trajectories alone ({steps + 1} "
            f"latents of {math.prod(latent)} values each) need {need / 2**30:.1f} GiB, more than this "
            f"machine's {have / 2**30:.1f} GiB; use fewer prompts or a smaller group"
        )


def check_fp8(cfg: Config) -> None:
    """``model.fp8``: LoRA only (the converted weights must stay frozen), not under DeepSpeed, torchao
    importable, and the model has layers FP8 can run (digenrl/models/fp8.py)."""
    if not cfg.model.fp8:
        return
    if cfg.trainer.mode != "lora":
        raise ConfigError(
            f"model.fp8=true needs trainer.mode=lora (FP8 runs the frozen base weights), got "
            f"trainer.mode={cfg.trainer.mode!r}"
        )
    if cfg.trainer.backend == "deepspeed":
        raise ConfigError("model.fp8=true is not supported with trainer.backend=deepspeed; use auto / fsdp2")
    from digenrl.models.bundle import meta_transformer
    from digenrl.models.fp8 import fp8_targets, require_torchao
    from digenrl.models.specs import get_model_spec

    try:
        require_torchao()
    except ImportError as exc:
        raise ConfigError(str(exc)) from None
    transformer = meta_transformer(get_model_spec(cfg.model.name), cfg.model.pretrained_path)
    if not fp8_targets(transformer):
        raise ConfigError(
            f"model.fp8=true: no linear layer of {cfg.model.name}'s transformer blocks has both dimensions "
            "divisible by 16 (torch._scaled_mm's requirement)"
        )


def check_files(cfg: Config) -> None:
    """``data.prompts`` and ``data.eval_prompts`` parse, give one metadata per prompt text and suit the
    reward (``RewardFunction.check_prompts``, e.g. OCR needs the text to render); ``out_dir`` can be
    created and written."""
    from digenrl.data.prompts import configured_prompt_sets, metadata_lookup
    from digenrl.rewards.registry import available_rewards, reward_class

    try:
        sets = configured_prompt_sets(cfg.data)
        metadata_lookup(sets)
        training = sets["data.prompts"]
        for name in reward_names(cfg):
            if name in available_rewards():
                reward_class(name).check_prompts(
                    list(training.prompts), list(training.metadata), "data.prompts"
                )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    check_out_dir(cfg.out_dir)
    check_writable_dir("out_dir", cfg.out_dir)


def check_out_dir(out_dir: str) -> None:
    """``out_dir`` is a folder of its own: not a literal ``~`` path (quoted, so the shell did not expand
    it: the run would create a folder named ``~``), not the file system root, and not inside another run's
    folder (one holding a run's ``config.yaml``, or the run lock beside a run file: an ``overwrite`` or a
    checkpoint clean-up of that run would delete this one)."""
    if out_dir.startswith("~"):
        raise ConfigError(
            f"out_dir={out_dir!r} starts with a literal '~', which is not expanded here (the run would "
            f"create a folder named '~'); write the full path, e.g. out_dir={os.path.expanduser(out_dir)!r}"
        )
    too_long = _path_too_long(out_dir)
    if too_long:
        raise ConfigError(
            f"out_dir=…{out_dir[-60:]!r} ({len(out_dir)} characters): {too_long}; choose a shorter path"
        )
    try:
        resolved = Path(out_dir).resolve()
    except (OSError, RuntimeError) as exc:  # a loop of links, a component that is not a folder
        raise ConfigError(f"out_dir={out_dir!r} cannot be resolved ({exc}); choose another folder") from None
    if resolved == Path(resolved.anchor):
        raise ConfigError(
            f"out_dir={out_dir!r} is the file system root; a run writes and may delete its files there. "
            "Choose a folder of its own, e.g. out_dir=runs/my-run"
        )
    for ancestor in resolved.parents:
        evidence = _run_folder_evidence(ancestor)
        if evidence:
            raise ConfigError(
                f"out_dir={out_dir!r} lies inside the folder of another run, {ancestor} (it holds "
                f"{evidence}); that run's overwrite or checkpoint clean-up could delete this one. Choose an "
                "out_dir outside it"
            )


def _path_too_long(path: str) -> str:
    """Why the file system cannot hold ``path`` ("" if it can): a name longer than the file system's
    NAME_MAX or a whole path longer than PATH_MAX (pathconf(3); 255 and 4096 where they cannot be read)."""
    probe = Path(path).absolute()
    while probe != probe.parent:
        try:
            if probe.exists():
                break
        except OSError:  # ENAMETOOLONG: not a folder there either
            pass
        probe = probe.parent
    try:
        name_max, path_max = os.pathconf(probe, "PC_NAME_MAX"), os.pathconf(probe, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    longest = max((len(part.encode()) for part in Path(path).parts), default=0)
    if longest > name_max:
        return f"a folder name of {longest} bytes, longer than the file system's limit of {name_max}"
    if len(str(Path(path).absolute()).encode()) >= path_max:
        return f"longer than the file system's path limit of {path_max} bytes"
    return ""


def _run_folder_evidence(folder: Path) -> str:
    """What marks ``folder`` as a run's folder ("" if nothing): its lock or a run's resolved
    ``config.yaml`` (first line names the run) beside what a run logs (``metrics.jsonl``, ``events/``,
    ``checkpoints/``). One marker alone is not enough: other tools keep ``.lock`` files, and a resolved
    config is often copied elsewhere to start a new run from."""
    from digenrl.config import RUN_ID_HEADER
    from digenrl.runtime.run_folder.run_lock import LOCK_FILE
    from digenrl.trainer.run_dir import CHECKPOINT_DIR, CONFIG_FILE, EVENTS_SUBDIR, METRICS_FILE

    try:
        logged = [name for name in (METRICS_FILE, EVENTS_SUBDIR, CHECKPOINT_DIR) if (folder / name).exists()]
        if not logged:
            return ""
        if (folder / LOCK_FILE).is_file():
            return f"{LOCK_FILE} and {logged[0]}"
        config = folder / CONFIG_FILE
        if config.is_file():
            with config.open("rb") as stream:
                if stream.readline().startswith(RUN_ID_HEADER.encode()):
                    return f"a run's {CONFIG_FILE} and {logged[0]}"
    except OSError:
        return ""
    return ""


def check_evaluation(cfg: Config) -> None:
    """Evaluation settings the run can carry out (digenrl/rollout/evaluate.py): enough held-out prompts in
    ``data.eval_prompts`` for ``eval.num_prompts`` (a prompt the reward cannot read, e.g. no text for OCR,
    is a warning); an EMA to evaluate with ``eval.use_ema``; ``wandb`` installed
    when ``logger.wandb=true``."""
    import importlib.util

    from digenrl.data.prompts import PromptSet
    from digenrl.rewards.registry import available_rewards, reward_class
    from digenrl.rollout.evaluate import evaluated_prompts

    if cfg.logger.wandb and importlib.util.find_spec("wandb") is None:
        raise ConfigError(
            'logger.wandb=true but the wandb package is not installed: pip install -e ".[wandb]" (or set '
            "logger.wandb=false)"
        )
    if not cfg.eval.every:
        return
    if cfg.eval.use_ema and cfg.trainer.ema_decay <= 0:
        raise ConfigError(
            "eval.use_ema=true needs an EMA of the weights: set trainer.ema_decay > 0 (e.g. 0.99), or "
            "eval.use_ema=false"
        )
    try:
        held_out = PromptSet.load(cfg.data.eval_prompts, "data.eval_prompts")
        evaluated_prompts(cfg.eval, held_out.prompts, cfg.data.eval_prompts)  # enough of them
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    # a held-out prompt a reward cannot read (OCR: no text asked for) is scored on its whole text, with a
    # warning (docs/rewards.md); only the training prompts are refused
    n = cfg.eval.num_prompts
    for name in reward_names(cfg):
        if name in available_rewards():
            try:
                reward_class(name).check_prompts(
                    list(held_out.prompts[:n]), list(held_out.metadata[:n]), "data.eval_prompts"
                )
            except ValueError as exc:
                log.warning("%s (the evaluation scores it against its whole text)", exc)


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

    from digenrl.runtime.comm.distributed import planned_device_type

    gpus = torch.cuda.device_count() if cuda_devices is None else cuda_devices
    if cfg.runtime.backend == "nccl" and not distributed:
        raise ConfigError(
            "runtime.backend=nccl needs a process group, but this is a single process; launch with "
            "torchrun (or more than one rank), or leave runtime.backend unset"
        )
    from digenrl.runtime.comm.distributed import configured_backend
    from digenrl.runtime.hardware.profiles import load_profile

    share = cfg.runtime.share_device
    # as digenrl/launch.py starts it
    backend = configured_backend(cfg.runtime.backend, load_profile(cfg.profile).backend, share_device=share)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if share and gpus == 0:
        raise ConfigError(
            "runtime.share_device=true puts the ranks on a shared GPU, but this machine has no CUDA device; "
            "use a CPU profile (e.g. profile=cpu-2) instead"
        )
    if distributed and not share and backend == "nccl" and gpus < local:
        source = "runtime.backend" if cfg.runtime.backend else f"profile={cfg.profile!r}"
        raise ConfigError(
            f"{local} ranks on this node would share {gpus} GPU(s), two ranks on one GPU, which NCCL "
            f"refuses (backend nccl from {source}); "
            "launch one rank per GPU, set runtime.share_device=true to test the schedule with several ranks "
            "per GPU, or use runtime.backend=gloo (CPU)"
        )
    device = planned_device_type(
        backend, distributed=distributed, cuda_available=gpus > 0, share_device=share
    )
    # a launcher computes nothing (its workers check), and a caller that states the GPUs (cuda_devices, a
    # test) describes another machine than the one whose device this process would read
    here = cuda_devices is None and ("RANK" in os.environ or not distributed)
    note = check_profile_device(cfg, device, computes_here=here, gpus=gpus)
    if note:
        print(f"[digenrl] WARNING (runtime.allow_profile_mismatch=true): {note}", file=sys.stderr, flush=True)
    if device == "cpu" and not cfg.model.name.startswith("tiny-") and not cfg.runtime.allow_large_cpu_model:
        where = "runtime.backend=gloo" if distributed and gpus else "no CUDA device"
        raise ConfigError(
            f"model.name={cfg.model.name!r} would run on the CPU ({where}) and needs about "
            f"{_memory_estimate(cfg)}; a real-size model on a CPU takes hours per iteration. Use GPUs, a "
            "tiny-* model, or set runtime.allow_large_cpu_model=true to run it anyway"
        )
    if share and gpus > 0 and _checks_memory_here(distributed):
        check_shared_device_memory(cfg, world_size, free_bytes=_free_gpu_bytes(), gpus=gpus)
    if device == "cuda" and not share and here and os.environ.get("RANK", "0") == "0":
        note = check_device_memory(cfg)
        if note:
            print(f"[digenrl] {note}", file=sys.stderr, flush=True)


def check_profile_device(cfg: Config, device_type: str, *, computes_here: bool, gpus: int) -> str | None:
    """This process's real device against the one the profile gives its rank
    (digenrl/runtime/hardware/profiles.py ``device_mismatch``): a ConfigError naming both and the fix, or with
    ``runtime.allow_profile_mismatch`` the mismatch as a note (None: they match, or this process is a launcher
    that computes nothing — its workers check their own devices)."""
    if not computes_here:
        return None
    from digenrl.runtime.hardware.profiles import detect_device, device_mismatch, matching_profiles

    profile = hardware_profile(cfg)
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    index = local % gpus if cfg.runtime.share_device and gpus else local
    device = detect_device(device_type, index)
    mismatch = device_mismatch(profile, min(rank, profile.world_size - 1), device)
    if mismatch is None or cfg.runtime.allow_profile_mismatch:
        return mismatch
    fits = matching_profiles(device, profile.world_size)
    fix = " or ".join(f"profile={name}" for name in ["auto", *fits] if name != cfg.profile)
    raise ConfigError(
        f"{mismatch}: its bounds, memory checks and plans would be another device's. Use {fix} (a profile "
        "of this machine's devices), or runtime.allow_profile_mismatch=true to run anyway with a warning"
    )


def check_device_memory(cfg: Config) -> str | None:
    """Each rank's peak by the planner's memory estimate (:func:`digenrl.planning.memory.check_plan`, held
    within 10 % of measured peaks: ``experiments/simulate.py memory``) against its device, before any model
    is built: a ConfigError when a rank would need more than its device's whole memory (the run would stop
    out of memory after minutes of loading and compiling), a note when it needs more than the usable share.
    None when it fits, or when it cannot be checked: ``runtime.memory_check=false``, no ``runtime.costs_dir``,
    or no measured cost file there for a device type of the profile and the model (the note says so)."""
    if not cfg.runtime.memory_check or cfg.runtime.costs_dir is None:
        return None
    from digenrl.costs.cost_model import CostModel, cost_path
    from digenrl.plan.workload import Workload
    from digenrl.planning.memory import USABLE_FRACTION, check_config

    profile = hardware_profile(cfg)
    true_cfg = Workload.from_config(cfg).cfg
    costs = {}
    for device in sorted(profile.gpu_types):
        path = cost_path(device, cfg.model.name, Path(cfg.runtime.costs_dir))
        if not path.is_file():
            return f"memory not checked: runtime.costs_dir holds no cost file {path.name} for this device"
        costs[device] = CostModel.load(path)
        if not costs[device].has_memory(true_cfg):
            return f"memory not checked: {path} has no measured peaks"
    ranks = check_config(cfg, profile, costs)
    over = [r for r in ranks if r.peak > r.capacity]
    if not over:
        return None
    worst = max(over, key=lambda r: r.peak / r.capacity)
    fix = (
        f"a smaller trainer.micro_batch_size (now {cfg.trainer.micro_batch_size})"
        + ("" if cfg.trainer.activation_checkpointing else ", trainer.activation_checkpointing=true")
        + ", a GPU with more memory (profile), or runtime.memory_check=false to run anyway"
    )
    what = f"{worst.describe()}; the planner's estimate, digenrl/planning/memory.py"
    if worst.peak > worst.capacity / USABLE_FRACTION:
        raise ConfigError(
            f"model.name={cfg.model.name!r} does not fit on profile {profile.name!r} "
            f"({profile.description}): {what}, is above the device's whole "
            f"{worst.capacity / USABLE_FRACTION / _GIB:.1f} GiB. Use {fix}"
        )
    return f"WARNING: {what}: above the usable share, it may run out of memory. If it does, use {fix}"


def check_shared_device_memory(cfg: Config, world_size: int, *, free_bytes: float, gpus: int = 1) -> None:
    """Shared-device mode: the ranks that share one GPU (round-robin over ``gpus``) must fit together in its
    ``free_bytes`` (:mod:`digenrl.planning.shared_device`); refused naming every rank and its estimate."""
    from digenrl.planning.shared_device import check_shared_fit, shared_device_estimates

    estimates, counted = shared_device_estimates(cfg, world_size)
    for gpu in range(gpus):
        message = check_shared_fit(estimates[gpu::gpus], free_bytes, activations_counted=counted)
        if message:
            raise ConfigError(message if gpus == 1 else f"GPU {gpu}: {message}")


def _checks_memory_here(distributed: bool) -> bool:
    """One process measures the free memory: a single process, or local rank 0 of a torchrun job (not a
    launcher that is about to start the workers, which would hold a CUDA context of its own)."""
    if "RANK" in os.environ:
        return os.environ.get("LOCAL_RANK", "0") == "0"
    return not distributed


def _free_gpu_bytes() -> float:
    import torch

    from digenrl.runtime.hardware.memory import free_device_bytes

    return float(free_device_bytes(torch.device("cuda", 0)))


def _memory_estimate(cfg: Config) -> str:
    """Memory of one training rank: parameters x dtype bytes, plus gradients and AdamW states."""
    from digenrl.data.dtypes import TORCH_DTYPES
    from digenrl.models.bundle import bundle_parameter_counts, meta_transformer
    from digenrl.models.specs import get_model_spec
    from digenrl.trainer.lora import default_lora_targets, lora_parameter_count

    spec = get_model_spec(cfg.model.name)
    counts = bundle_parameter_counts(spec)
    dtype_bytes = TORCH_DTYPES[cfg.model.dtype].itemsize
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
