"""The fragment stream between producers and the trainer pool (docs/design.md §3 "GAP").

One :class:`FragmentStream` per rank of a separate-pool system. It owns everything about how a scored
fragment reaches the trainers:

* **claiming** — which producer makes fragment f. ``dynamic`` assignment decides it at run time: a
  producer draws an atomic ticket on the c10d store (``ControlPlane.ticket``) and gets the next fragment
  nobody has started. Generator pipelines claim from the head (0, 1, 2, …); TAG helpers on trainer ranks
  claim from the tail, the fragments the generators would reach last, so helping never delays a fragment
  a trainer is about to wait for. A claim first reserves one of the iteration's F slots (one counter),
  then takes an index from its end (two more counters), so head and tail never hand out the same
  fragment. With TCSS's planned switch s (:mod:`digenrl.async_policy.tcss`) the fragments [0, s) are
  claimed from the head only, in index order, before any other (a ticket of their own): they are bound
  to the previous policy version, which a helper no longer holds. ``round-robin`` assignment is static:
  pipeline p makes fragments p, p+D, … (no store).
* **keys** — fragment f of iteration k for trainer t travels under ``it<k>/frag<f>/to<t>``.
* **shipping** — the producer cuts the fragment into one shard per trainer rank: by (sample, timestep)
  units (``units``, GAP: even one small fragment keeps every trainer busy, :mod:`digenrl.gap.
  unit_sharding`) or by samples (``samples``, the separate-sync baseline: one fragment per generator,
  whole sample records). Shards go out as buffered sends (:func:`digenrl.runtime.comm.transfer.start_send`);
  a producer that is itself a trainer (a TAG helper) keeps its own shard locally.
* **versions held** — every generator rank counts itself on the store when it receives θ_v
  (:meth:`announce_held`), so a TAG helper can tell whether the generators hold the version it would
  generate with (:meth:`generators_hold`, :mod:`digenrl.gap.helper_share`); :meth:`unclaimed` says how
  many fragments of an iteration nobody has claimed yet, :meth:`generator_claims` which the pipelines took.
* **readiness** — :meth:`ready` tells a trainer, without blocking, whether fragment f's shard has
  arrived (its metadata is on the store), so it can decide between training and helping.
* **rewards of split groups** — with fragments smaller than a group (``gap.fragment_samples``) a producer
  cannot normalise a group it holds only part of: it publishes the fragment's per-sample rewards on the
  store (:meth:`publish_rewards`, a few bytes per sample, before the shards leave) and ships the units
  without advantages; a trainer computes a group's advantages once every fragment of the group has
  published (:class:`~digenrl.gap.consumer.FragmentConsumer`).

A trainer receives a fragment's shard without knowing who produced it: the metadata names the sender.
Point-to-point messages from one sender must be received in the order they were sent (NCCL matches
them by order alone), but a trainer trains fragments in its own order and a TAG helper claiming from the
tail sends fragment 7 before fragment 5. :meth:`FragmentStream.receive` therefore receives in each
sender's order: when the wanted fragment is not the sender's next message, the earlier ones are
received first and kept until the trainer asks for them.
"""

from __future__ import annotations

import json

import torch

from digenrl.data.trajectory import TrajectoryBatch
from digenrl.gap.fragments import FragmentPlan
from digenrl.gap.unit_sharding import shard_units
from digenrl.runtime.comm.control_plane import ControlPlane
from digenrl.runtime.comm.transfer import (
    PendingSend,
    TransferStats,
    next_sequence,
    published_metadata,
    recv_trajectories,
    start_send,
)

SHARDINGS = ("units", "samples")


class FragmentStream:
    """Claims, keys, shards and readiness of an iteration's fragments (see the module docstring).

    Args:
        plan: the fragment plan (P, F, D and the assignment).
        plane: the run's control plane (this rank's view).
        trainer_ranks: the trainer pool; shard r goes to ``trainer_ranks[r]``, or with ``replicas`` = N to
            each of ``trainer_ranks[r·N : (r+1)·N]`` (a sequence-parallel group trains its shard together).
        sharding: ``units`` (GAP) or ``samples`` (one fragment per generator, separate-sync).
        device: where received shards land.
        timeout_s: bound of every wait for a shard.
    """

    def __init__(
        self,
        plan: FragmentPlan,
        plane: ControlPlane,
        trainer_ranks: tuple[int, ...],
        *,
        sharding: str,
        device: torch.device,
        timeout_s: float,
        replicas: int = 1,
    ) -> None:
        if sharding not in SHARDINGS:
            raise ValueError(f"sharding={sharding!r} is not allowed; choose one of: {', '.join(SHARDINGS)}")
        self.plan = plan
        self.plane = plane
        self.trainer_ranks = tuple(trainer_ranks)
        self.replicas = replicas
        self.sharding = sharding
        self.device = device
        self.timeout_s = timeout_s
        self._static_next: dict[tuple[int, int], int] = {}  # (iteration, pipeline) -> position
        self._local: dict[tuple[int, int], tuple[TrajectoryBatch, TransferStats]] = {}

    @property
    def num_fragments(self) -> int:
        return self.plan.num_fragments

    @property
    def dynamic(self) -> bool:
        return self.plan.assignment == "dynamic"

    # ------------------------------------------------------------------ producers
    def claim(
        self, iteration: int, *, pipeline: int | None = None, tail: bool = False, head_only: int = 0
    ) -> int | None:
        """The next fragment of ``iteration`` this producer makes, or None when none is left.

        ``dynamic``: store tickets, head (generators) or ``tail`` (TAG helpers); fragments below
        ``head_only`` go to head claims only, in index order, before the rest (every claimer of the
        iteration must pass the same value). ``round-robin``: the next fragment of ``pipeline``'s static
        list; helpers cannot claim (nothing is shared).
        """
        if not self.dynamic:
            if tail or pipeline is None:
                raise ValueError("round-robin assignment has no shared queue: only pipelines claim, in order")
            position = self._static_next.get((iteration, pipeline), 0)
            mine = self.plan.fragments_of(pipeline)
            if position >= len(mine):
                return None
            self._static_next[(iteration, pipeline)] = position + 1
            return mine[position]
        if not 0 <= head_only <= self.num_fragments:
            raise ValueError(f"head_only must be in [0, {self.num_fragments}], got {head_only}")
        if head_only and not tail:
            prefix = self.plane.ticket(f"claims/it{iteration}/prefix")
            if prefix < head_only:
                return prefix
        if self.plane.ticket(f"claims/it{iteration}") >= self.num_fragments - head_only:
            return None
        if tail:
            return self.num_fragments - 1 - self.plane.ticket(f"claims/it{iteration}/tail")
        return head_only + self.plane.ticket(f"claims/it{iteration}/head")

    def announce_held(self, version: int) -> None:
        """A generator rank: it now holds θ_``version`` (received, applied at its next fragment boundary)."""
        self.plane.ticket(f"held/v{version}")

    def generators_hold(self, version: int, generators: int) -> bool:
        """Whether all ``generators`` generator ranks announced θ_``version`` (never blocks)."""
        return self.plane.peek_ticket(f"held/v{version}") >= generators

    def unclaimed(self, iteration: int, head_only: int = 0) -> int:
        """Fragments of ``iteration`` nobody has claimed yet (``dynamic`` tickets; ``head_only`` as in
        :meth:`claim`); never blocks."""
        if not self.dynamic:
            raise ValueError("round-robin assignment has no shared queue to count")
        prefix = (
            max(0, head_only - self.plane.peek_ticket(f"claims/it{iteration}/prefix")) if head_only else 0
        )
        rest = self.num_fragments - head_only - self.plane.peek_ticket(f"claims/it{iteration}")
        return prefix + max(0, rest)

    def generator_claims(self, iteration: int, head_only: int = 0) -> list[int]:
        """The fragments of ``iteration`` claimed from the head so far — the generator pipelines' (never
        blocks; ``head_only`` as in :meth:`claim`)."""
        if not self.dynamic:
            raise ValueError("round-robin assignment has no shared queue to count")
        prefix = min(head_only, self.plane.peek_ticket(f"claims/it{iteration}/prefix")) if head_only else 0
        head = min(self.plane.peek_ticket(f"claims/it{iteration}/head"), self.num_fragments - head_only)
        return [*range(prefix), *range(head_only, head_only + head)]

    def cut(self, batch: TrajectoryBatch, fragment: int) -> TrajectoryBatch:
        """A rollout started for ``fragment``'s whole groups (:meth:`FragmentPlan.prompt_ids`), cut to the
        fragment's own samples (:meth:`FragmentPlan.rows`); unchanged for whole-group fragments."""
        if not self.plan.splits_groups:
            return batch
        return batch.select(list(self.plan.rows(fragment)))

    def publish_rewards(
        self, batch: TrajectoryBatch, keep: torch.Tensor, iteration: int, fragment: int
    ) -> None:
        """Put a scored fragment's (group, sample index, reward, kept) rows on the store (split groups only;
        JSON floats round-trip exactly)."""
        rows = {
            "groups": batch.prompt_ids.tolist(),
            "samples": batch.sample_ids.tolist(),
            "rewards": [float(r) for r in batch.rewards.tolist()],
            "keep": [bool(k) for k in keep.tolist()],
        }
        self.plane.publish(self.rewards_key(iteration, fragment), json.dumps(rows))

    def rewards_key(self, iteration: int, fragment: int) -> str:
        return f"it{iteration}/rewards{fragment}"

    def rewards_ready(self, iteration: int, fragment: int) -> bool:
        """Whether every fragment sharing a group with ``fragment`` has published its rewards (never
        blocks; always True for whole-group fragments)."""
        if not self.plan.splits_groups:
            return True
        return all(
            self.plane.exists(self.rewards_key(iteration, f)) for f in self.plan.fragments_of_groups(fragment)
        )

    def wait_rewards(self, iteration: int, fragment: int) -> dict:
        """The published reward rows of ``fragment`` (blocks; bounded by ``timeout_s``)."""
        key = self.rewards_key(iteration, fragment)
        peer = "the generator pool" + (" or a TAG helper" if self.dynamic else "")
        raw = self.plane.wait_for(
            key, peer=peer, what=f"the rewards of fragment '{key}'", timeout_s=self.timeout_s
        )
        return json.loads(raw)

    def shards(self, batch: TrajectoryBatch, fragment: int = 0) -> list[TrajectoryBatch]:
        """One shard per trainer rank (per group of ``replicas`` ranks), in trainer order (module docstring).
        Unit shards of the fragments of one iteration rotate the larger shares over the ranks (all fragments
        are equal), so no rank trains more than one unit above another over the iteration."""
        n = len(self.trainer_ranks) // self.replicas
        if self.sharding == "units":
            return shard_units(batch, n, offset=fragment * batch.num_units)
        batch.final_latents = None  # the trainer never reads the clean latent
        return [batch.select(idx) for idx in torch.arange(batch.batch_size).tensor_split(n)]

    def ship(
        self, batch: TrajectoryBatch, iteration: int, fragment: int, *, tags: dict
    ) -> tuple[list[PendingSend], int]:
        """Send every trainer its shard of a scored fragment (buffered); a trainer rank producing a
        fragment keeps its own shard. Returns the sends in flight and the bytes shipped."""
        pending, sent = [], 0
        tags = {**tags, "iteration": iteration, "fragment": fragment}
        copies = [shard for shard in self.shards(batch, fragment) for _ in range(self.replicas)]
        for trainer, shard in zip(self.trainer_ranks, copies, strict=True):
            key = self.key(iteration, fragment, trainer)
            if trainer == self.plane.rank:  # on the device received shards land on (they are packed together)
                own = (shard.to(self.device), TransferStats(0, 0.0, 0, src=trainer, tags=tags))
                self._local[(iteration, fragment)] = own
                continue
            send = start_send(shard, trainer, plane=self.plane, key=key, tags=tags)
            pending.append(send)
            sent += send.bytes
        return pending, sent

    # ------------------------------------------------------------------ trainers
    def key(self, iteration: int, fragment: int, trainer: int) -> str:
        return f"it{iteration}/frag{fragment}/to{trainer}"

    def ready(self, iteration: int, fragment: int) -> bool:
        """Whether this trainer's shard of ``fragment`` has arrived and, for split groups, the rewards of
        its groups are all in (never blocks)."""
        if not self.rewards_ready(iteration, fragment):
            return False
        if (iteration, fragment) in self._local:
            return True
        return self.plane.exists(self.key(iteration, fragment, self.plane.rank))

    def receive(self, iteration: int, fragment: int) -> tuple[TrajectoryBatch, TransferStats]:
        """This trainer's shard of ``fragment`` (blocks until it arrives; bounded by ``timeout_s``)."""
        local = self._local.pop((iteration, fragment), None)
        if local is not None:
            return local
        key = self.key(iteration, fragment, self.plane.rank)
        peer = "the generator pool" + (" or a TAG helper" if self.dynamic else "")
        meta = json.loads(
            self.plane.wait_for(key, peer=peer, what=f"trajectory fragment '{key}'", timeout_s=self.timeout_s)
        )
        src = int(meta["src"])
        while meta["sequence"] != next_sequence(self.plane, src):
            earlier = self._earlier_from(src, iteration)
            if earlier is None:
                expected = next_sequence(self.plane, src)
                raise RuntimeError(
                    f"rank {self.plane.rank}: fragment {fragment} of iteration {iteration} is message "
                    f"#{meta['sequence']} from rank {src}, but message #{expected} from it is not among "
                    "this iteration's fragments"
                )
            self._local[(iteration, earlier)] = self._recv(src, iteration, earlier)
        return self._recv(src, iteration, fragment)

    def _earlier_from(self, src: int, iteration: int) -> int | None:
        """The fragment of ``iteration`` whose shard is ``src``'s next message to this rank, if published."""
        expected = next_sequence(self.plane, src)
        for fragment in range(self.num_fragments):
            if (iteration, fragment) in self._local:
                continue
            meta = published_metadata(self.plane, self.key(iteration, fragment, self.plane.rank))
            if meta is not None and int(meta["src"]) == src and meta["sequence"] == expected:
                return fragment
        return None

    def _recv(self, src: int, iteration: int, fragment: int) -> tuple[TrajectoryBatch, TransferStats]:
        return recv_trajectories(
            src,
            plane=self.plane,
            key=self.key(iteration, fragment, self.plane.rank),
            device=self.device,
            timeout_s=self.timeout_s,
        )
