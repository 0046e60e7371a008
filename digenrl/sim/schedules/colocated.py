"""Colocated baselines (docs/design.md §4): every GPU generates its share, scores, trains, steps — in turn.

``colocated-sync`` (veRL-Omni / flow_grpo; the real one is ``digenrl/systems/colocated_sync.py``), per
rank and iteration::

    [park optimizer state] generate ─▶ [unpark reward] score [park reward] ─▶ gather rewards (barrier)
        ─▶ train own units ─▶ all-reduce gradients ─▶ [unpark optimizer state] optimizer step

``colocated-overlap`` (GenRL / flow_grpo's background reward executor, ``systems/colocated_overlap.py``):
the rank's share is generated in sub-batches — ``samples_per_forward // G`` groups each (one group when
unset), as the runtime does, or ``overlap_sub_batches`` equal parts — and one background worker decodes
and scores each sub-batch while the next one is generated; training starts when the last score is in.

Assumptions: residency follows ``digenrl.systems.residency`` — rollout and training share the policy
weights on a colocated rank, so at most the optimizer state moves (``train_resident=False``: parked when
generation starts, back immediately before the optimizer step) and, with a reward model that has weights,
the reward weights (``reward_resident=False``: onloaded for scoring, parked eagerly after); with the
runtime's defaults nothing moves (:mod:`digenrl.sim.residency`). In ``colocated-overlap`` the reward
stays resident (it runs beside generation) and the background scorer does not slow the foreground
generation (an optimistic bound for the baseline: decode and reward models are small next to the DiT
forward). Full fine-tuning shards the model over every rank (FSDP2): each generator forward gathers the
weights, each micro-batch gathers them twice and reduce-scatters the gradients
(:mod:`digenrl.sim.training`). Each rank's share — its samples, which may cut a prompt group, and its
micro-batch size — is the runtime's (``colocated.split``, :func:`digenrl.data.rank_shares.rank_shares`):
``work_split="speed"`` gives faster devices more samples at the full micro-batch size (more micro-batches),
``"speed-lockstep"`` more samples and larger micro-batches, the same number of micro-batch steps everywhere.
"""

from __future__ import annotations

from typing import Any

from digenrl.data.rank_shares import RankShare
from digenrl.plan import RunPlan
from digenrl.plan.workload import Workload, split_evenly
from digenrl.runtime.observe.span_phases import Phase
from digenrl.sim.cluster import SimCluster
from digenrl.sim.des import Process, Signal
from digenrl.sim.phase_costs import generation_s, score_s
from digenrl.sim.residency import colocated_moves, move_s
from digenrl.sim.training import optimizer_s, sharded, units_s


def run_colocated(cluster: SimCluster, plan: RunPlan) -> None:
    """Spawn one process per rank of the profile."""
    ranks = tuple(range(cluster.profile.world_size))
    shares = plan.colocated_shares(cluster.workload, cluster.profile.relative_speeds)
    for rank in ranks:
        cluster.spawn(_colocated_rank(cluster, plan, rank, ranks, shares[rank]), f"colocated rank {rank}")


def _colocated_rank(
    cluster: SimCluster, plan: RunPlan, rank: int, ranks: tuple[int, ...], share: RankShare
) -> Process:
    w = cluster.workload
    samples = share.samples
    for k in range(w.iterations):
        tags = {"iteration": k, "policy_version": k}
        yield from _move(cluster, plan, rank, "generate", tags)
        if plan.system == "colocated-overlap":
            yield from _generate_overlapped(cluster, plan, rank, share, tags)
        else:
            at = (k, share.start)  # every rank's phase ends with its slowest sample: the barriers below wait
            seconds = generation_s(cluster, rank, samples, at=at, group=ranks)
            yield from cluster.work(rank, Phase.GENERATE, seconds, **tags)
            yield from _move(cluster, plan, rank, Phase.SCORE, tags)
            seconds = score_s(cluster, rank, samples, at=at)
            yield from cluster.work(rank, Phase.SCORE, seconds, samples=samples, **tags)
            yield from _move(cluster, plan, rank, "after_score", tags)
        yield from train_share(cluster, plan, rank, ranks, share, tags)
        cluster.finish_iteration(k)


def train_share(
    cluster: SimCluster, plan: RunPlan, rank: int, ranks: tuple[int, ...], share: RankShare, tags: dict
) -> Process:
    """A colocated rank's training after its rollout: the advantages barrier, its units, the gradient
    all-reduce (replicas) and the optimizer step (every colocated schedule, ``colocated-engine`` too)."""
    w, cost, net, k = cluster.workload, cluster.cost(rank), cluster.net, tags["iteration"]
    # advantages need every rank's rewards (assign_advantages gathers them): a barrier.
    yield from cluster.collective(("advantages", k), rank, ranks, 0.0, Phase.ADVANTAGES, **tags)
    seconds = units_s(cluster, rank, ranks, share.samples * w.train_steps, share.micro_batch_size)
    yield from cluster.work(rank, Phase.TRAIN, seconds, **tags)
    if not sharded(cluster, ranks):
        seconds = net.allreduce_s(ranks, cost.grad_bytes)
        yield from cluster.collective(("allreduce", k), rank, ranks, seconds, Phase.ALLREDUCE, **tags)
    yield from _move(cluster, plan, rank, Phase.OPTIMIZER, tags)
    committed = w.samples_per_iteration if rank == ranks[0] else None
    yield from cluster.work(
        rank, Phase.OPTIMIZER, optimizer_s(cluster, rank, ranks), samples=committed, **tags
    )


def _move(cluster: SimCluster, plan: RunPlan, rank: int, phase: str, tags: dict) -> Process:
    """The residency transitions the runtime issues before ``phase`` (:mod:`digenrl.sim.residency`), each a
    ``residency`` span with the runtime's ``extra`` (role ``train`` / ``reward``, kind ``offload`` /
    ``onload``, bytes); nothing when nothing moves."""
    cost = cluster.cost(rank)
    for move in colocated_moves(cost, phase, plan.train_resident, plan.reward_resident):
        role = "train" if move.what == "optimizer" else move.what
        extra = {"role": role, "kind": "offload" if move.park else "onload", "bytes": move.nbytes}
        seconds = move_s(cluster.net, cost, [move], sync=True)
        yield from cluster.work(rank, Phase.RESIDENCY, seconds, extra=extra, **tags)


def overlap_sub_batches(workload: Workload, plan: RunPlan, samples: int) -> list[int]:
    """Samples per sub-batch of a ``colocated-overlap`` rank's share of ``samples``: the runtime's rule
    (``samples_per_forward`` rounded down to whole groups, at least one group's worth;
    systems/colocated_overlap.py) or ``overlap_sub_batches`` equal parts."""
    w = workload
    if plan.overlap_sub_batches is None:
        size = (max(1, w.samples_per_forward // w.group_size) if w.samples_per_forward else 1) * w.group_size
        return [min(size, samples - i) for i in range(0, samples, size)]
    return [n for n in split_evenly(samples, plan.overlap_sub_batches) if n > 0]


def _generate_overlapped(
    cluster: SimCluster, plan: RunPlan, rank: int, share: RankShare, tags: dict
) -> Process:
    """Generate sub-batch j+1 while a background worker scores sub-batch j."""
    last_scored = None
    first = share.start
    group = tuple(range(cluster.profile.world_size))
    for j, part in enumerate(overlap_sub_batches(cluster.workload, plan, share.samples)):
        at = (tags["iteration"], first)
        first += part
        seconds = generation_s(cluster, rank, part, at=at, group=group)
        yield from cluster.work(rank, Phase.GENERATE, seconds, fragment=j, **tags)
        scorer = _background_score(cluster, rank, last_scored, part, at, fragment=j, **tags)
        last_scored = cluster.spawn(scorer, f"rank {rank} background scorer {tags['iteration']}.{j}")
    if last_scored is not None:
        yield from cluster.wait_signal(rank, Phase.WAIT_SCORE, last_scored, **tags)


def _background_score(
    cluster: SimCluster, rank: int, previous: Signal | None, samples: int, at: tuple[int, int], **tags: Any
) -> Process:
    """One background worker per rank: sub-batches are scored one after another, in order."""
    if previous is not None:
        yield previous
    extra = {"background": True}
    seconds = score_s(cluster, rank, samples, at=at)
    yield from cluster.work(rank, Phase.SCORE, seconds, samples=samples, extra=extra, **tags)
