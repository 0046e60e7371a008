"""One point-to-point message (a fragment shard, a stage hand-over, a batch), and its two transports.

- ``rendezvous`` (default; what :func:`digenrl.runtime.comm.transfer.send_trajectories` does: "returns when
  every send has completed (the receiver has posted matching receives)"): the sender blocks from the send
  call until the receiver has posted the receive *and* the bytes have moved; the receiver blocks from its
  receive call until the bytes have landed. The sender's ``transfer`` span covers its whole blocked time,
  as the real span does.
- ``buffered`` (an ``isend`` nobody waits for): the bytes leave as soon as the ports are free, the sender
  goes on at once, and the receiver finds the payload waiting. This is GAP's design intent (a fragment
  streams to the trainer as soon as it is generated, docs/design.md §3 (GAP)); TAG hand-offs between
  trainers must be buffered, or two helpers sending to each other deadlock.

Bytes are booked on the link ports (:class:`~digenrl.sim.network.Network`) when the transfer starts.
``ready`` says whether a receive would complete without waiting for the sender (rendezvous: the sender
is already waiting; buffered: the payload has landed), which is what "a ready fragment wins" checks.
"""

from __future__ import annotations

from typing import Any, Protocol

from digenrl.costs.cost_model import CostModel
from digenrl.runtime.observe.span_phases import Phase
from digenrl.sim.des import Condition, Delay, Process, Signal, Simulation
from digenrl.sim.network import Network
from digenrl.sim.span_log import SpanLog


class Machine(Protocol):
    """What a message needs of the simulated machine (:class:`~digenrl.sim.cluster.SimCluster` is one):
    its clock, links, span log and each rank's costs."""

    sim: Simulation
    net: Network
    log: SpanLog

    @property
    def now(self) -> float: ...

    def cost(self, rank: int) -> CostModel: ...


class Channel:
    """A single message ``src → dst``; ``on_ready`` (the receiver's condition) is notified when it
    becomes ready. The transport is the sender's choice (``send(..., rendezvous=)``): the receiver's side
    is the same either way. ``src`` may be None until the sender is known (set it before ``send``)."""

    def __init__(
        self, cluster: Machine, src: int | None, dst: int, on_ready: Condition | None = None
    ) -> None:
        self.cluster = cluster
        self.src = src
        self.dst = dst
        self.on_ready = on_ready
        self.sender_waiting = False
        self._posted: Signal = cluster.sim.signal(f"recv posted {src}->{dst}")
        self._delivered: Signal = cluster.sim.signal(f"delivered {src}->{dst}")

    @property
    def ready(self) -> bool:
        return self._delivered.fired or self.sender_waiting

    @property
    def arrival(self) -> Signal:
        """Fires (with the payload) when the bytes have landed."""
        return self._delivered

    def send(
        self, nbytes: float, payload: Any = None, *, rendezvous: bool, what: str = "fragment", **tags: Any
    ) -> Process:
        """Run by the sender's process; returns (the ``transfer`` span or None) when the sender may go on."""
        cluster = self.cluster
        if self.src is None:
            raise ValueError(f"channel to rank {self.dst}: set src before sending")
        called = cluster.now
        if rendezvous:
            self.sender_waiting = True
            self._notify()
            yield self._posted
        latency = cluster.cost(self.src).message_latency_s
        start, end = cluster.net.reserve_transfer(cluster.now, self.src, self.dst, nbytes, latency)
        cluster.sim.call_at(end, lambda: self._deliver(payload))
        if rendezvous:
            if end > cluster.now:
                yield Delay(end - cluster.now)
            begin = called
        else:
            begin = start
        if end > begin:
            extra = {"bytes": int(nbytes), "peer": self.dst, "what": what}
            return cluster.log.add(self.src, Phase.TRANSFER, begin, end, extra=extra, **tags)
        return None

    def recv(self, phase: str, **tags: Any) -> Process:
        """Run by the receiver's process: post the receive, idle (``phase``) until the payload lands."""
        start = self.cluster.now
        if not self._posted.fired:
            self._posted.fire()
        payload = yield self._delivered
        if self.cluster.now > start:
            self.cluster.log.add(self.dst, phase, start, self.cluster.now, **tags)
        return payload

    def _deliver(self, payload: Any) -> None:
        self._delivered.fire(payload)
        self._notify()

    def _notify(self) -> None:
        if self.on_ready is not None:
            self.on_ready.notify_all()
