"""Which schedule to simulate and its knobs: the systems of docs/design.md §4 and DigenRL's switches (§3).

Rank placement follows :mod:`digenrl.runtime.layout`: in a separate layout ranks ``[0, trainers)`` train
and the next ``generators`` ranks generate; colocated schedules use every rank of the profile. Every knob
that the runtime has maps to its config key (:meth:`SchedulePlan.overrides`), so a plan the planner
chooses is a command line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from digenrl.async_policy.tcss import resolve_switch
from digenrl.config import (
    COLOCATED_SPLITS,
    COLOCATED_SYSTEMS,
    GAP_ASSIGNMENTS,
    SYSTEMS,
    TRAIN_ORDERS,
    ConfigError,
)
from digenrl.data.rank_shares import RankShare, rank_shares
from digenrl.gap.fragments import FragmentPlan
from digenrl.sim.channel import TRANSPORTS
from digenrl.sim.workload import Workload

#: How a colocated schedule shares the logical batch (``colocated.split``, digenrl/data/rank_shares.py):
#: ``equal`` samples per rank, or samples and micro-batch size in proportion to each device's
#: ``relative_speed`` (the strongest colocated plan on a heterogeneous profile).
WORK_SPLITS = COLOCATED_SPLITS


@dataclass(frozen=True)
class SchedulePlan:
    """A schedule and its knobs. Fields that do not apply to ``system`` are ignored.

    Separate systems: ``trainers`` / ``generators`` pool sizes; ``transport`` of trajectories
    (``rendezvous``: a send returns when the receiver has taken it, as the separate baselines ship —
    reap before launch; ``buffered``: the sender goes on, as digenrl's ``FragmentStream`` and TSP
    hand-offs do, :mod:`digenrl.sim.channel`). None = what the runtime does for ``system``
    (:attr:`transport_mode`).
    Every system: ``micro_batch_size`` / ``activation_checkpointing`` / ``samples_per_forward`` (None =
    the workload's ``trainer.micro_batch_size`` / ``trainer.activation_checkpointing`` /
    ``sampler.samples_per_forward``; the planner lowers them where memory requires,
    :mod:`digenrl.planning.memory`).
    ``colocated-*``: ``train_resident`` / ``reward_resident`` (``residency.*``: False parks the optimizer
    state during generation and accumulation, onloading it before the optimizer step, and the reward
    weights outside scoring; :mod:`digenrl.sim.residency`), ``work_split`` (:data:`WORK_SPLITS`),
    ``overlap_sub_batches`` (``colocated-overlap``: each rank's share is generated in this many
    sub-batches, scoring of one overlapping generation of the next; None = the runtime's rule,
    ``samples_per_forward // G`` groups per sub-batch; any other value is a simulator what-if that
    ``run_train.py`` cannot run, so the planner never proposes it).
    ``separate-async`` (UniRL, docs/references.md [000]): ``max_staleness`` (weight syncs a buffered
    batch may lag before eviction), ``weight_sync_interval`` (optimizer steps between syncs),
    ``reap_before_launch``.
    ``digenrl``: ``gap`` (stream fragments to the trainer), ``fragment_groups`` (F prompt groups per
    fragment) or ``fragment_samples`` (S samples per fragment, any divisor of the batch, also smaller than a
    group: a group's advantages then wait for all its fragments' rewards; 0 = ``fragment_groups``),
    ``fragment_assignment`` (``digenrl.gap.fragments.FragmentPlan``: ``dynamic``, the runtime default —
    a shared ticket queue, the first free pipeline takes the next fragment; ``round-robin`` —
    fragment f → pipeline f mod D), ``train_order`` (``index``: trainers train fragments in index order,
    the runtime default; ``arrival``: whichever is ready first), ``tsp_stages`` (S stages
    per generator pipeline; D = generators / S pipelines), ``tag``
    with ``tag_budget`` (fragments each trainer rank may generate per iteration; None = pick the budget
    with the best predicted throughput, 0 included, so TAG is only inserted where it shortens the
    makespan) and ``park_grads`` (``tag.park_grads``: move pending gradients to the host while helping),
    ``tcss`` (one-step-stale generation across the iteration boundary) with ``tcss_switch``
    (``tcss.switch``: ``auto`` or a fragment index s — fragments [0, s) of iteration k+1 use θ_k, a
    pipeline reaching fragment s waits for θ_{k+1}; ``timing`` — θ_{k+1} applies at the next fragment
    boundary after it arrives; :mod:`digenrl.async_policy.tcss`).
    """

    system: str
    trainers: int = 0
    generators: int = 0
    micro_batch_size: int | None = None
    activation_checkpointing: bool | None = None
    samples_per_forward: int | None = None
    train_resident: bool = True
    reward_resident: bool = True
    work_split: str = "equal"
    overlap_sub_batches: int | None = None
    max_staleness: int = 1
    weight_sync_interval: int = 1
    reap_before_launch: bool = True
    transport: str | None = None
    gap: bool = True
    fragment_assignment: str = "dynamic"
    train_order: str = "index"
    fragment_groups: int = 1
    fragment_samples: int = 0
    tsp_stages: int = 1
    tag: bool = False
    tag_budget: int | None = None
    park_grads: bool = False
    tcss: bool = False
    tcss_switch: str = "auto"

    def __post_init__(self) -> None:
        if self.system not in SYSTEMS:
            raise ValueError(f"system={self.system!r} is not allowed; choose one of: {', '.join(SYSTEMS)}")
        if self.overlap_sub_batches is not None and self.overlap_sub_batches < 1:
            raise ValueError(
                f"SchedulePlan.overlap_sub_batches must be >= 1 or None, got {self.overlap_sub_batches}"
            )
        for name in ("micro_batch_size", "samples_per_forward"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"SchedulePlan.{name} must be None or an int >= 0, got {value!r}")
        if self.micro_batch_size == 0:
            raise ValueError("SchedulePlan.micro_batch_size must be >= 1")
        for name in ("weight_sync_interval", "fragment_groups", "tsp_stages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SchedulePlan.{name} must be an int >= 1, got {value!r}")
        for name in ("trainers", "generators", "max_staleness", "fragment_samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"SchedulePlan.{name} must be an int >= 0, got {value!r}")
        if self.transport is not None and self.transport not in TRANSPORTS:
            raise ValueError(
                f"SchedulePlan.transport={self.transport!r} is not allowed; choose one of: "
                + ", ".join(TRANSPORTS)
            )
        for name, allowed in (
            ("fragment_assignment", GAP_ASSIGNMENTS),
            ("train_order", TRAIN_ORDERS),
            ("work_split", WORK_SPLITS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"SchedulePlan.{name}={getattr(self, name)!r} is not allowed; choose one of: "
                    + ", ".join(allowed)
                )
        if self.tag_budget is not None and self.tag_budget < 0:
            raise ValueError(f"SchedulePlan.tag_budget must be >= 0 or None, got {self.tag_budget}")

    @property
    def transport_mode(self) -> str:
        """The trajectory transport: as given, or the runtime's for this system."""
        if self.transport is not None:
            return self.transport
        return "buffered" if self.system == "digenrl" else "rendezvous"

    @property
    def colocated(self) -> bool:
        return self.system in COLOCATED_SYSTEMS

    @property
    def staleness(self) -> int:
        """Most policy versions a trained trajectory may lag (docs/design.md §4 "Equal staleness")."""
        if self.system == "separate-async":
            return self.max_staleness
        return 1 if self.system == "digenrl" and self.tcss else 0

    def effective_workload(self, workload: Workload) -> Workload:
        """``workload`` with this plan's micro-batch, checkpointing and generator batch cap."""
        changes = {
            "micro_batch_size": self.micro_batch_size,
            "activation_checkpointing": self.activation_checkpointing,
            "samples_per_forward": self.samples_per_forward,
        }
        return replace(workload, **{k: v for k, v in changes.items() if v is not None})

    def trainer_ranks(self, world_size: int) -> tuple[int, ...]:
        return tuple(range(world_size)) if self.colocated else tuple(range(self.trainers))

    def generator_ranks(self, world_size: int) -> tuple[int, ...]:
        if self.colocated:
            return tuple(range(world_size))
        return tuple(range(self.trainers, self.trainers + self.generators))

    def colocated_shares(self, workload: Workload, speeds: Sequence[float]) -> list[RankShare]:
        """Every rank's share of a colocated iteration as the runtime cuts it
        (:func:`digenrl.data.rank_shares.rank_shares`; ``speeds``: each rank's ``relative_speed``)."""
        w = self.effective_workload(workload)
        return rank_shares(w.prompts_per_iteration, w.group_size, speeds, w.micro_batch_size, self.work_split)

    def check(self, world_size: int, workload: Workload, speeds: Sequence[float] | None = None) -> None:
        """Raise ValueError if the plan cannot run ``workload`` on ``world_size`` devices (the runtime's
        start-up checks that a plan can violate: ``digenrl/systems/colocated_sync.py`` and
        ``digenrl/systems/digenrl_system.py`` ``check``). ``speeds``: each rank's ``relative_speed``
        (None: all equal), which the speed split reads."""
        p = workload.prompts_per_iteration
        if self.colocated:
            try:
                self.colocated_shares(workload, [1.0] * world_size if speeds is None else speeds)
            except ValueError as error:
                raise ValueError(f"{self.system}: {error} (digenrl/data/rank_shares.py)") from None
            return
        if self.trainers < 1 or self.generators < 1:
            raise ValueError(
                f"{self.system} needs trainers >= 1 and generators >= 1 (separate pools), "
                f"got trainers={self.trainers}, generators={self.generators}"
            )
        if self.trainers + self.generators > world_size:
            raise ValueError(
                f"trainers + generators = {self.trainers + self.generators} exceeds the profile's "
                f"{world_size} devices"
            )
        if self.system in ("separate-sync", "separate-async"):  # digenrl/systems/separate.py
            samples = p * workload.group_size
            if samples % self.generators:
                raise ValueError(
                    f"P·G={samples} samples are not divisible by {self.generators} generators (the same "
                    "number of samples each)"
                )
            per_generator = samples // self.generators
            if per_generator < self.trainers:
                raise ValueError(
                    f"each generator produces {per_generator} samples, fewer than {self.trainers} trainers"
                )
        if self.system == "digenrl":
            if self.generators % self.tsp_stages:
                raise ValueError(
                    f"generators ({self.generators}) must be a multiple of tsp_stages ({self.tsp_stages}): "
                    "the generator pool is D pipelines x S stages"
                )
            if self.tsp_stages > workload.num_steps:
                raise ValueError(
                    f"tsp_stages ({self.tsp_stages}) must be <= num_steps ({workload.num_steps}): "
                    "every stage owns at least one step"
                )
            samples = self.fragment_size(workload)
            if workload.trainer_mode == "full" and self.trainers > 1 and samples < self.trainers:
                raise ValueError(
                    f"a fragment of {samples} samples has fewer than {self.trainers} sharded (FSDP2) trainers"
                    " (each trains every fragment as a collective and needs a unit of it: runtime check)"
                )
            if self.fragment_plan(workload).splits_groups and self.transport_mode == "rendezvous":
                raise ValueError(
                    "fragments that split a group need buffered sends (the runtime's): a trainer holding a "
                    "fragment waits for the rest of its groups' rewards, which a rendezvous send would block"
                )
            if self.tag and self.fragment_assignment != "dynamic":
                raise ValueError(
                    "TAG needs fragment_assignment='dynamic' (helpers claim from the shared queue)"
                )
            if self.tcss:
                self.switch_fragment(workload)  # auto, timing or a fragment index (ValueError)
            if self.tag and workload.trainer_mode == "full" and self.trainers > 1:
                raise ValueError(
                    "TAG needs a trainer that can generate alone; full fine-tuning shards the model (FSDP2)"
                )

    @property
    def pipelines(self) -> int:
        return self.generators // self.tsp_stages

    def fragment_plan(self, workload: Workload) -> FragmentPlan:
        """The runtime's fragment plan for this schedule (the simulator and the runtime share it)."""
        return FragmentPlan(
            workload.prompts_per_iteration,
            self.fragment_groups,
            self.pipelines,
            self.fragment_assignment,
            group_size=workload.group_size,
            sample_size=self.fragment_samples,
        )

    def fragment_size(self, workload: Workload) -> int:
        """Samples per fragment."""
        return self.fragment_samples or self.fragment_groups * workload.group_size

    def num_fragments(self, workload: Workload) -> int:
        return self.fragment_plan(workload).num_fragments

    def switch_fragment(self, workload: Workload) -> int | None:
        """TCSS's switch fragment as the runtime resolves ``tcss.switch`` (None: ``timing``)."""
        try:
            return resolve_switch(self.tcss_switch, self.num_fragments(workload))
        except ConfigError as error:
            raise ValueError(str(error)) from None

    def with_(self, **changes: Any) -> SchedulePlan:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def _memory_knobs(self) -> list[str]:
        knobs = []
        if self.micro_batch_size is not None:
            knobs.append(f"micro-batch {self.micro_batch_size}")
        if self.activation_checkpointing:
            knobs.append("activation ckpt")
        if self.samples_per_forward:
            knobs.append(f"{self.samples_per_forward} samples/forward")
        return knobs

    def describe(self) -> str:
        """One line with only the knobs that matter for this system."""
        if self.colocated:
            knobs = []
            if self.work_split != "equal":
                knobs.append(f"speed-proportional split ({self.work_split})")
            if not self.train_resident:
                knobs.append("optimizer parked")
            if not self.reward_resident:
                knobs.append("reward parked")
            if self.system == "colocated-overlap":
                sub = (
                    "runtime rule"
                    if self.overlap_sub_batches is None
                    else f"{self.overlap_sub_batches} (simulator only)"
                )
                knobs.append(f"sub_batches={sub}")
            knobs += self._memory_knobs()
            return f"{self.system} ({', '.join(knobs)})" if knobs else self.system
        pools = f"{self.trainers} trainers + {self.generators} generators"
        if self.system == "separate-async":
            return (
                f"{self.system} ({pools}, max_staleness={self.max_staleness}, "
                f"sync_interval={self.weight_sync_interval}, "
                f"{'reap-before-launch' if self.reap_before_launch else 'launch-first'})"
            )
        if self.system == "digenrl":
            tag = "off"
            if self.tag:
                tag = "auto" if self.tag_budget is None else f"{self.tag_budget}/trainer/iter"
            extra = "".join(f", {k}" for k in self._memory_knobs())
            return (
                f"digenrl ({pools}, D={self.pipelines} x S={self.tsp_stages}, {self._fragment_text()}"
                f"/fragment, GAP={'on' if self.gap else 'off'}, TAG={tag}, "
                f"TCSS={self._tcss_text()}; {self.fragment_assignment}, "
                f"{self.train_order} order, {self.transport_mode}{extra})"
            )
        extra = "".join(f", {k}" for k in self._memory_knobs())
        return f"{self.system} ({pools}, {self.transport_mode}{extra})"

    def _fragment_text(self) -> str:
        if self.fragment_samples:
            return f"{self.fragment_samples} samples"
        return f"F={self.fragment_groups} groups"

    def _tcss_text(self) -> str:
        if not self.tcss:
            return "off"
        return "on" if self.tcss_switch == "auto" else f"on, switch {self.tcss_switch}"

    def overrides(self) -> list[str]:
        """The ``experiments/run_train.py`` overrides that run this plan (``key=value``). A knob the runtime
        fixes (the separate baselines' transport) is left out; :meth:`describe` names it."""
        out = [f"system={self.system}"]
        if self.micro_batch_size is not None:
            out.append(f"trainer.micro_batch_size={self.micro_batch_size}")
        if self.activation_checkpointing is not None:
            out.append(f"trainer.activation_checkpointing={str(self.activation_checkpointing).lower()}")
        if self.samples_per_forward is not None:
            out.append(f"sampler.samples_per_forward={self.samples_per_forward}")
        if self.colocated:
            if self.work_split != "equal":
                out.append(f"colocated.split={self.work_split}")
            if not self.train_resident:
                out.append("residency.train_resident=false")
            if not self.reward_resident:
                out.append("residency.reward_resident=false")
            return out
        out += [f"pools.trainers={self.trainers}", f"pools.generators={self.generators}"]
        if self.system == "separate-async":
            out.append(f"asynchrony.max_staleness={self.max_staleness}")
        if self.system == "digenrl":
            out += [
                f"gap.enabled={str(self.gap).lower()}",
                (
                    f"gap.fragment_samples={self.fragment_samples}"
                    if self.fragment_samples
                    else f"gap.fragment_groups={self.fragment_groups}"
                ),
                f"gap.assignment={self.fragment_assignment}",
                f"gap.train_order={self.train_order}",
                f"tsp.stages={self.tsp_stages}",
                f"tag.enabled={str(self.tag).lower()}",
                f"tcss.enabled={str(self.tcss).lower()}",
            ]
            if self.tcss:
                out.append(f"tcss.switch={self.tcss_switch}")
            if self.tag:
                if self.tag_budget is None:
                    out.append("tag.policy=auto")
                else:
                    out += ["tag.policy=always", f"tag.max_fragments={self.tag_budget}"]
                if self.park_grads:
                    out.append("tag.park_grads=true")
        return out
