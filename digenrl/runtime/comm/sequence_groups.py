"""The process groups of Ulysses sequence parallelism (``trainer.sequence_parallel`` /
``sampler.sequence_parallel``; docs/models.md, "Sequence parallelism").

A pool sharded N ways is cut into groups of N consecutive ranks; each group runs every transformer forward
together on the same samples (each rank holding 1/N of the tokens: digenrl/models/sequence_parallel.py), so
it is one data-parallel member of its pool. :func:`build_sequence_groups` turns that into
``torch.distributed`` groups: ``dist.new_group`` is a collective over the whole world
(digenrl/runtime/launch/layout.py), so every rank of the run — the other pool's and scorer ranks too —
creates every group of the pool in the same order (the sequence groups, then the data groups, then one
group per rank for the diffusers mesh's size-1 ``ring`` dimension) and keeps the handles of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from digenrl.runtime.comm.distributed import named_collective


@dataclass(frozen=True)
class SequenceGroups:
    """This rank's handles in a pool sharded ``degree`` ways (module docstring).

    ``sequence_group``: this rank's group. ``single_rank_group``: this rank alone (the size-1 ``ring``
    dimension of the diffusers mesh). ``data_group``: the pool's ranks at this rank's position in their
    group, one per group: samples are shared out, counted and gathered over it, so each sample counts once.
    ``member``: this rank's group's index in the pool (its data-parallel index), ``members`` their number;
    ``local``: this rank's position in its group (0: the group's first rank, the one that ships its data).
    """

    degree: int
    sequence_group: Any  # dist.ProcessGroup
    single_rank_group: Any
    data_group: Any
    member: int
    members: int
    local: int


def build_sequence_groups(
    pool_ranks: Sequence[int], degree: int, *, backend: str | None = None, timeout_s: float | None = None
) -> SequenceGroups | None:
    """The sequence-parallel groups of one pool (global ranks); a collective: **every rank of the world
    calls it** with the same arguments. Returns this rank's handles; None for ``degree`` 1 (nothing is
    created) or on a rank outside the pool. The start-up check (digenrl/validation.py) has refused a degree
    that does not divide the pool. Creating a group waits for its members; a wait past ``timeout_s`` (the
    group's collective timeout too) fails naming this rank and the group."""
    if degree == 1:
        return None
    ranks = tuple(pool_ranks)
    if len(ranks) % degree:
        raise ValueError(f"sequence-parallel degree {degree} does not divide the pool's {len(ranks)} ranks")
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("sequence parallelism needs torch.distributed (launch with torchrun)")
    me = dist.get_rank()
    kwargs: dict[str, Any] = {"backend": backend}
    if timeout_s is not None:
        kwargs["timeout"] = timedelta(seconds=timeout_s)
    members = len(ranks) // degree
    ordered = [ranks[m * degree : (m + 1) * degree] for m in range(members)]
    ordered += [ranks[i::degree] for i in range(degree)]
    ordered += [(r,) for r in ranks]
    handles: dict[tuple[int, ...], Any] = {}
    for group in ordered:  # the same order on every rank
        with named_collective(f"rank {me}: creating the sequence-parallel group {list(group)}"):
            handles[group] = dist.new_group(list(group), **kwargs)
    if me not in ranks:
        return None
    member, local = divmod(ranks.index(me), degree)
    return SequenceGroups(
        degree=degree,
        sequence_group=handles[ordered[member]],
        single_rank_group=handles[(me,)],
        data_group=handles[ranks[local::degree]],
        member=member,
        members=members,
        local=local,
    )
