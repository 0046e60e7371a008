"""Which schedule to simulate and its knobs: the systems of docs/design.md §4 and DigenRL's switches (§3).

Rank placement follows :mod:`digenrl.runtime.layout`: in a separate layout ranks ``[0, trainers)`` train
and the next ``generators`` ranks generate; colocated schedules use every rank of the profile.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from digenrl.gap.fragments import ASSIGNMENTS, FragmentPlan
from digenrl.sim.workload import Workload

SYSTEMS = ("colocated-sync", "colocated-overlap", "separate-sync", "separate-async", "digenrl")
COLOCATED_SYSTEMS = ("colocated-sync", "colocated-overlap")
TRANSPORTS = ("rendezvous", "buffered")
FRAGMENT_ASSIGNMENTS = ASSIGNMENTS  # the runtime's (digenrl/gap/fragments.py)
TRAIN_ORDERS = ("index", "arrival")


@dataclass(frozen=True)
class SchedulePlan:
    """A schedule and its knobs. Fields that do not apply to ``system`` are ignored.

    Separate systems: ``trainers`` / ``generators`` pool sizes; ``transport`` of trajectories
    (``rendezvous``: a send returns when the receiver has taken it, as the separate baselines ship —
    reap before launch; ``buffered``: the sender goes on, as digenrl's ``FragmentStream`` and TSP
    hand-offs do, :mod:`digenrl.sim.channel`). None = what the runtime does for ``system``
    (:attr:`transport_mode`).
    ``colocated-*``: ``residency`` (park the optimizer state during generation, onload it before the
    optimizer step; reward weights around scoring), ``overlap_sub_batches`` (``colocated-overlap``: each
    rank's share is generated in this many sub-batches, scoring of one overlapping generation of the
    next; None = the runtime's rule, ``samples_per_forward // G`` groups per sub-batch).
    ``separate-async`` (UniRL, docs/references.md [000]): ``max_staleness`` (weight syncs a buffered
    batch may lag before eviction), ``weight_sync_interval`` (optimizer steps between syncs),
    ``reap_before_launch``.
    ``digenrl``: ``gap`` (stream fragments to the trainer), ``fragment_groups`` (F prompt groups per
    fragment), ``fragment_assignment`` (``digenrl.gap.fragments.FragmentPlan``: ``dynamic``, the runtime
    default — a shared ticket queue, the first free pipeline takes the next fragment; ``round-robin`` —
    fragment f → pipeline f mod D), ``train_order`` (``index``: trainers train fragments in index order,
    the runtime default; ``arrival``: whichever is ready first), ``tsp_stages`` (S stages
    per generator pipeline; D = generators / S pipelines), ``tag``
    with ``tag_budget`` (fragments each trainer rank may generate per iteration; None = pick the budget
    with the best predicted throughput, 0 included, so TAG is only inserted where it shortens the
    makespan), ``tcss`` (one-step-stale generation across the iteration boundary).
    """

    system: str
    trainers: int = 0
    generators: int = 0
    residency: bool = True
    overlap_sub_batches: int | None = None
    max_staleness: int = 1
    weight_sync_interval: int = 1
    reap_before_launch: bool = True
    transport: str | None = None
    gap: bool = True
    fragment_assignment: str = "dynamic"
    train_order: str = "index"
    fragment_groups: int = 1
    tsp_stages: int = 1
    tag: bool = False
    tag_budget: int | None = None
    tcss: bool = False

    def __post_init__(self) -> None:
        if self.system not in SYSTEMS:
            raise ValueError(f"system={self.system!r} is not allowed; choose one of: {', '.join(SYSTEMS)}")
        if self.overlap_sub_batches is not None and self.overlap_sub_batches < 1:
            raise ValueError(
                f"SchedulePlan.overlap_sub_batches must be >= 1 or None, got {self.overlap_sub_batches}"
            )
        for name in ("weight_sync_interval", "fragment_groups", "tsp_stages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SchedulePlan.{name} must be an int >= 1, got {value!r}")
        for name in ("trainers", "generators", "max_staleness"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"SchedulePlan.{name} must be an int >= 0, got {value!r}")
        if self.transport is not None and self.transport not in TRANSPORTS:
            raise ValueError(
                f"SchedulePlan.transport={self.transport!r} is not allowed; choose one of: "
                + ", ".join(TRANSPORTS)
            )
        for name, allowed in (
            ("fragment_assignment", FRAGMENT_ASSIGNMENTS),
            ("train_order", TRAIN_ORDERS),
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

    def trainer_ranks(self, world_size: int) -> tuple[int, ...]:
        return tuple(range(world_size)) if self.colocated else tuple(range(self.trainers))

    def generator_ranks(self, world_size: int) -> tuple[int, ...]:
        if self.colocated:
            return tuple(range(world_size))
        return tuple(range(self.trainers, self.trainers + self.generators))

    def check(self, world_size: int, workload: Workload) -> None:
        """Raise ValueError if the plan cannot run ``workload`` on ``world_size`` devices."""
        if self.colocated:
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
            self.fragment_plan(workload)  # whole groups per fragment, equal fragments (ValueError)

    @property
    def pipelines(self) -> int:
        return self.generators // self.tsp_stages

    def fragment_plan(self, workload: Workload) -> FragmentPlan:
        """The runtime's fragment plan for this schedule (the simulator and the runtime share it)."""
        return FragmentPlan(
            workload.prompts_per_iteration, self.fragment_groups, self.pipelines, self.fragment_assignment
        )

    def num_fragments(self, workload: Workload) -> int:
        return self.fragment_plan(workload).num_fragments

    def with_(self, **changes: Any) -> SchedulePlan:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """One line with only the knobs that matter for this system."""
        if self.colocated:
            knobs = [f"residency={'on' if self.residency else 'off'}"]
            if self.system == "colocated-overlap":
                knobs.append(f"sub_batches={self.overlap_sub_batches or 'runtime rule'}")
            return f"{self.system} ({', '.join(knobs)})"
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
            return (
                f"digenrl ({pools}, D={self.pipelines} x S={self.tsp_stages}, F={self.fragment_groups} "
                f"groups/fragment, GAP={'on' if self.gap else 'off'}, TAG={tag}, "
                f"TCSS={'on' if self.tcss else 'off'}; {self.fragment_assignment}, "
                f"{self.train_order} order, {self.transport_mode})"
            )
        return f"{self.system} ({pools}, {self.transport_mode})"
