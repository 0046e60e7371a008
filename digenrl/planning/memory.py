"""Which plans fit in device memory, from measured peaks (docs/design.md §4 "Where disaggregation can win":
memory pressure — full fine-tuning at 12 B+, a heavy reward model a colocated rank must keep or swap).

Per rank, what it holds is what ``digenrl/systems/components.py`` builds there, priced from the cost
model (:class:`~digenrl.costs.cost_model.CostModel`, bytes):

* every rank: the transformer weights (``param_bytes``), the text encoders (``text_encoder_bytes``) and the
  VAE (``vae_param_bytes``) — the bundle is built whole on every rank;
* a rank that generates (a generator, a colocated rank, a TAG trainer): the reward model
  (``reward_param_bytes``; a colocated rank may park it, ``residency.reward_resident=false``), the LoRA
  adapter, and the activations of one forward of its batch: ``generator_peak(B) − param_bytes``;
* a rank that trains: trainable weights, gradients and optimizer state (``weight_sync_bytes`` for a LoRA
  adapter, ``grad_bytes``, ``optimizer_bytes``; a colocated rank may park the optimizer state during
  generation and accumulation, ``residency.train_resident=false``), and the activations of one
  micro-batch: ``train_peak(m) −`` that state ``− param_bytes``; with activation checkpointing only the
  block inputs are kept (:data:`CHECKPOINT_ACTIVATION_SHARE` of them, an estimate unless the file was
  measured with checkpointing). Full fine-tuning shards weights, gradients and optimizer state over the
  trainer group (FSDP2, ``trainer.backend=auto``). With Ulysses sequence parallelism over N ranks
  (``RunPlan.sequence_parallel``) each rank holds 1/N of every sample's tokens, so both activation terms
  are divided by N (the all-to-all's head-sharded Q, K, V and output are the same size as the sequence
  shards they replace; arXiv 2309.14509 §3); weights, text encoders and the VAE stay whole on every rank.

Phases take turns on a rank, so its peak is the static part plus the largest phase. A plan fits when every
rank's peak stays below :data:`USABLE_FRACTION` of its device's ``memory_gib`` (the allocator's reserve
and fragmentation take the rest). A cost file without measured peaks cannot be checked: the check then
says so instead of passing silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from digenrl.costs.cost_model import CFG_KEYS, CostModel
from digenrl.costs.device_costs import DeviceCosts
from digenrl.plan import RunPlan
from digenrl.plan.workload import Workload
from digenrl.rules.schedule import shard_group
from digenrl.runtime.hardware.profiles import HardwareProfile

if TYPE_CHECKING:
    from digenrl.config import Config

GIB = 2**30
#: Fraction of a device's memory a run may allocate (max_memory_allocated); the caching allocator's
#: reserve and fragmentation take the rest (an assumption, not measured here).
USABLE_FRACTION = 0.92
#: Activations kept with activation checkpointing, as a share of those without it: only every block's
#: input survives the forward, plus one block's activations during its recomputation (estimate).
CHECKPOINT_ACTIVATION_SHARE = 0.15


@dataclass(frozen=True)
class RankMemory:
    """One rank's predicted peak bytes, the parts it is made of, and its device's usable bytes."""

    rank: int
    role: str
    peak: float
    capacity: float
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return self.peak <= self.capacity

    def describe(self) -> str:
        parts = ", ".join(f"{name} {value / GIB:.1f}" for name, value in self.parts.items() if value > 0)
        return (
            f"rank {self.rank} ({self.role}) needs {self.peak / GIB:.1f} GiB of {self.capacity / GIB:.1f} "
            f"usable ({parts})"
        )


def usable_bytes(profile: HardwareProfile, rank: int) -> float:
    return profile.device_type(rank).memory_gib * GIB * USABLE_FRACTION


def _lora(cost: CostModel) -> bool:
    return cost.meta.get("trainer_mode", "lora") != "full"


def train_state_bytes(cost: CostModel, shards: int = 1) -> float:
    """Trainable weights (a LoRA adapter; full weights are the transformer itself), gradients and optimizer
    state of one trainer rank; full fine-tuning shards them over ``shards`` ranks."""
    if _lora(cost):
        return float(cost.weight_sync_bytes + cost.grad_bytes + cost.optimizer_bytes)
    return (cost.grad_bytes + cost.optimizer_bytes) / shards


def train_activation_bytes(cost: CostModel, micro_batch: int, cfg: bool, checkpointing: bool) -> float:
    """Activations of one micro-batch (measured peak minus the weights and the training state)."""
    static = cost.param_bytes + train_state_bytes(cost)
    measured = max(0.0, cost.train_peak(micro_batch, cfg) - static)
    if checkpointing == cost.activation_checkpointing:
        return measured
    return measured * CHECKPOINT_ACTIVATION_SHARE if checkpointing else measured / CHECKPOINT_ACTIVATION_SHARE


def generator_activation_bytes(cost: CostModel, batch: int, cfg: bool) -> float:
    return max(0.0, cost.generator_peak(batch, cfg) - cost.param_bytes)


@dataclass(frozen=True)
class RankLoad:
    """What one rank of a plan does: trains (``micro_batch``, ``checkpointing``, ``shards`` of a sharded
    full fine-tune), generates (``gen_batch`` samples per forward), keeps the optimizer state and the reward
    resident or parks them, and whether TAG keeps gradients pending on the device while it generates."""

    role: str
    trains: bool
    generates: bool
    micro_batch: int = 1
    checkpointing: bool = False
    gen_batch: int = 0
    shards: int = 1
    train_resident: bool = True
    reward_resident: bool = True
    grads_while_generating: bool = False
    #: ``colocated-engine``: "offload" (the generation copy on the device while generating, the trainer's
    #: states off it), "resident" (both copies always), "" (no generation copy)
    generation_copy: str = ""
    #: Ulysses degree: the rank holds 1/N of each sample's activations (module docstring)
    sequence_parallel: int = 1


def rank_memory(
    profile: HardwareProfile, rank: int, cost: CostModel, load: RankLoad, cfg: bool
) -> RankMemory:
    """The peak of one rank (module docstring)."""
    weights = cost.param_bytes if _lora(cost) or not load.trains else cost.param_bytes / load.shards
    static = {"weights": float(weights), "text encoders": float(cost.text_encoder_bytes)}
    static["vae"] = float(cost.vae_param_bytes)
    phases: dict[str, dict[str, float]] = {}
    state = train_state_bytes(cost, load.shards) if load.trains else 0.0
    optimizer = float(cost.optimizer_bytes if _lora(cost) else cost.optimizer_bytes / load.shards)
    resident_optimizer = optimizer if load.train_resident else 0.0
    if load.trains:
        static["trainable state"] = state - optimizer
        static["optimizer"] = resident_optimizer
        act = train_activation_bytes(cost, load.micro_batch, cfg, load.checkpointing) / load.sequence_parallel
        phases["train"] = {"activations": act}
        phases["optimizer step"] = {"optimizer": optimizer - resident_optimizer}
    if load.generates:
        if load.reward_resident:
            static["reward"] = float(cost.reward_param_bytes)
        else:
            phases["score"] = {"reward": float(cost.reward_param_bytes)}
        if not load.trains and _lora(cost):
            static["adapter"] = float(cost.weight_sync_bytes)
        generate = {
            "activations": generator_activation_bytes(cost, load.gen_batch, cfg) / load.sequence_parallel
        }
        if load.trains and not load.grads_while_generating:
            generate["gradients freed"] = -float(
                cost.grad_bytes if _lora(cost) else cost.grad_bytes / load.shards
            )
        if load.generation_copy == "resident":
            static["generation copy"] = float(cost.param_bytes)
        elif load.generation_copy == "offload":  # digenrl/systems/engine_switch.py
            generate["generation copy"] = float(cost.param_bytes)
            generate["trainer states offloaded"] = -(
                resident_optimizer + (0.0 if _lora(cost) else float(weights))
            )
        phases["generate"] = generate
    largest_name, largest = max(
        ((name, sum(parts.values())) for name, parts in phases.items()),
        key=lambda item: item[1],
        default=("", 0.0),
    )
    parts = {
        **static,
        **({f"{largest_name}: {k}": v for k, v in phases[largest_name].items()} if largest_name else {}),
    }
    return RankMemory(rank, load.role, sum(static.values()) + largest, usable_bytes(profile, rank), parts)


# ----------------------------------------------------------------------------- fitting a plan


@dataclass(frozen=True)
class Fit:
    """The plan with the memory knobs it can run (None if none fits), and why (or what was lowered)."""

    plan: RunPlan | None
    notes: tuple[str, ...] = ()
    checked: bool = True

    @property
    def feasible(self) -> bool:
        return self.plan is not None


def _halvings(top: int) -> list[int]:
    out, m = [], max(1, top)
    while m >= 1:
        out.append(m)
        m //= 2
    return out


def _loads(plan: RunPlan, w: Workload, profile: HardwareProfile, choice: tuple) -> dict[int, RankLoad]:
    """Every rank's load under ``choice`` = (micro_batch, checkpointing, samples_per_forward,
    train_resident, reward_resident)."""
    from digenrl.sim.schedules.colocated import overlap_sub_batches

    mb, ckpt, spf, train_res, reward_res = choice
    world = profile.world_size

    def cap(batch: int) -> int:
        return min(batch, spf) if spf else batch

    if plan.colocated:
        loads = {}
        shaped = plan.with_(micro_batch_size=mb, samples_per_forward=spf)
        w = shaped.effective_workload(w)
        for rank, share in enumerate(shaped.colocated_shares(w, profile.relative_speeds)):
            batch = share.samples
            if plan.system == "colocated-overlap":  # one sub-batch at a time (schedules/colocated.py)
                batch = max(overlap_sub_batches(w, plan, share.samples))
            engine = ""
            if plan.system == "colocated-engine":
                engine = "offload" if plan.engine_offload else "resident"
            loads[rank] = RankLoad(
                "colocated",
                True,
                True,
                share.micro_batch_size,
                ckpt,
                cap(batch),
                len(shard_group(range(world), rank, profile.node_of, plan.trainer_sharding)),
                train_res,
                reward_res,
                generation_copy=engine,
                sequence_parallel=plan.sequence_parallel,
            )
        return loads
    trainers, generators = plan.trainer_ranks(world), plan.generator_ranks(world)
    if plan.system == "digenrl":
        gen_batch = cap(plan.fragment_size(w))
    else:
        members = len(generators) // plan.generator_sequence_parallel  # a group generates one fragment
        gen_batch = cap(-(-w.prompts_per_iteration * w.group_size // members))  # separate.py
    tag = plan.system == "digenrl" and plan.tag
    trainer = RankLoad(
        "trainer",
        True,
        tag,
        mb,
        ckpt,
        gen_batch if tag else 0,
        len(shard_group(trainers, trainers[0], profile.node_of, plan.trainer_sharding)),
        grads_while_generating=tag and not plan.park_grads,
        sequence_parallel=plan.sequence_parallel,
    )
    generator = RankLoad(
        "generator", False, True, gen_batch=gen_batch, sequence_parallel=plan.generator_sequence_parallel
    )
    return {**dict.fromkeys(trainers, trainer), **dict.fromkeys(generators, generator)}


def check_plan(
    profile: HardwareProfile, costs: DeviceCosts, workload: Workload, plan: RunPlan
) -> list[RankMemory]:
    """Every rank's predicted peak for ``plan`` as it stands (its knobs, else the workload's)."""
    w = plan.effective_workload(workload)
    choice = (
        w.micro_batch_size,
        w.activation_checkpointing,
        w.samples_per_forward,
        plan.train_resident,
        plan.reward_resident,
    )
    loads = _loads(plan, w, profile, choice)
    return [rank_memory(profile, r, costs.for_rank(r), load, w.cfg) for r, load in sorted(loads.items())]


def check_config(cfg: Config, profile: HardwareProfile, costs: dict[str, CostModel]) -> list[RankMemory]:
    """:func:`check_plan` of a run's config on ``profile`` with its device types' cost models: the estimate a
    run's startup check (digenrl/validation.py) and the report against measured peaks
    (digenrl/reports/memory_check.py) both price."""
    return check_plan(
        profile, DeviceCosts(profile, costs), Workload.from_config(cfg), RunPlan.from_config(cfg, profile)
    )


def _all_fit(profile: HardwareProfile, costs: DeviceCosts, loads: dict[int, RankLoad], cfg: bool) -> bool:
    """Whether every rank fits; ranks of one device type with one load are checked once."""
    seen: set[tuple[str, RankLoad]] = set()
    for rank, load in loads.items():
        key = (profile.device_type(rank).name, load)
        if key in seen:
            continue
        seen.add(key)
        if not rank_memory(profile, rank, costs.for_rank(rank), load, cfg).fits:
            return False
    return True


def fit_plan(profile: HardwareProfile, costs: DeviceCosts, workload: Workload, plan: RunPlan) -> Fit:
    """``plan`` with the cheapest memory knobs every rank can run: micro-batch (the plan's, else up to the
    largest measured, or smaller), activation checkpointing, samples per generator forward (the plan's or
    the workload's, or smaller), and — colocated — parking the optimizer state or the reward model
    (:mod:`digenrl.sim.residency`). Cheapest = least estimated busy time (training per unit at that
    micro-batch, generation per sample at that batch, bytes moved). That estimate does not see
    ``colocated-overlap``'s overlap, so such a plan keeps its samples per forward — its sub-batch — unless
    no other knob makes it fit. None if nothing fits."""
    w = workload
    types = list(costs.by_type.values())
    if not all(c.has_memory(w.cfg) for c in types):
        return Fit(plan, ("memory not checked: the cost file has no measured peaks",), checked=False)
    # the workload's micro-batch, smaller ones, and larger ones up to the largest measured (each system at
    # its best micro-batch size, docs/design.md §4)
    measured = max(max(c.train_points.get(CFG_KEYS[w.cfg], {1: 0})) for c in types)
    mbs = _halvings(plan.micro_batch_size or max(w.micro_batch_size, measured))
    ckpts = (False, True)
    # samples per generator forward: the plan's (else the workload's) or smaller. colocated-overlap keeps
    # its sub-batch — the planner proposes several (Planner.baseline_plans), the score below does not see
    # the overlap — and lowers it only where memory requires, largest first (0: one group, the runtime's
    # rule, schedules/colocated.py overlap_sub_batches); other systems may also grow an unset one
    top = plan.samples_per_forward if plan.samples_per_forward is not None else w.samples_per_forward
    keep_spf = plan.system == "colocated-overlap"
    if keep_spf:
        spfs = [top, *_halvings(top or w.group_size)[1:]]
    else:
        spfs = [0, *_halvings(top or 64)] if not top else _halvings(top)
    residencies = [(True, True)]
    if plan.colocated and plan.system != "colocated-engine":  # the engine's switch decides what moves
        residencies += [(False, True), (True, False), (False, False)]
        if plan.system == "colocated-overlap":  # the runtime scores during generation: reward resident
            residencies = [r for r in residencies if r[1]]
    slowest = max(types, key=lambda c: c.train_unit_s(1, w.cfg))
    best: tuple[int, float, tuple] | None = None
    for train_res, reward_res in residencies:
        moved = (0 if train_res else 2 * slowest.optimizer_bytes) + (
            0 if reward_res else 2 * slowest.reward_param_bytes
        )
        move_s = moved / (profile.links.host_device_gbps * 1e9)
        for mb in mbs:
            for ckpt in ckpts:
                unit = slowest.train_unit_s(mb, w.cfg, ckpt)
                for spf in spfs:
                    choice = (mb, ckpt, spf, train_res, reward_res)
                    loads = _loads(plan, w, profile, choice)
                    if not _all_fit(profile, costs, loads, w.cfg):
                        continue
                    batch = max(load.gen_batch for load in loads.values())
                    per_sample = w.num_steps * slowest.generator_step_s(max(batch, 1), w.cfg) / max(batch, 1)
                    score = unit * w.units_per_iteration + per_sample * w.samples_per_iteration + move_s
                    lowered = spfs.index(spf) if keep_spf else 0  # how far the kept batch was lowered
                    if best is None or lowered < best[0] or (lowered == best[0] and score < best[1] - 1e-12):
                        best = (lowered, score, choice)
    if best is None:
        frugal_reward = not plan.colocated or plan.system in ("colocated-overlap", "colocated-engine")
        frugal = plan.with_(
            micro_batch_size=1,
            activation_checkpointing=True,
            samples_per_forward=1,
            train_resident=not plan.colocated or plan.system == "colocated-engine",
            reward_resident=frugal_reward,
        )
        worst = max(check_plan(profile, costs, w, frugal), key=lambda m: m.peak - m.capacity)
        return Fit(
            None, (f"does not fit even at micro-batch 1 with activation checkpointing: {worst.describe()}",)
        )
    mb, ckpt, spf, train_res, reward_res = best[2]
    changes = {
        "micro_batch_size": mb if mb != w.micro_batch_size else None,
        "activation_checkpointing": ckpt if ckpt != w.activation_checkpointing else None,
        "samples_per_forward": spf if spf != w.samples_per_forward else None,
        "train_resident": train_res,
        "reward_resident": reward_res,
    }
    fitted = plan.with_(**changes)
    notes = []
    if mb != w.micro_batch_size:
        notes.append(f"micro-batch {w.micro_batch_size} -> {mb}")
    if ckpt != w.activation_checkpointing:
        notes.append("activation checkpointing on" if ckpt else "activation checkpointing off")
    if spf != top:
        notes.append(f"{spf} samples per generator forward")
    if not train_res:
        notes.append("optimizer state parked")
    if not reward_res:
        notes.append("reward model parked")
    return Fit(fitted, tuple(notes))
