"""Does a shared-device layout fit? Every rank's estimated peak, summed against the GPU's free memory.

In shared-device mode (``runtime.share_device=true``, docs/operations.md "Shared-device mode") several ranks
of one job build their models on the same GPU, so their peaks add up. Each rank's estimate is what
``digenrl/systems/components.py`` builds there for its role (docs/design.md §6):

* every rank that generates or trains: the model bundle (transformer, text encoders, VAE) in
  ``model.dtype``; a scorer rank: the VAE only (its transformer and text encoders live on ``meta``);
* a rank that trains: the LoRA adapter in fp32 with its gradient and two AdamW states (full fine-tuning:
  gradients and AdamW states of the transformer in ``model.dtype``), plus one micro-batch's activations;
* a rank that scores (colocated, a generator without scorer ranks, a TAG trainer without them, a scorer):
  the reward model's parameters (built on ``meta`` to count them);
* a rank that generates: one forward's activations.

Activations come from the measured cost file of the profile's device and the model
(``<runtime.costs_dir>/<device>-<model>.json``, the committed ones in ``experiments/results/costs``, priced as
:mod:`digenrl.planning.memory` prices a plan) when ``runtime.costs_dir`` names a folder holding one;
otherwise they are not counted and the refusal says so.

The same estimate, plus a second copy of the transformer, decides whether ``system=colocated-engine`` with
``engine.offload=false`` fits: :func:`engine_copies_error`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from digenrl.config import Config
    from digenrl.costs.cost_model import CostModel

GIB = 2**30
#: Share of the GPU's free memory the ranks together may plan to use (allocator reserve, CUDA contexts).
SHARED_USABLE_FRACTION = 0.92


@dataclass(frozen=True)
class RankEstimate:
    """One rank's estimated peak bytes on the shared GPU and what it is made of."""

    rank: int
    role: str
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def bytes(self) -> float:
        return sum(self.parts.values())

    def describe(self) -> str:
        parts = ", ".join(f"{name} {value / GIB:.1f}" for name, value in self.parts.items() if value > 0)
        return f"rank {self.rank} ({self.role}) {self.bytes / GIB:.1f} GiB ({parts})"


def rank_roles(cfg: Config, world_size: int) -> list[str]:
    """The role of every rank, as the systems lay them out (pools given: trainers, generators, scorers)."""
    p = cfg.pools
    if not (p.trainers or p.generators or p.scorers):
        return ["colocated"] * world_size
    return ["trainer"] * p.trainers + ["generator"] * p.generators + ["scorer"] * p.scorers


def _cost_model(cfg: Config) -> CostModel | None:
    from digenrl.costs.cost_model import CostModel, cost_path
    from digenrl.runtime.hardware.profiles import load_profile

    if cfg.runtime.costs_dir is None:
        return None
    device = load_profile(cfg.profile).device_type(0).name
    path = cost_path(device, cfg.model.name, Path(cfg.runtime.costs_dir))
    return CostModel.load(path) if path.is_file() else None


def reward_bytes(cfg: Config) -> float:
    """Parameter bytes of the configured reward model(s), counted on the ``meta`` device."""
    from digenrl.rewards.registry import build_configured_reward

    reward = build_configured_reward(
        cfg.reward.name, cfg.reward.weights, None, device="meta", remote=cfg.reward.remote_settings()
    )
    modules = reward.modules() if hasattr(reward, "modules") else []
    return float(sum(p.numel() * p.element_size() for m in modules for p in m.parameters()))


def shared_device_estimates(cfg: Config, world_size: int) -> tuple[list[RankEstimate], bool]:
    """Every rank's estimate (module docstring) and whether activations were counted (a cost file found)."""
    from digenrl.data.dtypes import TORCH_DTYPES
    from digenrl.models.bundle import bundle_parameter_counts, meta_transformer
    from digenrl.models.specs import get_model_spec
    from digenrl.planning.memory import generator_activation_bytes, train_activation_bytes
    from digenrl.rules import fragment_size
    from digenrl.trainer.lora import default_lora_targets, lora_parameter_count

    spec = get_model_spec(cfg.model.name)
    counts = bundle_parameter_counts(spec)
    dtype_bytes = TORCH_DTYPES[cfg.model.dtype].itemsize
    if cfg.trainer.mode == "lora":
        targets = cfg.trainer.lora_targets or default_lora_targets(spec.family)
        adapter = lora_parameter_count(meta_transformer(spec), list(targets), cfg.trainer.lora_rank)
        train_state = 16.0 * adapter  # fp32 weight + gradient + two AdamW states
    else:
        train_state = 3.0 * counts["transformer"] * dtype_bytes
    cost = _cost_model(cfg)
    cfg_pass = cfg.sampler.guidance_scale is not None and cfg.sampler.guidance_scale > 1.0
    if cost is not None and not cost.has_memory(cfg_pass):
        cost = None
    roles = rank_roles(cfg, world_size)
    has_scorers = "scorer" in roles
    reward = reward_bytes(cfg) if any(r != "trainer" for r in roles) or cfg.tag.enabled else 0.0
    per_generator = (
        -(-cfg.algo.prompts_per_iteration // max(1, roles.count("generator"))) * cfg.algo.group_size
    )
    estimates = []
    for rank, role in enumerate(roles):
        trains = role in ("colocated", "trainer")
        tag = role == "trainer" and cfg.system == "digenrl" and cfg.tag.enabled
        generates = role in ("colocated", "generator") or tag
        scores = role in ("colocated", "scorer") or (generates and not has_scorers)
        parts: dict[str, float] = {}
        if role == "scorer":
            parts["VAE"] = float(counts["VAE"] * dtype_bytes)
        else:
            parts["model"] = float(sum(counts.values()) * dtype_bytes)
        if trains:
            parts["trainer state"] = train_state
        if scores:
            parts["reward"] = reward
        if cost is not None:
            activations = 0.0
            if trains:
                activations = train_activation_bytes(cost, cfg.trainer.micro_batch_size, cfg_pass, False)
            if generates:
                batch = (
                    cfg.algo.prompts_per_iteration * cfg.algo.group_size
                    if role == "colocated"
                    else per_generator
                )
                if role != "colocated" and cfg.system == "digenrl":
                    batch = fragment_size(
                        cfg.algo.group_size, cfg.gap.fragment_groups, cfg.gap.fragment_samples
                    )
                activations = max(activations, generator_activation_bytes(cost, batch, cfg_pass))
            parts["activations"] = activations
        estimates.append(RankEstimate(rank, role, parts))
    return estimates, cost is not None


def check_shared_fit(estimates: list[RankEstimate], free_bytes: float, *, activations_counted: bool) -> str:
    """A :class:`ConfigError` message when the ranks' sum exceeds the usable share of ``free_bytes``, else
    ""."""
    total = sum(e.bytes for e in estimates)
    usable = free_bytes * SHARED_USABLE_FRACTION
    if total <= usable:
        return ""
    note = (
        ""
        if activations_counted
        else (
            " (activations not counted: runtime.costs_dir holds no measured cost file for this model and "
            "device)"
        )
    )
    ranks = "; ".join(e.describe() for e in estimates)
    return (
        f"runtime.share_device=true: the {len(estimates)} ranks need about {total / GIB:.1f} GiB together "
        f"but the GPU has {free_bytes / GIB:.1f} GiB free ({SHARED_USABLE_FRACTION:.0%} usable = "
        f"{usable / GIB:.1f} GiB){note}: {ranks}. Use fewer ranks (pools.*), smaller batches "
        "(trainer.micro_batch_size, gap.fragment_groups, algo.prompts_per_iteration) or one GPU per rank"
    )


def engine_copies_error(cfg: Config, world_size: int) -> str:
    """Why both copies do not fit on a rank's device with ``engine.offload=false`` ("" when they do): the
    shared-device estimate of a colocated rank (model bundle, trainer state, reward, activations where a cost
    file is found; above) plus the generation copy of the transformer, against
    the profile's usable memory (:data:`digenrl.planning.memory.USABLE_FRACTION`)."""
    from digenrl.data.dtypes import TORCH_DTYPES
    from digenrl.models.bundle import bundle_parameter_counts
    from digenrl.models.specs import get_model_spec
    from digenrl.planning.memory import usable_bytes
    from digenrl.runtime.hardware.profiles import load_profile

    profile = load_profile(cfg.profile)
    estimates, _ = shared_device_estimates(cfg, world_size)
    counts = bundle_parameter_counts(get_model_spec(cfg.model.name))
    copy_bytes = counts["transformer"] * TORCH_DTYPES[cfg.model.dtype].itemsize
    for estimate in estimates:
        need = estimate.bytes + copy_bytes
        have = usable_bytes(profile, estimate.rank)
        if need > have:
            return (
                f"engine.offload=false: system=colocated-engine keeps the trainer and the generation copy "
                f"on rank {estimate.rank}'s device, about {need / GIB:.1f} GiB ({estimate.describe()} + "
                f"generation copy {copy_bytes / GIB:.1f} GiB) of the {have / GIB:.1f} GiB usable on profile "
                f"{cfg.profile!r}; set engine.offload=true (the trainer's states go to host memory while it "
                f"generates) or use system=colocated-sync (one copy)"
            )
    return ""
