"""How long a trainer rank takes for the units it is given, as the runtime forms its micro-batches.

* :class:`SimPacker` is the runtime's :class:`~digenrl.gap.unit_packer.UnitPacker` in time: units of the
  fragments a rank receives are trained in full micro-batches of ``trainer.micro_batch_size`` as they
  arrive, the remainder carried to the next fragment and flushed (one last, partial micro-batch) at the
  end of the iteration. Under a lockstep backend (FSDP2 for full fine-tuning: every micro-batch is a
  collective) the runtime packs nothing: each fragment's units are trained in their own micro-batches.
* :func:`micro_batch_s`: one micro-batch's forward + backward (:meth:`Workload.micro_batch_s`); with full
  fine-tuning sharded over a group of ranks, FSDP2 gathers the weights for the forward and again for the
  backward and reduce-scatters the gradients, three ring passes of ``param_bytes`` per micro-batch,
  prefetched under the compute (the micro-batch takes the longer of the two). The ring spans the rank's
  shard group (:func:`digenrl.rules.schedule.shard_group`): every trainer rank with
  ``trainer.sharding=flat``, the trainer ranks of its node with ``hybrid`` (HSDP), whose replicas add one
  all-reduce of their gradient shard across nodes per step (:func:`optimizer_s`: FSDP2 with the
  cross-replica reduction deferred to the step, as the runtime runs it).
* :func:`sequence_exchange_s`: with Ulysses sequence parallelism over groups of N ranks
  (``RunPlan.sequence_parallel`` / ``generator_sequence_parallel``) a rank computes 1/N of every forward
  and backward of its group's samples and adds the all-to-alls of the activations over the intra-node
  link, not overlapped with the compute (diffusers runs them in line): per transformer pass the bytes of
  :meth:`~digenrl.plan.sequence_shape.SequenceShape.exchange_bytes` (arXiv 2309.14509). A training
  micro-batch makes a forward and a backward pass (a checkpointed forward once more; with CFG the
  detached unconditional forward too), a denoising step one forward (of both CFG halves:
  :func:`digenrl.sim.phase_costs.generation_s`).
* A rank's generation (with the FSDP gathers of a colocated full fine-tune) is priced in
  :mod:`digenrl.sim.phase_costs`, with the scoring.
"""

from __future__ import annotations

from collections.abc import Sequence

from digenrl.data.micro_batches import split_units
from digenrl.plan.sequence_shape import sequence_shape
from digenrl.rules.schedule import replica_group, shard_group
from digenrl.sim.cluster import SimCluster


def sharded(cluster: SimCluster, group: Sequence[int]) -> bool:
    """Whether the trainer ``group`` shards the model (full fine-tuning over several ranks, FSDP2)."""
    return cluster.workload.trainer_mode == "full" and len(group) > 1


def shards_of(cluster: SimCluster, rank: int, group: Sequence[int]) -> tuple[int, ...]:
    """The ranks ``rank``'s FSDP2 shards span within trainer ``group`` (flat: all; hybrid: its node's)."""
    return shard_group(group, rank, cluster.profile.node_of, cluster.trainer_sharding)


def fsdp_gather_s(cluster: SimCluster, group: Sequence[int], nbytes: float, rank: int | None = None) -> float:
    """One ring all-gather (or reduce-scatter) of ``nbytes`` over ``group`` — over ``rank``'s shard group
    within it when ``rank`` is given (hybrid sharding: its node) —: (n−1)/n of the bytes over the slowest
    ring link (nccl-tests PERFORMANCE.md)."""
    if rank is not None:
        group = shards_of(cluster, rank, group)
    n = len(set(group))
    if n < 2 or nbytes == 0:
        return 0.0
    return (n - 1) / n * nbytes / cluster.net.ring_bottleneck_bytes_per_s(group)


def sequence_exchange_s(cluster: SimCluster, rank: int, samples: int, passes: int) -> float:
    """Seconds of ``rank``'s Ulysses all-to-alls over ``passes`` transformer passes of ``samples`` samples
    (module docstring); 0 without sequence parallelism. Each all-to-all over ``rank``'s group
    (``cluster.sequence_groups``) is limited by the slowest link from ``rank`` to a peer (nccl-tests
    PERFORMANCE.md: an all-to-all moves (n−1)/n of the bytes over each rank's link)."""
    n = cluster.sequence_degree(rank)
    if n == 1 or samples <= 0:
        return 0.0
    cost = cluster.cost(rank)
    shape = sequence_shape(cost.model)
    latent = cost.meta.get("latent_shape")
    if shape is None or latent is None:
        raise ValueError(
            f"sequence_parallel={n}: no sequence shape for {cost.model!r} (digenrl/plan/sequence_shape.py) "
            "or no meta['latent_shape'] in its cost file; its all-to-alls cannot be priced"
        )
    peers = [peer for peer in cluster.sequence_groups[rank] if peer != rank]
    rate = min(cluster.net.bytes_per_s(rank, peer) for peer in peers)
    return shape.exchange_bytes(samples, shape.tokens(latent), n, passes) / rate


def micro_batch_s(cluster: SimCluster, rank: int, group: Sequence[int], units: int) -> float:
    """Seconds of one micro-batch of ``units`` units on ``rank`` whose trainer group is ``group``."""
    w = cluster.workload
    compute = w.micro_batch_s(cluster.cost(rank), units)
    n = cluster.sequence_degree(rank)
    if n > 1:
        passes = 2 + int(w.activation_checkpointing) + int(w.cfg)
        return compute / n + sequence_exchange_s(cluster, rank, units, passes)
    if not units or not sharded(cluster, group):
        return compute
    return max(compute, 3 * fsdp_gather_s(cluster, group, cluster.cost(rank).param_bytes, rank))


def optimizer_s(cluster: SimCluster, rank: int, group: Sequence[int]) -> float:
    """The optimizer step of ``rank``: each rank of a sharded full fine-tune steps its shard only; with
    hybrid sharding the shard's gradient is first all-reduced over its replicas on the other nodes."""
    cost = cluster.cost(rank)
    if not sharded(cluster, group):
        return cost.optimizer_step_s
    shards = shards_of(cluster, rank, group)
    replicas = replica_group(group, rank, cluster.profile.node_of, cluster.trainer_sharding)
    reduce = cluster.net.allreduce_s(replicas, cost.grad_bytes / len(shards))
    return cost.optimizer_step_s / len(shards) + reduce


def units_s(
    cluster: SimCluster, rank: int, group: Sequence[int], units: int, micro_batch_size: int | None = None
) -> float:
    """``units`` units in micro-batches of ``micro_batch_size`` (None: the workload's), the last one
    partial."""
    mb = micro_batch_size or cluster.workload.micro_batch_size
    full, rest = split_units(units, mb)
    return full * micro_batch_s(cluster, rank, group, mb) + micro_batch_s(cluster, rank, group, rest)


class SimPacker:
    """The seconds a rank spends training as fragments arrive (see the module docstring)."""

    def __init__(self, cluster: SimCluster, rank: int, group: Sequence[int]) -> None:
        self.cluster = cluster
        self.rank = rank
        self.group = tuple(group)
        self.packing = not sharded(cluster, group)
        self.carry = 0
        self.trained = 0  # units trained so far this iteration: pending gradients exist when > 0

    def add(self, units: int) -> float:
        """Train what ``units`` more units allow now; returns the seconds (0 if nothing is trained)."""
        if not self.packing:
            self.trained += units
            return units_s(self.cluster, self.rank, self.group, units)
        mb = self.cluster.workload.micro_batch_size
        full, self.carry = split_units(self.carry + units, mb)
        self.trained += full * mb
        return full * micro_batch_s(self.cluster, self.rank, self.group, mb)

    def flush(self) -> float:
        """The carried units as one last micro-batch; resets for the next iteration."""
        rest, self.carry = self.carry, 0
        self.trained = 0
        return micro_batch_s(self.cluster, self.rank, self.group, rest)
