"""The trainer's process groups under ``trainer.sharding=hybrid`` (HSDP: shard inside a node, replicate across
nodes; docs/design.md "Hybrid sharding").

Which ranks shard together and which hold the same shard comes from one rule, shared with the simulator and
the memory model: :func:`digenrl.rules.schedule.shard_group` and :func:`~digenrl.rules.schedule.replica_group`
over the profile's ``node_of``. :func:`build_shard_groups` turns them into ``torch.distributed`` groups:
``dist.new_group`` is a collective over the whole world (digenrl/runtime/launch/layout.py), so every rank of
the run — generators and scorers of a separate layout too — creates every group in the same order (the node
groups in node order, then the replica groups in position order) and keeps the handles of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from digenrl.config import ConfigError
from digenrl.rules.schedule import hybrid_sharding_problem, replica_group, shard_group
from digenrl.runtime.comm.distributed import named_collective


@dataclass(frozen=True)
class ShardGroups:
    """One trainer rank's HSDP groups: ``shard`` (the trainer ranks of its node, among which FSDP2 shards
    weights, gradients and optimizer state) and ``replica`` (the ranks holding the same shard on the other
    nodes, over which the gradient shard is all-reduced once per optimizer step)."""

    shard_ranks: tuple[int, ...]
    replica_ranks: tuple[int, ...]
    shard: Any  # dist.ProcessGroup
    replica: Any  # dist.ProcessGroup


def build_shard_groups(
    trainer_ranks: Sequence[int],
    node_of: Callable[[int], int],
    *,
    backend: str | None = None,
    timeout_s: float | None = None,
) -> ShardGroups | None:
    """Create the HSDP groups of ``trainer_ranks`` (global ranks; ``node_of``: the hardware profile's);
    a collective: **every rank of the world calls it** with the same arguments. Returns this rank's groups,
    or None on a rank outside ``trainer_ranks``. Raises :class:`ConfigError` where the ranks cannot be
    sharded by node (one node, or unequal counts per node: the startup check's rule). Creating a group
    waits for its members; a wait past ``timeout_s`` (the group's collective timeout too) fails naming
    this rank and the group."""
    ranks = tuple(trainer_ranks)
    problem = hybrid_sharding_problem(ranks, node_of)
    if problem:
        raise ConfigError(problem)
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("trainer.sharding=hybrid needs torch.distributed (launch with torchrun)")
    me = dist.get_rank()
    shards = sorted({shard_group(ranks, r, node_of, "hybrid") for r in ranks}, key=lambda g: node_of(g[0]))
    replicas = [replica_group(ranks, r, node_of, "hybrid") for r in shards[0]]
    kwargs: dict[str, Any] = {"backend": backend}
    if timeout_s is not None:
        kwargs["timeout"] = timedelta(seconds=timeout_s)
    handles: list[tuple[str, tuple[int, ...], Any]] = []
    for kind, groups in (("shard", shards), ("replica", replicas)):
        for members in groups:
            what = f"rank {me}: creating the trainer.sharding=hybrid {kind} group {list(members)}"
            with named_collective(what):
                handles.append((kind, members, dist.new_group(list(members), **kwargs)))
    if me not in ranks:
        return None
    shard = next(h for h in handles if h[0] == "shard" and me in h[1])
    replica = next(h for h in handles if h[0] == "replica" and me in h[1])
    return ShardGroups(shard_ranks=shard[1], replica_ranks=replica[1], shard=shard[2], replica=replica[2])
