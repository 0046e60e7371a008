"""``separate-async``: UniRL's asynchronous buffer on disjoint pools (docs/references.md [000],
docs/design.md §4).

The generator pool runs one whole-batch generation at a time (``max_inflight = 1``). The trainer's
``next_batch`` *reaps* a finished generation — the generators ship its trajectories to the trainers,
which occupies the generators (the send runs on the rollout worker) — *before* launching the next one
(reap-before-launch), so the transfer never queues behind a fresh generation; the next generation then
overlaps the trainer's step. Every ``weight_sync_interval`` optimizer steps the pool is drained (wait for
the in-flight generation and reap it into the buffer) and the new weights are broadcast; a buffered
batch whose weights are more than ``max_staleness`` syncs old is evicted (its generation was wasted).

``reap_before_launch=False`` models the launch-first order UniRL measured as a stall: the reap's send is
queued on the generators behind the generation just launched.

Spans of a generated batch are tagged with the iteration (optimizer step) that trains it once it is
taken from the buffer; evicted or never-trained batches keep ``iteration = None`` and say
``extra.evicted`` / ``extra.untrained``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from digenrl.plan import RunPlan
from digenrl.plan.workload import split_evenly
from digenrl.runtime.observe.span_phases import Phase
from digenrl.sim.cluster import SimCluster
from digenrl.sim.des import Mailbox, Process, Signal
from digenrl.sim.generator_weights import GeneratorWeights
from digenrl.sim.phase_costs import generation_s, score_s
from digenrl.sim.schedules.separate_sync import trainer_units
from digenrl.sim.training import optimizer_s, sharded, units_s


@dataclass
class _Batch:
    """One whole-batch generation: launch order, policy version, weight-sync epoch, and its spans."""

    index: int
    version: int
    epoch: int
    generated: Signal
    pending_generators: int
    reaped: Signal | None = None
    spans: list[dict[str, Any]] = field(default_factory=list)

    def tag(self, iteration: int | None, **extra: Any) -> None:
        for span in self.spans:
            span["iteration"] = iteration
            if extra:
                span["extra"] = {**span.get("extra", {}), **extra}


class _AsyncRun:
    """The pools of one separate-async simulation and the messages between them."""

    def __init__(self, cluster: SimCluster, plan: RunPlan) -> None:
        world = cluster.profile.world_size
        self.cluster = cluster
        self.plan = plan
        self.trainers = plan.trainer_ranks(world)
        self.generators = plan.generator_ranks(world)
        self.rendezvous = plan.transport_mode == "rendezvous"
        self.weights = GeneratorWeights(cluster, self.trainers[0], self.generators, self.trainers)
        ranks = (*self.generators, *self.trainers)
        self.commands = {r: Mailbox(cluster.sim, f"rank {r} commands") for r in ranks}
        w = cluster.workload  # one fragment of P·G / generators samples each (systems/separate.py)
        shares = split_evenly(w.prompts_per_iteration * w.group_size, len(self.generators))
        self.samples = dict(zip(self.generators, shares, strict=True))
        self.first = dict(zip(self.generators, [sum(shares[:i]) for i in range(len(shares))], strict=True))

    def channel(self, batch: _Batch, generator: int, trainer: int):
        return self.cluster.channel(("reap", batch.index, generator, trainer), generator, trainer)

    def reap(self, batch: _Batch) -> Signal:
        """Ask every generator to ship ``batch`` and every follower trainer to receive it; the returned
        signal fires when every byte has landed."""
        for g in self.generators:
            self.commands[g].put(("send", batch))
        for t in self.trainers[1:]:
            self.commands[t].put(("recv", batch))
        arrivals = [self.channel(batch, g, t).arrival for g in self.generators for t in self.trainers]
        batch.reaped = self.cluster.spawn(_all_of(arrivals), f"reap of batch {batch.index}")
        return batch.reaped


def _all_of(signals: list[Signal]) -> Process:
    """A process that ends once every signal has fired (in any order)."""
    yield from signals


def run_separate_async(cluster: SimCluster, plan: RunPlan) -> None:
    run = _AsyncRun(cluster, plan)
    for rank in run.generators:
        cluster.spawn(_generator(run, rank), f"generator {rank}")
    cluster.spawn(_lead_trainer(run), f"trainer {run.trainers[0]} (lead)")
    for rank in run.trainers[1:]:
        cluster.spawn(_follower_trainer(run, rank), f"trainer {rank}")


def _generator(run: _AsyncRun, rank: int) -> Process:
    """Serve commands in order: ``("generate", batch)``, ``("send", batch)`` or ``("stop",)``."""
    cluster = run.cluster
    cost = cluster.cost(rank)
    samples = run.samples[rank]
    while True:
        command = yield from cluster.wait_signal(rank, Phase.WAIT_COMMAND, run.commands[rank].get())
        if command[0] == "stop":
            return
        batch: _Batch = command[1]
        tags = {"policy_version": batch.version, "fragment": batch.index}
        if command[0] == "generate":
            at = (batch.index, run.first[rank])  # batch j draws as iteration j would
            seconds = generation_s(cluster, rank, samples, at=at)
            span = yield from cluster.work(rank, Phase.GENERATE, seconds, **tags)
            batch.spans.append(span)
            seconds = score_s(cluster, rank, samples, at=at)
            span = yield from cluster.work(rank, Phase.SCORE, seconds, samples=samples, **tags)
            batch.spans.append(span)
            batch.pending_generators -= 1
            if batch.pending_generators == 0:
                batch.generated.fire()
            continue
        # "send" (the reap): ship this generator's share to every trainer; the rollout worker is busy.
        for t, share in zip(run.trainers, split_evenly(samples, len(run.trainers)), strict=True):
            span = yield from run.channel(batch, rank, t).send(
                share * cost.fragment_bytes_per_sample, rendezvous=run.rendezvous, what="batch", **tags
            )
            if span is not None:
                batch.spans.append(span)


def _lead_trainer(run: _AsyncRun) -> Process:
    cluster, plan = run.cluster, run.plan
    w, lead = cluster.workload, run.trainers[0]
    buffer: list[_Batch] = []
    inflight: _Batch | None = None
    launched = 0
    epoch = 0

    def launch() -> None:
        nonlocal inflight, launched
        inflight = _Batch(
            index=launched,
            version=run.weights.version,
            epoch=epoch,
            generated=cluster.sim.signal(f"batch {launched} generated"),
            pending_generators=len(run.generators),
        )
        launched += 1
        for g in run.generators:
            run.commands[g].put(("generate", inflight))

    def receive(batch: _Batch, phase: str, tags: dict) -> Process:
        for g in run.generators:
            yield from run.channel(batch, g, lead).recv(phase, **tags)
        yield from cluster.wait_signal(lead, phase, batch.reaped, **tags)

    for j in range(w.iterations):
        tags = {"iteration": j, "policy_version": j}
        # next_batch: reap a finished (or, with an empty buffer, the in-flight) generation, then launch.
        if inflight is None and not buffer:
            launch()
        if inflight is not None and (not buffer or inflight.generated.fired):
            batch, inflight = inflight, None
            yield from cluster.wait_signal(lead, Phase.WAIT_GENERATION, batch.generated, **tags)
            if plan.reap_before_launch:
                run.reap(batch)
                launch()
            else:
                launch()
                run.reap(batch)
            yield from receive(batch, Phase.WAIT_TRANSFER, tags)
            buffer.append(batch)
        elif inflight is None:
            launch()
        batch = buffer.pop(0)
        batch.tag(j, staleness=j - batch.version)
        for t in run.trainers[1:]:
            run.commands[t].put(("train", j))
        yield from _train_step(run, lead, j, tags)
        if (j + 1) % plan.weight_sync_interval == 0 and j + 1 < w.iterations:
            if inflight is not None:  # drain before the weight sync
                batch, inflight = inflight, None
                yield from cluster.wait_signal(lead, Phase.WAIT_DRAIN, batch.generated, **tags)
                run.reap(batch)
                yield from receive(batch, Phase.WAIT_TRANSFER, tags)
                buffer.append(batch)
            yield from run.weights.publish(j + 1, iteration=j)
            epoch += 1
            for old in [b for b in buffer if epoch - b.epoch > plan.max_staleness]:
                old.tag(None, evicted=True)
                buffer.remove(old)
    for leftover in [*buffer, *([inflight] if inflight is not None else [])]:
        leftover.tag(None, untrained=True)
    for rank in (*run.generators, *run.trainers[1:]):
        run.commands[rank].put(("stop",))


def _follower_trainer(run: _AsyncRun, rank: int) -> Process:
    """Receive reaped batches and train the steps the lead announces, in the order it sends them."""
    cluster = run.cluster
    while True:
        command = yield from cluster.wait_signal(rank, Phase.WAIT_COMMAND, run.commands[rank].get())
        if command[0] == "stop":
            return
        if command[0] == "recv":
            batch: _Batch = command[1]
            for g in run.generators:
                yield from run.channel(batch, g, rank).recv(Phase.WAIT_TRANSFER)
            continue
        j = command[1]
        yield from _train_step(run, rank, j, {"iteration": j, "policy_version": j})


def _train_step(run: _AsyncRun, rank: int, j: int, tags: dict) -> Process:
    cluster, trainers = run.cluster, run.trainers
    w, cost = cluster.workload, cluster.cost(rank)
    units = trainer_units(cluster, trainers, run.generators, rank)
    yield from cluster.work(rank, Phase.TRAIN, units_s(cluster, rank, trainers, units), **tags)
    if not sharded(cluster, trainers):  # FSDP2 reduce-scatters inside every micro-batch
        seconds = cluster.net.allreduce_s(trainers, cost.grad_bytes)
        yield from cluster.collective(("allreduce", j), rank, trainers, seconds, Phase.ALLREDUCE, **tags)
    committed = w.samples_per_iteration if rank == trainers[0] else None
    yield from cluster.work(
        rank, Phase.OPTIMIZER, optimizer_s(cluster, rank, trainers), samples=committed, **tags
    )
    cluster.finish_iteration(j)
