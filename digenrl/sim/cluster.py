"""The simulated machine a schedule runs on: clock, devices, links, costs and the span log.

Schedules are written against this small vocabulary, each call recording the span a real rank would log:

- ``yield from cluster.work(rank, phase, seconds, ...)`` — the device is busy;
- ``yield from cluster.wait_signal(rank, "wait_x", signal, ...)`` /
  ``cluster.wait_until(rank, "wait_x", condition, predicate, ...)`` — the device idles (a bubble);
- ``yield from cluster.collective(key, rank, ranks, seconds, phase, ...)`` — rendezvous of ``ranks``,
  then all busy for ``seconds`` (all-reduce, barrier);
- ``cluster.channel(key, src, dst)`` — one point-to-point message, sent rendezvous-style (as the real
  ``runtime.transfer``) or buffered, booked on the link ports (:mod:`digenrl.sim.channel`).

A rank's main process is sequential, so a device never runs two things at once except where a schedule
spawns an explicit background worker (``colocated-overlap``'s scorer, whose spans carry
``extra.background``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from digenrl.costs.cost_model import CostModel
from digenrl.costs.device_costs import DeviceCosts
from digenrl.plan.workload import Workload
from digenrl.runtime.hardware.profiles import HardwareProfile
from digenrl.runtime.observe.span_phases import Phase, waiting_for
from digenrl.sim.channel import Channel
from digenrl.sim.des import Condition, Delay, Process, Signal, Simulation
from digenrl.sim.network import Network
from digenrl.sim.sample_draws import SampleDraws
from digenrl.sim.span_log import SpanLog


@dataclass
class _Rendezvous:
    ranks: frozenset[int]
    arrived: set[int] = field(default_factory=set)
    signal: Signal | None = None


class SimCluster:
    """One simulation's shared state. ``roles`` maps every participating rank to its role name."""

    def __init__(
        self, profile: HardwareProfile, costs: DeviceCosts, workload: Workload, roles: dict[int, str]
    ) -> None:
        self.profile = profile
        self.costs = costs
        self.workload = workload
        self.trainer_sharding = "flat"  # trainer.sharding of the plan (sim/training.py shard groups)
        #: each rank's Ulysses group (the plan's degrees over its pools; sim/training.py), absent = alone
        self.sequence_groups: dict[int, tuple[int, ...]] = {}
        self.sim = Simulation()
        self.net = Network(profile)
        self.log = SpanLog(roles)
        self.iteration_end: dict[int, float] = {}
        # per-sample cost factors (digenrl/sim/phase_costs.py); None: every sample costs the cost file's
        self.draws = SampleDraws(workload.variance, workload) if workload.variance is not None else None
        self._rendezvous: dict[Hashable, _Rendezvous] = {}
        self._channels: dict[Hashable, Channel] = {}

    def sequence_degree(self, rank: int) -> int:
        """How many ranks shard ``rank``'s sequence (1: no sequence parallelism)."""
        return len(self.sequence_groups.get(rank, (rank,)))

    @property
    def now(self) -> float:
        return self.sim.now

    def cost(self, rank: int) -> CostModel:
        return self.costs.for_rank(rank)

    def spawn(self, process: Process, name: str) -> Signal:
        return self.sim.spawn(process, name)

    def condition(self, name: str) -> Condition:
        return Condition(self.sim, name)

    # ------------------------------------------------------------------ busy / idle
    def work(self, rank: int, phase: str, seconds: float, **tags: Any) -> Process:
        """The device of ``rank`` is busy with ``phase`` for ``seconds``; returns the span record."""
        start = self.sim.now
        if seconds > 0:
            yield Delay(seconds)
        return self.log.add(rank, phase, start, self.sim.now, **tags)

    def wait_signal(self, rank: int, phase: str, signal: Signal, **tags: Any) -> Process:
        """Idle until ``signal`` fires (a ``wait_*`` span if any time passed); returns its value."""
        start = self.sim.now
        value = yield signal
        if self.sim.now > start:
            self.log.add(rank, phase, start, self.sim.now, **tags)
        return value

    def wait_until(
        self, rank: int, phase: str, condition: Condition, predicate: Callable[[], bool], **tags: Any
    ) -> Process:
        """Idle until ``predicate()`` holds, re-checked whenever ``condition`` is notified."""
        start = self.sim.now
        while not predicate():
            yield condition.wait()
        if self.sim.now > start:
            self.log.add(rank, phase, start, self.sim.now, **tags)

    def collective(
        self, key: Hashable, rank: int, ranks: Iterable[int], seconds: float, phase: Phase, **tags: Any
    ) -> Process:
        """All of ``ranks`` meet (``wait_<phase>`` while the others arrive), then spend ``seconds`` on it."""
        members = frozenset(ranks)
        if rank not in members:
            raise ValueError(f"rank {rank} joins collective {key!r} but is not one of {sorted(members)}")
        meeting = self._rendezvous.setdefault(key, _Rendezvous(members, signal=self.sim.signal(str(key))))
        if meeting.ranks != members:
            raise ValueError(f"collective {key!r} joined with different rank sets")
        meeting.arrived.add(rank)
        if meeting.arrived == meeting.ranks:
            del self._rendezvous[key]
            meeting.signal.fire()
        yield from self.wait_signal(rank, waiting_for(phase), meeting.signal, **tags)
        yield from self.work(rank, phase, seconds, **tags)

    # ------------------------------------------------------------------ data movement
    def channel(self, key: Hashable, src: int, dst: int, on_ready: Condition | None = None) -> Channel:
        """The message ``key`` from ``src`` to ``dst`` (created by whichever side asks first)."""
        found = self._channels.get(key)
        if found is None:
            found = self._channels[key] = Channel(self, src, dst, on_ready)
        elif (found.src, found.dst) != (src, dst):
            raise ValueError(f"channel {key!r} is {found.src}->{found.dst}, not {src}->{dst}")
        return found

    def finish_iteration(self, iteration: int) -> None:
        """Mark the optimizer step of ``iteration`` done (the latest trainer to finish defines it)."""
        self.iteration_end[iteration] = max(self.iteration_end.get(iteration, 0.0), self.sim.now)
