"""Colocated baselines (docs/design.md §4): every GPU generates its share, scores, trains, steps — in turn.

``colocated-sync`` (veRL-Omni / flow_grpo; the real one is ``digenrl/systems/colocated_sync.py``), per
rank and iteration::

    [park optimizer state] generate ─▶ [unpark reward] score [park reward] ─▶ gather rewards (barrier)
        ─▶ train own units ─▶ all-reduce gradients ─▶ [unpark optimizer state] optimizer step

``colocated-overlap`` (GenRL / flow_grpo's background reward executor, ``systems/colocated_overlap.py``):
the rank's share is generated in sub-batches — ``samples_per_forward // G`` groups each (one group when
unset), as the runtime does, or ``overlap_sub_batches`` equal parts — and one background worker decodes
and scores each sub-batch while the next one is generated; training starts when the last score is in.

Assumptions: residency follows ``digenrl.runtime.residency`` — rollout and training share the policy
weights on a colocated rank, so only the optimizer state moves (parked lazily when generation starts,
back immediately before the optimizer step) and, with a reward model that has weights, the reward
weights (onloaded for scoring, parked eagerly after). In ``colocated-overlap`` the reward stays resident
(it runs beside generation) and the background scorer does not slow the foreground generation (an
optimistic bound for the baseline: decode and reward models are small next to the DiT forward).
"""

from __future__ import annotations

from typing import Any

from digenrl.sim.cluster import SimCluster
from digenrl.sim.des import Process, Signal
from digenrl.sim.schedule_plan import SchedulePlan
from digenrl.sim.workload import split_evenly


def run_colocated(cluster: SimCluster, plan: SchedulePlan) -> None:
    """Spawn one process per rank of the profile."""
    ranks = tuple(range(cluster.profile.world_size))
    groups = split_evenly(cluster.workload.prompts_per_iteration, len(ranks))
    for rank in ranks:
        cluster.spawn(_colocated_rank(cluster, plan, rank, ranks, groups[rank]), f"colocated rank {rank}")


def _colocated_rank(
    cluster: SimCluster, plan: SchedulePlan, rank: int, ranks: tuple[int, ...], groups: int
) -> Process:
    w, cost, net = cluster.workload, cluster.cost(rank), cluster.net
    samples = groups * w.group_size
    residency = plan.residency
    for k in range(w.iterations):
        tags = {"iteration": k, "policy_version": k}
        if residency and cost.optimizer_bytes:
            yield from _move(cluster, rank, "park", "optimizer", cost.optimizer_bytes, tags)
        if plan.system == "colocated-overlap":
            yield from _generate_overlapped(cluster, plan, rank, groups, tags)
        else:
            yield from cluster.work(rank, "generate", w.generation_s(cost, samples), **tags)
            if residency and cost.reward_param_bytes:
                yield from _move(cluster, rank, "unpark", "reward", cost.reward_param_bytes, tags)
            yield from cluster.work(rank, "score", cost.score_s(samples), samples=samples, **tags)
            if residency and cost.reward_param_bytes:
                yield from _move(cluster, rank, "park", "reward", cost.reward_param_bytes, tags)
        # advantages need every rank's rewards (assign_advantages gathers them): a barrier.
        yield from cluster.collective(("advantages", k), rank, ranks, 0.0, "advantages", **tags)
        yield from cluster.work(rank, "train", w.train_s(cost, samples * w.train_steps), **tags)
        seconds = net.allreduce_s(ranks, cost.grad_bytes)
        yield from cluster.collective(("allreduce", k), rank, ranks, seconds, "allreduce", **tags)
        if residency and cost.optimizer_bytes:
            yield from _move(cluster, rank, "unpark", "optimizer", cost.optimizer_bytes, tags)
        committed = w.samples_per_iteration if rank == ranks[0] else None
        yield from cluster.work(rank, "optimizer", cost.optimizer_step_s, samples=committed, **tags)
        cluster.finish_iteration(k)


def _move(cluster: SimCluster, rank: int, phase: str, what: str, nbytes: int, tags: dict) -> Process:
    """A residency transition: ``park`` (device → host) or ``unpark`` (host → device) of ``nbytes``."""
    extra = {"what": what, "bytes": nbytes}
    yield from cluster.work(rank, phase, cluster.net.host_copy_s(nbytes), extra=extra, **tags)


def _generate_overlapped(
    cluster: SimCluster, plan: SchedulePlan, rank: int, groups: int, tags: dict
) -> Process:
    """Generate sub-batch j+1 while a background worker scores sub-batch j."""
    w, cost = cluster.workload, cluster.cost(rank)
    if plan.overlap_sub_batches is None:  # the runtime's rule (systems/colocated_overlap.py)
        per = max(1, w.samples_per_forward // w.group_size) if w.samples_per_forward else 1
        parts = [min(per, groups - i) for i in range(0, groups, per)]
    else:
        parts = [g for g in split_evenly(groups, plan.overlap_sub_batches) if g > 0]
    last_scored = None
    for j, part in enumerate(parts):
        samples = part * w.group_size
        yield from cluster.work(rank, "generate", w.generation_s(cost, samples), fragment=j, **tags)
        scorer = _background_score(cluster, rank, last_scored, samples, fragment=j, **tags)
        last_scored = cluster.spawn(scorer, f"rank {rank} background scorer {tags['iteration']}.{j}")
    if last_scored is not None:
        yield from cluster.wait_signal(rank, "wait_score", last_scored, **tags)


def _background_score(
    cluster: SimCluster, rank: int, previous: Signal | None, samples: int, **tags: Any
) -> Process:
    """One background worker per rank: sub-batches are scored one after another, in order."""
    if previous is not None:
        yield previous
    cost = cluster.cost(rank)
    extra = {"background": True}
    yield from cluster.work(rank, "score", cost.score_s(samples), samples=samples, extra=extra, **tags)
