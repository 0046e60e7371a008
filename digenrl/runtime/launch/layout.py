"""Which global rank plays which role, and the process groups each pool talks over (docs/design.md §2).

A :class:`Layout` is pure data, computed identically on every rank from ``pools.*`` and the world size that
torchrun started: all-zero pools mean ``colocated`` (every rank generates *and* trains, phases alternate);
otherwise the layout is ``separate`` with ranks ``[0, trainers)`` training (rank 0 writes metrics and
checkpoints), the next ``generators`` ranks generating and the last ``scorers`` ranks running a heavy reward
model. Every inconsistency is a start-up :class:`~digenrl.config.ConfigError` naming the ``pools.*`` keys,
so a bad launch fails before any model is built.

:func:`build_process_groups` turns a layout into ``torch.distributed`` groups. ``dist.new_group`` is a
collective over the *whole* world: every rank must call it, in the same order, with the same rank lists —
including ranks that will not be members (they receive a non-member handle). Calling it only on members,
or in a rank-dependent order, hangs or mis-pairs communicators. :func:`build_process_groups` therefore
creates every group on every rank in one fixed order (trainer, generator, scorer, sync) and only then keeps,
per rank, the handles of the groups it belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

import torch.distributed as dist

from digenrl.config import ConfigError

LAYOUT_KINDS = ("colocated", "separate")
ROLES = ("colocated", "trainer", "generator", "scorer")
_POOL_KEYS = "pools.trainers + pools.generators + pools.scorers"


@dataclass(frozen=True)
class Layout:
    """Role of every global rank. In a colocated layout every rank is in both trainer and generator pools."""

    kind: str
    world_size: int
    trainer_ranks: tuple[int, ...]
    generator_ranks: tuple[int, ...]
    scorer_ranks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in LAYOUT_KINDS:
            raise ValueError(
                f"Layout.kind={self.kind!r} is not allowed; choose one of: {', '.join(LAYOUT_KINDS)}"
            )

    @property
    def is_colocated(self) -> bool:
        return self.kind == "colocated"

    @property
    def sync_source(self) -> int:
        """The trainer rank that broadcasts new weights to the generators (first rank of the trainer pool)."""
        return self.trainer_ranks[0]

    @property
    def sync_ranks(self) -> tuple[int, ...]:
        """Members of the weight-sync group: the source trainer rank and every generator rank."""
        return (self.sync_source, *self.generator_ranks)

    def role_of(self, rank: int) -> str:
        """ "colocated" | "trainer" | "generator" | "scorer"."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be an int in [0, {self.world_size}), got {rank!r}")
        if self.is_colocated:
            return "colocated"
        if rank in self.trainer_ranks:
            return "trainer"
        if rank in self.generator_ranks:
            return "generator"
        return "scorer"

    def ranks_of(self, role: str) -> tuple[int, ...]:
        """Global ranks of a pool ("trainer" | "generator" | "scorer"); colocated ranks are in both pools."""
        pools = {
            "trainer": self.trainer_ranks,
            "generator": self.generator_ranks,
            "scorer": self.scorer_ranks,
        }
        if role not in pools:
            raise ValueError(f"role={role!r} is not a pool; choose one of: {', '.join(pools)}")
        return pools[role]


class Pools(Protocol):
    """The ranks of each pool: a run's plan (:class:`digenrl.plan.RunPlan`, what a system passes) or the
    config's ``pools`` section."""

    @property
    def trainers(self) -> int: ...

    @property
    def generators(self) -> int: ...

    @property
    def scorers(self) -> int: ...


def build_layout(
    pools: Pools, world_size: int, *, needs_scorer_model: bool, reward_name: str | None = None
) -> Layout:
    """The layout of a run, or a :class:`ConfigError` naming the ``pools.*`` keys that do not fit.

    Args:
        pools: the plan's pools (:class:`Pools`); all zero = colocated.
        world_size: the number of ranks torchrun started.
        needs_scorer_model: whether the configured reward runs a model that scorer ranks could host; scorer
            ranks for a model-free reward would idle forever.
        reward_name: the configured reward, only quoted in the error message.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    counts = {"trainers": pools.trainers, "generators": pools.generators, "scorers": pools.scorers}
    for key, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"pools.{key} must be an integer >= 0, got {value!r}")
    if not any(counts.values()):
        everyone = tuple(range(world_size))
        return Layout("colocated", world_size, everyone, everyone, ())
    if pools.scorers > 0 and not needs_scorer_model:
        quoted = f"reward.name={reward_name!r}" if reward_name is not None else "the configured reward.name"
        raise ConfigError(
            f"pools.scorers={pools.scorers} but {quoted} needs no reward model to host; "
            "set pools.scorers=0 or choose a reward with a model (reward.name / reward.weights_path)"
        )
    if pools.trainers == 0 or pools.generators == 0:
        empty = "pools.trainers" if pools.trainers == 0 else "pools.generators"
        raise ConfigError(
            f"{empty}=0 in a separate layout: a separate layout needs at least one trainer and one generator "
            f"rank (got pools.trainers={pools.trainers}, pools.generators={pools.generators}); "
            "set all pools.* to 0 for a colocated run"
        )
    total = sum(counts.values())
    if total > world_size:
        raise ConfigError(
            f"{_POOL_KEYS} = {total} exceeds the {world_size} ranks torchrun started; "
            f"launch {total} ranks or shrink the pools"
        )
    if total != world_size:
        raise ConfigError(
            f"{_POOL_KEYS} = {total} but torchrun started {world_size} ranks; every rank needs a pool, "
            f"so the pools must add up to {world_size}"
        )
    t, g = pools.trainers, pools.generators
    return Layout(
        "separate",
        world_size,
        tuple(range(t)),
        tuple(range(t, t + g)),
        tuple(range(t + g, world_size)),
    )


@dataclass
class ProcessGroups:
    """This rank's handles of the pool groups (None where this rank is not a member or the pool is empty).

    Colocated: ``trainer_group`` and ``generator_group`` are the default (WORLD) group and there is no
    ``sync_group`` (trainer and generator share the weights). Separate: one group per pool and
    ``sync_group`` = source trainer rank + all generators (the weight broadcast). Single process: all None.
    """

    layout: Layout
    rank: int
    trainer_group: Any = None
    generator_group: Any = None
    scorer_group: Any = None
    sync_group: Any = None

    def this_rank_pool_group(self, rank: int | None = None) -> Any:
        """The group of the pool ``rank`` (default: this rank) belongs to; None if this rank holds no handle.

        Only a member holds a usable handle, so asking for another rank's pool returns None unless both
        share it.
        """
        rank = self.rank if rank is None else rank
        role = self.layout.role_of(rank)
        group = {
            "colocated": self.trainer_group,
            "trainer": self.trainer_group,
            "generator": self.generator_group,
            "scorer": self.scorer_group,
        }[role]
        if self.layout.role_of(self.rank) != role:
            return None
        return group


def build_process_groups(
    layout: Layout, backend: str | None = None, *, timeout_s: float | None = None
) -> ProcessGroups:
    """Create the pool groups; a collective: **every rank must call this**, with the same layout.

    Args:
        layout: from :func:`build_layout`, identical on every rank.
        backend: backend of the new groups (None: the default group's).
        timeout_s: collective timeout of the new groups (None: the default group's timeout). Every collective
            on these groups — weight broadcasts included — fails after it (gloo raises; NCCL's watchdog
            aborts the process unless ``TORCH_NCCL_BLOCKING_WAIT=1``).
    """
    if not (dist.is_available() and dist.is_initialized()):
        if layout.world_size != 1:
            raise ValueError(
                f"layout has {layout.world_size} ranks but torch.distributed is not initialised; "
                "launch with torchrun (or call init_distributed first)"
            )
        return ProcessGroups(layout, rank=0)
    world = dist.get_world_size()
    if world != layout.world_size:
        raise ValueError(f"layout was built for {layout.world_size} ranks but the default group has {world}")
    rank = dist.get_rank()
    if layout.is_colocated:
        everyone = dist.group.WORLD if world > 1 else None
        return ProcessGroups(layout, rank, trainer_group=everyone, generator_group=everyone)
    kwargs: dict[str, Any] = {"backend": backend}
    if timeout_s is not None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        kwargs["timeout"] = timedelta(seconds=timeout_s)
    # Fixed order on every rank (see the module docstring): trainer, generator, scorer, sync.
    ordered = [
        ("trainer_group", layout.trainer_ranks),
        ("generator_group", layout.generator_ranks),
        ("scorer_group", layout.scorer_ranks),
        ("sync_group", layout.sync_ranks),
    ]
    handles: dict[str, Any] = {}
    for name, ranks in ordered:
        if not ranks:
            handles[name] = None
            continue
        group = dist.new_group(list(ranks), **kwargs)
        handles[name] = group if rank in ranks else None
    return ProcessGroups(layout, rank, **handles)
