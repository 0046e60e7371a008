"""Micro-batches that span fragments: GAP keeps the trainer's micro-batch at its tuned size.

GAP spreads every fragment's (sample, timestep) units over all trainer ranks (:mod:`digenrl.gap.
unit_sharding`), so with many trainers or small fragments a rank's share of one fragment is a handful of
units. Training each share on arrival would then run micro-batches of 2–3 units, and a transformer
forward + backward costs nearly as much at micro-batch 1 as at 4 (at SD3.5-medium size on an H200 the
cost per unit at micro-batch 1 is about 4× the one at 4). A :class:`UnitPacker` trains units in full
micro-batches of ``trainer.micro_batch_size`` as fragments arrive, carries the remainder to the next
fragment and flushes it at the end of the iteration: the same units, weighted the same way
(1 / units of the logical batch), so the gradient is the same sum — only the grouping of units into
forwards changes.

Lockstep backends (FSDP2, ZeRO-2) run every ``accumulate`` as a collective, so all trainer ranks must call
it equally often; there the packer hands every fragment on as it comes (``enabled=False``), and the
backend pads ranks to equal micro-batch counts.
"""

from __future__ import annotations

from collections.abc import Callable

from digenrl.data.micro_batches import split_units
from digenrl.data.trajectory import TrajectoryBatch


class UnitPacker:
    """Feeds K = 1 unit shards to ``train`` in whole micro-batches (see the module docstring)."""

    def __init__(
        self, train: Callable[[TrajectoryBatch], None], micro_batch_size: int, *, enabled: bool
    ) -> None:
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        self.train = train
        self.micro_batch_size = micro_batch_size
        self.enabled = enabled
        self.pending: TrajectoryBatch | None = None

    def add(self, shard: TrajectoryBatch) -> int:
        """Train every full micro-batch the pending units and ``shard`` make; returns the units trained."""
        if not self.enabled:
            self.train(shard)
            return shard.batch_size
        if shard.num_train_steps != 1:
            raise ValueError(f"UnitPacker takes unit shards (K = 1), got K = {shard.num_train_steps}")
        batch = shard if self.pending is None else TrajectoryBatch.cat([self.pending, shard])
        full = split_units(batch.batch_size, self.micro_batch_size)[0] * self.micro_batch_size
        if full:
            self.train(batch.select(list(range(full))))
        self.pending = batch.select(list(range(full, batch.batch_size))) if full < batch.batch_size else None
        return full

    def flush(self) -> int:
        """Train the units left over (one last, partial micro-batch); returns how many."""
        pending, self.pending = self.pending, None
        if pending is None:
            return 0
        self.train(pending)
        return pending.batch_size
