"""The policy version the generator pool holds, and the weight sync that advances it (docs/design.md §1,
step 5).

A sync is one broadcast from the first trainer rank (``Layout.sync_source``) to every generator rank of
``weight_sync_bytes`` (LoRA adapter or full weights), timed as a pipelined ring broadcast and booked on
the ports of all participants (:class:`~digenrl.sim.network.Network`). The source is busy for the whole
broadcast; generators are not (NCCL receives on a side stream), so a generator that is still working —
TCSS — keeps working and the new version takes effect at its next fragment boundary, while a generator
that waits for the version idles until the broadcast ends and the weights are loaded
(``CostModel.weight_load_s``). A sharded full fine-tune first gathers the whole weights on the source
(one ring all-gather over the trainer group, :func:`digenrl.sim.training.fsdp_gather_s`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from digenrl.runtime.observe.span_phases import Phase
from digenrl.sim.cluster import SimCluster
from digenrl.sim.des import Delay, Process
from digenrl.sim.training import fsdp_gather_s, sharded


class GeneratorWeights:
    """``version``: the newest policy every generator rank holds (all receive a broadcast together)."""

    def __init__(
        self,
        cluster: SimCluster,
        source: int,
        generators: Sequence[int],
        trainers: Sequence[int] = (),
    ) -> None:
        self.cluster = cluster
        self.source = source
        self.generators = tuple(generators)
        self.trainers = tuple(trainers) or (source,)
        self.version = 0
        self.changed = cluster.condition("generator weights")
        self.listeners: list = []  # further conditions to notify when a version arrives (TAG helpers)
        self._sync_start: dict[int, float] = {0: 0.0}

    def publish(self, version: int, **tags: Any) -> Process:
        """Broadcast ``version`` from the source trainer (the caller is the source's process)."""
        cluster = self.cluster
        cost = cluster.cost(self.source)
        ranks = [self.source, *self.generators]
        seconds = cluster.net.broadcast_s(ranks, cost.weight_sync_bytes)
        if seconds > 0:
            seconds += cost.message_latency_s
        if sharded(cluster, self.trainers):
            seconds += fsdp_gather_s(cluster, self.trainers, cost.weight_sync_bytes, self.source)
        start, end = cluster.net.reserve_group(cluster.now, ranks, seconds)
        self._sync_start[version] = start
        if end > start:
            for rank in ranks:
                cluster.log.add(rank, Phase.SYNC, start, end, policy_version=version, **tags)
        loaded = end + max((cluster.cost(g).weight_load_s for g in self.generators), default=0.0)
        if loaded > cluster.now:
            cluster.sim.call_at(loaded, lambda: self._arrive(version))  # runs before the source resumes
            yield Delay(end - cluster.now)
        else:
            self._arrive(version)  # nothing to move: the caller must see the new version at once

    def _arrive(self, version: int) -> None:
        self.version = max(self.version, version)
        self.changed.notify_all()
        for condition in self.listeners:
            condition.notify_all()

    def wait_for(self, rank: int, version: int, **tags: Any) -> Process:
        """Idle until the pool holds ``version``; the ``wait_sync`` span stops where the sync starts
        (the sync itself is logged as ``sync``, the phase name of the real systems)."""
        start = self.cluster.now
        while self.version < version:
            yield self.changed.wait()
        stop = min(self.cluster.now, max(start, self._sync_start.get(version, self.cluster.now)))
        if stop > start:
            self.cluster.log.add(rank, Phase.WAIT_SYNC, start, stop, **tags)
