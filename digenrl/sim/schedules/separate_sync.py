"""``separate-sync``: disjoint pools with a full-batch barrier — the naive disaggregation (docs/design.md §4).

Per iteration k::

    generators: wait θ_k ─▶ generate own share of the logical batch ─▶ score ─▶ send to every trainer
    trainers:   wait for every generator's data ─▶ train own units ─▶ all-reduce ─▶ optimizer step
    source trainer: broadcast θ_{k+1} to the generators

Every generator splits its samples over the trainer ranks as evenly as possible (``systems/separate.py``
``ship``: ``torch.tensor_split``, first ranks take the larger parts), sending to the trainers in rank
order; trainers receive from the generators in rank order. With zero link
costs an iteration takes exactly generate + score + train + all-reduce + optimizer step.

With sequence parallelism a pool's group of N ranks is one member of it (``systems/separate_sync.py``):
every rank of a generator group generates and scores the group's fragment (``sim/phase_costs.py``
``generation_s``: 1/N of the compute plus the all-to-alls) and its first rank ships it; every rank of a
trainer group receives its group's share and trains it together.
"""

from __future__ import annotations

from digenrl.plan import RunPlan
from digenrl.plan.workload import split_evenly
from digenrl.runtime.observe.span_phases import Phase
from digenrl.sim.cluster import SimCluster
from digenrl.sim.des import Process
from digenrl.sim.generator_weights import GeneratorWeights
from digenrl.sim.phase_costs import generation_s, score_s
from digenrl.sim.training import optimizer_s, sharded, units_s


def run_separate_sync(cluster: SimCluster, plan: RunPlan) -> None:
    world = cluster.profile.world_size
    trainers, generators = plan.trainer_ranks(world), plan.generator_ranks(world)
    weights = GeneratorWeights(cluster, trainers[0], generators, trainers)
    rendezvous = plan.transport_mode == "rendezvous"
    first = 0  # generator g generates samples [first, first + share) of every iteration (its group's)
    for rank, share in zip(generators, generator_samples(cluster, generators), strict=True):
        process = _generator(cluster, rank, first, share, trainers, weights, rendezvous)
        cluster.spawn(process, f"generator {rank}")
        group = cluster.sequence_groups.get(rank, (rank,))
        first += share if rank == group[-1] else 0
    for rank in trainers:
        cluster.spawn(_trainer(cluster, rank, trainers, generators, weights), f"trainer {rank}")


def generator_samples(cluster: SimCluster, generators: tuple[int, ...]) -> list[int]:
    """Samples per generator rank: one fragment of P·G / generators each (``systems/separate.py``
    ``fragment_plan``; part of a group when groups are fewer than generators), a sequence-parallel group's
    fragment on each of its ranks."""
    w = cluster.workload
    n = cluster.sequence_degree(generators[0])
    members = split_evenly(w.prompts_per_iteration * w.group_size, len(generators) // n)
    return [members[i // n] for i in range(len(generators))]


def shippers(cluster: SimCluster, generators: tuple[int, ...]) -> tuple[int, ...]:
    """The generator ranks that ship their fragment: each one's group's first rank."""
    return tuple(g for g in generators if cluster.sequence_groups.get(g, (g,))[0] == g)


def trainer_shares(cluster: SimCluster, trainers: tuple[int, ...], samples: int) -> list[int]:
    """``samples`` split over the trainer ranks like ``torch.tensor_split`` over the trainer members (a
    sequence-parallel group's share to each of its ranks: ``gap/stream.py`` ``replicas``)."""
    n = cluster.sequence_degree(trainers[0])
    members = split_evenly(samples, len(trainers) // n)
    return [members[i // n] for i in range(len(trainers))]


def _generator(
    cluster: SimCluster,
    rank: int,
    first: int,
    samples: int,
    trainers: tuple[int, ...],
    weights: GeneratorWeights,
    rendezvous: bool,
) -> Process:
    w, cost = cluster.workload, cluster.cost(rank)
    for k in range(w.iterations):
        tags = {"iteration": k, "policy_version": k}
        yield from weights.wait_for(rank, k, iteration=k)
        at = (k, first)
        yield from cluster.work(rank, Phase.GENERATE, generation_s(cluster, rank, samples, at=at), **tags)
        yield from cluster.work(
            rank, Phase.SCORE, score_s(cluster, rank, samples, at=at), samples=samples, **tags
        )
        if rank not in shippers(cluster, (rank,)):
            continue  # a sequence-parallel peer: its group's first rank ships the fragment
        # samples split over the trainers like torch.tensor_split (systems/separate.py ``ship``)
        for t, share in zip(trainers, trainer_shares(cluster, trainers, samples), strict=True):
            channel = cluster.channel(("batch", k, rank, t), rank, t)
            nbytes = share * cost.fragment_bytes_per_sample
            yield from channel.send(nbytes, rendezvous=rendezvous, what="batch", **tags)


def trainer_units(
    cluster: SimCluster, trainers: tuple[int, ...], generators: tuple[int, ...], rank: int
) -> int:
    """Units trainer ``rank`` receives: from every shipping generator its ``tensor_split`` share of
    samples."""
    w = cluster.workload
    position = trainers.index(rank)
    shipped = [
        n
        for g, n in zip(generators, generator_samples(cluster, generators), strict=True)
        if g in shippers(cluster, generators)
    ]
    return sum(trainer_shares(cluster, trainers, n)[position] for n in shipped) * w.train_steps


def _trainer(
    cluster: SimCluster,
    rank: int,
    trainers: tuple[int, ...],
    generators: tuple[int, ...],
    weights: GeneratorWeights,
) -> Process:
    w, cost = cluster.workload, cluster.cost(rank)
    units = trainer_units(cluster, trainers, generators, rank)
    for k in range(w.iterations):
        tags = {"iteration": k, "policy_version": k}
        for g in shippers(cluster, generators):
            yield from cluster.channel(("batch", k, g, rank), g, rank).recv(Phase.WAIT_TRANSFER, **tags)
        yield from cluster.work(rank, Phase.TRAIN, units_s(cluster, rank, trainers, units), **tags)
        if not sharded(cluster, trainers):  # FSDP2 reduce-scatters inside every micro-batch
            seconds = cluster.net.allreduce_s(trainers, cost.grad_bytes)
            yield from cluster.collective(("allreduce", k), rank, trainers, seconds, Phase.ALLREDUCE, **tags)
        committed = w.samples_per_iteration if rank == trainers[0] else None
        yield from cluster.work(
            rank, Phase.OPTIMIZER, optimizer_s(cluster, rank, trainers), samples=committed, **tags
        )
        cluster.finish_iteration(k)
        if rank == trainers[0] and k + 1 < w.iterations:
            yield from weights.publish(k + 1, iteration=k)
