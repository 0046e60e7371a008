"""GAP on a trainer rank: an iteration's fragments in training order, each checked, then trained
(docs/design.md §3 "GAP").

The trainer loop asks :meth:`FragmentConsumer.next` for the fragment to train next — ``gap.train_order=
index``: the lowest pending one (a fixed order, so the gradient is summed in a fixed order); ``arrival``:
the lowest one already here, else the lowest pending — and whether it is :meth:`~FragmentConsumer.ready`
(a TAG helper may generate meanwhile), then :meth:`~FragmentConsumer.receive` s it: a ``wait_fragment``
span that names the fragment's producer and the costs it measured (what TAG's policy learns from), the
staleness check of :class:`~digenrl.async_policy.tcss.StalenessBound`, and — with ``gap.enabled`` — its
units go to training at once, in whole micro-batches across fragments (:class:`~digenrl.gap.unit_packer.
UnitPacker`; one micro-batch per fragment under lockstep backends, whose accumulate is a collective).
With ``gap.enabled=false`` nothing trains before the last fragment arrived (the separate-sync timeline).
Fragments smaller than a group (``gap.fragment_samples``) arrive without advantages: a fragment is ready
once every fragment sharing a group with it has published its rewards, and :meth:`~FragmentConsumer.
receive` fills its units' advantages from :class:`~digenrl.algo.group_completion.GroupCompletion` (the
same numbers as normalising whole groups; a group dropped for a non-finite reward leaves training here).
The optimizer step and the inner epochs (``algo.num_updates_per_batch``) replay :attr:`~FragmentConsumer.
received` through the same :attr:`~FragmentConsumer.packer` (:func:`digenrl.systems.phases.
train_logical_batch` with ``fed`` = ``gap.enabled``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from digenrl.algo.group_completion import GroupCompletion
from digenrl.async_policy.tcss import StalenessBound, StalenessStats
from digenrl.config import TRAIN_ORDERS, Config, ConfigError
from digenrl.data.trajectory import TrajectoryBatch
from digenrl.gap.stream import FragmentStream
from digenrl.gap.unit_packer import UnitPacker
from digenrl.rules import fragment_size
from digenrl.runtime.observe.events import EventLogger
from digenrl.runtime.observe.span_phases import Phase

#: a received fragment's tags that go into its ``wait_fragment`` span: who made it and what it measured
PRODUCER_TAGS = ("producer", "steps_s", "score_s")


class GapPlan(Protocol):
    """What :func:`check_gap_config` reads of a run's plan (:class:`digenrl.plan.RunPlan`; not imported
    here: the plan imports :mod:`digenrl.gap`)."""

    @property
    def gap(self) -> bool: ...

    @property
    def fragment_groups(self) -> int: ...

    @property
    def fragment_samples(self) -> int: ...


def check_gap_config(cfg: Config, plan: GapPlan, trainers: int, *, lockstep: bool = False) -> None:
    """Start-up checks of what training ``plan``'s fragments one by one needs (``trainers``: the trainer
    pool; ``lockstep``: its backend runs every accumulate as a collective, FSDP2); ``cfg``: the algorithm
    and the reward."""
    if plan.gap and cfg.algo.adv_std != "group":
        raise ConfigError(
            "gap.enabled=true normalises advantages per fragment, which needs algo.adv_std=group "
            f"(got {cfg.algo.adv_std!r}); a global std needs the whole batch before any fragment trains"
        )
    samples = fragment_size(cfg.algo.group_size, plan.fragment_groups, plan.fragment_samples)
    key, value = (
        ("gap.fragment_samples", plan.fragment_samples)
        if plan.fragment_samples
        else ("gap.fragment_groups", plan.fragment_groups)
    )
    if lockstep and samples < trainers:
        raise ConfigError(
            f"{key}={value} makes fragments of {samples} samples, fewer than "
            f"pools.trainers={trainers}: a sharded trainer (fsdp2) trains every fragment as a collective on "
            "every rank, so each rank needs a unit of every fragment (other backends skip a fragment)"
        )
    if plan.fragment_samples and plan.fragment_samples % cfg.algo.group_size:
        from digenrl.rewards.registry import whole_group_rewards

        names = list(cfg.reward.weights) if cfg.reward.weights else [cfg.reward.name]
        if needs := whole_group_rewards(names):
            raise ConfigError(
                f"gap.fragment_samples={plan.fragment_samples} splits prompt groups of "
                f"algo.group_size={cfg.algo.group_size} over fragments, but reward {needs[0]!r} scores a "
                "group's samples together; use whole-group fragments (a multiple of algo.group_size)"
            )


class FragmentConsumer:
    """A trainer rank's side of the fragment stream, one iteration at a time (see the module docstring).

    ``train_order`` and ``streaming``: the plan's ``gap.train_order`` and ``gap.enabled`` (train each
    fragment on arrival); ``pack``: group units into whole micro-batches of ``micro_batch_size`` across
    fragments (False under lockstep backends, FSDP2 and ZeRO-2, whose accumulate is a collective: every rank
    trains each fragment as one micro-batch); ``clamp``: ``algo.adv_clamp``."""

    def __init__(
        self,
        stream: FragmentStream,
        bound: StalenessBound,
        events: EventLogger,
        *,
        train_order: str,
        streaming: bool,
        micro_batch_size: int,
        pack: bool,
        clamp: float = 5.0,
    ) -> None:
        if train_order not in TRAIN_ORDERS:
            raise ValueError(f"gap.train_order={train_order!r}: choose one of {TRAIN_ORDERS}")
        self.stream = stream
        self.bound = bound
        self.events = events
        self.train_order = train_order
        self.streaming = streaming
        self.micro_batch_size = micro_batch_size
        self.pack = pack
        self.iteration = self.version = -1
        self.pending: list[int] = []
        self.received: list[TrajectoryBatch] = []  # this rank's shards, in the order they arrived
        self.staleness = StalenessStats()
        self.packer: UnitPacker | None = None
        self.clamp = clamp
        self.completion: GroupCompletion | None = None  # split groups: rewards so far this iteration
        self._rewards_in: set[int] = set()  # fragments whose rewards the completion holds

    def begin(self, iteration: int, version: int, train: Callable[[TrajectoryBatch], None]) -> None:
        """Start ``iteration`` at trainer ``version``; ``train`` accumulates a micro-batch of units."""
        self.iteration, self.version = iteration, version
        self.pending = list(range(self.stream.num_fragments))
        self.received = []
        self.staleness = StalenessStats()
        self.packer = UnitPacker(train, self.micro_batch_size, enabled=self.pack)
        plan = self.stream.plan
        self.completion = GroupCompletion(plan.group_size, clamp=self.clamp) if plan.splits_groups else None
        self._rewards_in = set()

    def next(self) -> int | None:
        """The fragment to train next (``gap.train_order``), None once every fragment was received."""
        if not self.pending:
            return None
        if self.train_order == "arrival":
            for f in self.pending:
                if self.ready(f):
                    return f
        return self.pending[0]

    def ready(self, fragment: int) -> bool:
        """Whether this rank's shard of ``fragment`` is here (never blocks)."""
        return self.stream.ready(self.iteration, fragment)

    def receive(self, fragment: int) -> TrajectoryBatch:
        """Wait for this rank's shard of ``fragment``, check its versions, and — GAP on — train it now."""
        with self.events.span(
            Phase.WAIT_FRAGMENT, iteration=self.iteration, fragment=fragment, policy_version=self.version
        ) as span:
            shard, transfer = self.stream.receive(self.iteration, fragment)
            span.update({k: transfer.tags[k] for k in PRODUCER_TAGS if k in transfer.tags})
            span.update(bytes=transfer.bytes, samples=shard.batch_size)
            if self.completion is not None:
                shard = self._complete_groups(fragment, shard)
        rank = self.stream.plane.rank
        stale = self.bound.check_fragment(shard, trainer_version=self.version, fragment=fragment, rank=rank)
        self.staleness.add(shard.batch_size, stale)
        self.pending.remove(fragment)
        self.received.append(shard)
        if self.streaming:
            self.packer.add(shard)
        return shard

    def _complete_groups(self, fragment: int, shard: TrajectoryBatch) -> TrajectoryBatch:
        """Split groups: wait for the rewards of every fragment sharing a group with ``fragment``, then
        give the shard's units their group's advantages and drop the units of dropped groups."""
        for f in self.stream.plan.fragments_of_groups(fragment):
            if f not in self._rewards_in:
                rows = self.stream.wait_rewards(self.iteration, f)
                self.completion.add(rows["groups"], rows["samples"], rows["rewards"], rows["keep"])
                self._rewards_in.add(f)
        advantages, keep = self.completion.advantages_for(shard.prompt_ids.cpu(), shard.sample_ids.cpu())
        shard.advantages = advantages.to(shard.log_probs.device)
        kept = torch.nonzero(keep).flatten()
        return shard if kept.numel() == shard.batch_size else shard.select(kept)
