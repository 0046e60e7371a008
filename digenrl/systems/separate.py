"""Plumbing shared by every schedule on disjoint pools (``separate-*`` baselines and ``digenrl``).

A :class:`SeparateSystem` builds the layout and process groups, gives trainer ranks a
:class:`PolicyTrainer` and generator ranks a :class:`RolloutEngine`, and offers the moves those
schedules are made of:

* a :class:`~digenrl.gap.stream.FragmentStream` (``self.stream``) — the one way scored trajectories reach
  the trainers: claim a fragment, ship its shards, check readiness, receive. The separate baselines use
  it with one fragment per generator and whole-sample shards; ``digenrl`` with GAP fragments and unit
  shards;
* weight sync — the trainer pool's source rank pushes θ_{k+1} (:meth:`push_weights`); a generator joins
  every push (:meth:`service_weight_sync`) — ``digenrl``'s as soon as it is announced (between fragments
  and from inside every wait), the separate baselines' in :meth:`wait_for_version` (see below) —
  receiving into a staging buffer; :class:`~digenrl.runtime.comm.policy_version.
  PolicyVersion` decides when the staged weights take effect;
* the staleness bound (``self.bound``, :class:`~digenrl.async_policy.tcss.StalenessBound`) — every system's
  one check of every received fragment: one policy version per trajectory, no older than the system
  allows (0 behind the trainer on-policy, ``asynchrony.max_staleness`` or TCSS's one), the plan's version;
* ``generator_pool_group`` — advantages are normalised over the generator pool when it holds the whole
  logical batch (separate baselines).

Where a generator joins a push matters, because a push is a collective over the trainer source and *all*
generators: a generator blocked on something else while the others sit in the broadcast deadlocks the run
until the timeout. ``digenrl`` generators join from inside every wait (``joins_pushes_while_waiting``):
their timeline has no other collective, so joining early is always safe. The separate baselines join only
in :meth:`wait_for_version`, at the same point of every generator's iteration: their rollout ends in a
collective over the generator pool (the reward gather of the advantages), and a generator that joined the
push θ_{j+1} while waiting for its rewards, when its peer already had them and sat in that gather, left
the two generators in different collectives — the one-in-three-runs hang of ``separate-async`` with a
scorer rank (docs/design.md §3).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from digenrl.async_policy.tcss import StalenessBound, StalenessStats
from digenrl.config import Config, ConfigError
from digenrl.data.trajectory import TrajectoryBatch
from digenrl.gap.fragments import FragmentPlan
from digenrl.gap.stream import FragmentStream
from digenrl.plan import RunPlan
from digenrl.rollout.evaluate import eval_schedule, rollout_calls
from digenrl.rollout.remote_scoring import ScorerPool, ScoringServer
from digenrl.rollout.scoring import ScoreResult
from digenrl.runtime.comm.control_plane import ControlPlane
from digenrl.runtime.comm.distributed import global_sum, named_collective
from digenrl.runtime.comm.sequence_groups import SequenceGroups, build_sequence_groups
from digenrl.runtime.comm.weight_sync import (
    POLICY_VERSION_NAME,
    SyncStats,
    WeightSync,
    resolve_sync_mode,
)
from digenrl.runtime.launch.layout import Layout, build_layout, build_process_groups
from digenrl.runtime.observe.span_phases import Phase
from digenrl.systems.base import IterationReport, System
from digenrl.systems.components import RankComponents, build_rank_components
from digenrl.systems.phases import Accumulation, reward_summary
from digenrl.trainer.parallel.base import broadcast_module

log = logging.getLogger(__name__)


def separate_layout(cfg: Config, plan: RunPlan) -> Layout:
    """The layout of a separate-pool system's ``plan`` on its ``plan.world_size`` launched ranks (its pools:
    as set, or with none set half the ranks train, :func:`digenrl.rules.separate_pools`), or a ConfigError
    naming the ``pools.*`` keys."""
    from digenrl.rewards.registry import reward_needs_weights

    reward_names = list(cfg.reward.weights) if cfg.reward.weights else [cfg.reward.name]
    layout = build_layout(
        plan,
        plan.world_size,
        needs_scorer_model=any(reward_needs_weights(n) for n in reward_names),
        reward_name=",".join(reward_names),
    )
    if layout.is_colocated:
        raise ConfigError(
            f"system={plan.system!r} runs on disjoint pools and needs at least 2 ranks; launch with "
            f"torchrun and set pools.trainers and pools.generators (they must add up to the launched "
            f"ranks, {plan.world_size} now)"
        )
    return layout


def generator_report(rewards: torch.Tensor, samples: int, phase_s: dict[str, float]) -> IterationReport:
    """A generator rank's own view of an iteration (rank 0, a trainer, writes the metrics)."""
    return IterationReport(
        samples=samples,
        reward_mean=float(rewards.mean()) if rewards.numel() else 0.0,
        reward_std=float(rewards.std(unbiased=False)) if rewards.numel() else 0.0,
        train={},
        step={},
        phase_s=phase_s,
    )


def check_trainer_pool_backend(plan: RunPlan) -> None:
    """DeepSpeed trains on the whole world, never on a trainer pool beside generators (startup check)."""
    if plan.trainer_backend == "deepspeed":
        raise ConfigError(
            "trainer.backend=deepspeed needs every rank to train (DeepSpeed's data-parallel group is "
            f"the default group), but system={plan.system!r} trains on the trainer pool only; use "
            "trainer.backend=fsdp2 or ddp, or a colocated system (colocated-sync, colocated-overlap)"
        )


class SeparateSystem(System):
    """Base of the schedules on disjoint generator / trainer pools."""

    knobs = ("pools", "sync")

    @classmethod
    def check(cls, cfg: Config, plan: RunPlan) -> None:
        """Pools fit the world; every generator produces the same number of samples (whole groups, or part
        of a group when groups are fewer than generators); every trainer gets samples."""
        check_trainer_pool_backend(plan)
        layout = separate_layout(cfg, plan)
        # a sequence-parallel group of either pool is one member of it (docs/models.md)
        gens = len(layout.generator_ranks) // plan.generator_sequence_parallel
        trainers = len(layout.trainer_ranks) // plan.sequence_parallel
        p, g = cfg.algo.prompts_per_iteration, cfg.algo.group_size
        if (p * g) % gens:
            raise ConfigError(
                f"algo.prompts_per_iteration={p} x algo.group_size={g} = {p * g} samples must be divisible "
                f"by pools.generators={gens} so every generator produces the same number of samples"
            )
        per_generator = p * g // gens
        if per_generator < trainers:
            raise ConfigError(
                f"each generator produces {per_generator} samples per iteration, fewer than "
                f"pools.trainers={trainers}: raise algo.prompts_per_iteration or lower pools.trainers"
            )

    def setup(self) -> RankComponents:
        cfg, ctx = self.cfg, self.ctx
        if not ctx.is_distributed:
            raise ConfigError(
                f"system={cfg.system!r} needs torchrun with pools.trainers + pools.generators ranks"
            )
        self.layout = separate_layout(cfg, self.plan)
        self.groups = build_process_groups(self.layout, timeout_s=cfg.runtime.timeout_s)
        # trainer.sequence_parallel / sampler.sequence_parallel: each pool's groups, built on every rank in
        # this order (None where the degree is 1 or this rank is in the other pool)
        self.trainer_sequence = build_sequence_groups(
            self.layout.trainer_ranks,
            self.plan.sequence_parallel,
            timeout_s=cfg.runtime.timeout_s,
        )
        self.generator_sequence = build_sequence_groups(
            self.layout.generator_ranks,
            self.plan.generator_sequence_parallel,
            timeout_s=cfg.runtime.timeout_s,
        )
        self.role = self.layout.role_of(ctx.rank)
        if ctx.rank == 0:
            log.info(
                "layout: trainers %s, generators %s",
                list(self.layout.trainer_ranks),
                list(self.layout.generator_ranks),
            )
        self.is_trainer = self.role == "trainer"
        self.is_generator = self.role == "generator"
        self.plane = ControlPlane.from_default_group(self.role, cfg.runtime.timeout_s)
        scorers = self.layout.scorer_ranks
        self.scorer_pool = (
            ScorerPool(self.plane, scorers, timeout_s=cfg.runtime.timeout_s) if scorers else None
        )
        generate = self.is_generator or (self.is_trainer and self.trainer_generates())
        parts = build_rank_components(
            cfg,
            ctx,
            role=self.role,
            generate=generate,
            train=self.is_trainer,
            score=self.role == "scorer" or (generate and self.scorer_pool is None),
            clock_origin=self.clock_origin,
            run=self.run_start,
            process_group=self.groups.trainer_group,
            sequence=self.trainer_sequence or self.generator_sequence,
            shard_groups=self.trainer_shard_groups(self.layout.trainer_ranks),
            scorer_pool=self.scorer_pool,
        )
        if scorers and cfg.model.pretrained_path is None:
            # random weights: a scorer rank builds its VAE without building the transformer and the text
            # encoder first, so its random draws (and its decoded images) would differ from the trainers';
            # every rank takes rank 0's VAE, as a run without scorer ranks decodes (issue 33)
            what = f"rank {ctx.rank}: rank 0's random VAE weights (all {ctx.world_size} ranks take them)"
            with named_collective(what):
                broadcast_module(parts.bundle.decoder, torch.distributed.group.WORLD)
        if self.role == "scorer":
            self.server = ScoringServer(
                parts.scorer, self.plane, device=ctx.device, timeout_s=cfg.runtime.timeout_s
            )
        self.weight_sync = WeightSync(
            cfg.sync,
            layout=self.layout,
            groups=self.groups,
            device=ctx.device,
            mode=resolve_sync_mode(cfg),
            plane=self.plane,
        )
        self.sync_history: list[SyncStats] = []
        self.stream = FragmentStream(
            self.fragment_plan(),
            self.plane,
            self.layout.trainer_ranks,
            sharding=self.sharding,
            device=ctx.device,
            timeout_s=cfg.runtime.timeout_s,
            replicas=self.plan.sequence_parallel,
        )
        self.bound = self.staleness_bound()
        return parts

    def describe_pools(self) -> str:
        pools = f"trainers {list(self.layout.trainer_ranks)}, generators {list(self.layout.generator_ranks)}"
        if self.layout.scorer_ranks:
            pools += f", scorers {list(self.layout.scorer_ranks)}"
        return pools

    def run_iteration(self, iteration: int) -> IterationReport:
        """Each pool's part of the iteration (the schedules write ``train_iteration`` and
        ``generate_iteration``; scorer ranks serve the scoring requests)."""
        if self.is_trainer:
            return self.train_iteration(iteration)
        if self.is_generator:
            return self.generate_iteration(iteration)
        return self.serve_scoring(iteration)

    def train_iteration(self, iteration: int) -> IterationReport:  # pragma: no cover - abstract
        raise NotImplementedError

    def generate_iteration(self, iteration: int) -> IterationReport:  # pragma: no cover - abstract
        raise NotImplementedError

    # ------------------------------------------------------------------ scoring
    @property
    def score_phase(self) -> Phase:
        """The producer's span around scoring: ``score`` when it scores itself, ``wait_score`` (idle)
        when a scorer rank does (the scorer logs the ``score`` span)."""
        return Phase.SCORE if self.scorer_pool is None else Phase.WAIT_SCORE

    def score(self, batch: TrajectoryBatch, iteration: int, fragment: int) -> ScoreResult:
        """Decode and score a finished fragment: on this rank, or on its scorer rank (``pools.scorers``)."""
        if self.scorer_pool is None:
            return self.parts.scorer(batch)
        return self.scorer_pool.score(batch, iteration, fragment, idle=self.idle_hook())

    def serve_scoring(self, iteration: int) -> IterationReport:
        """A scorer rank's iteration: score every fragment of ``iteration`` that maps to it, and the rollout
        calls of the evaluation the trainers run at its start or, after the last iteration, of the final
        policy (requests of a later iteration that arrive first — TCSS — are scored as they come and
        counted for theirs)."""
        cfg, pool, server = self.cfg, self.scorer_pool, self.server
        expected = pool.expected(self.ctx.rank, self.stream.num_fragments)
        trainers = len(self.layout.trainer_ranks)
        evaluations = sum(eval_schedule(cfg, iteration, final=final) for final in (False, True))
        calls = pool.expected(self.ctx.rank, evaluations * trainers * rollout_calls(cfg.eval, trainers))
        start, samples = time.perf_counter(), 0
        while server.served.get(iteration, 0) < expected or server.evaluated.get(iteration, 0) < calls:
            k, _, n = server.serve_one(self.parts.events, iteration)
            samples += n if k == iteration else 0
        return generator_report(torch.zeros(0), samples, {"score": time.perf_counter() - start})

    # ------------------------------------------------------------------ what the subclass decides
    sharding = "samples"  # how a fragment is cut over the trainer ranks (FragmentStream)
    #: Whether a generator joins an announced push from inside its waits for other things (scoring
    #: replies, shipped fragments), or only in :meth:`wait_for_version` (module docstring).
    joins_pushes_while_waiting = True

    def idle_hook(self) -> Callable[[], bool] | None:
        """What this rank does while it waits for a peer: a generator joins announced pushes when the
        schedule allows it anywhere (``joins_pushes_while_waiting``); otherwise nothing."""
        return self.service_weight_sync if self.is_generator and self.joins_pushes_while_waiting else None

    def trainer_generates(self) -> bool:
        """Whether trainer ranks also need a rollout engine (TAG)."""
        return False

    def fragment_plan(self) -> FragmentPlan:
        """The separate baselines: one fragment per generator (per sequence-parallel group of generators),
        its contiguous share of the samples — whole groups when generators divide the groups, else part of
        a group (its advantages come from the rewards gathered over the generator pool,
        :meth:`SeparateSync.advantages`)."""
        gens = len(self.layout.generator_ranks) // self.plan.generator_sequence_parallel
        p, g = self.cfg.algo.prompts_per_iteration, self.cfg.algo.group_size
        return FragmentPlan(p, 1, gens, assignment="round-robin", group_size=g, sample_size=p * g // gens)

    def checkpoint_ranks(self) -> tuple[bool, object]:
        """Only the trainer pool holds state worth saving; generators get their weights from the
        sync after a resume. Keeping generators out also keeps the save off their timeline, which
        under ``separate-async`` runs ahead of the trainer's."""
        return self.is_trainer, self.groups.trainer_group

    def staleness_bound(self) -> StalenessBound:
        """How far generation may run ahead of the trainer; every received fragment is checked against
        it: the plan's staleness (``separate-sync`` on-policy, ``separate-async`` its
        ``asynchrony.max_staleness``, ``digenrl`` TCSS's one with its switch fragment). A resumed process
        starts on-policy (``start``): its generators hold only the checkpointed θ."""
        cfg = self.cfg
        return StalenessBound.from_plan(
            self.plan,
            self.stream.num_fragments,
            checkpoint_every=cfg.checkpoint_every,
            iterations=cfg.iterations,
            start=self.run_start.start_iteration,
        )

    # ------------------------------------------------------------------ data plane
    @property
    def trainer_ranks(self) -> tuple[int, ...]:
        return self.layout.trainer_ranks

    @property
    def generator_ranks(self) -> tuple[int, ...]:
        return self.layout.generator_ranks

    @staticmethod
    def data_group(sequence: SequenceGroups | None, pool_group: object) -> object:
        """The group a pool shares out, counts and gathers samples over: the pool, or with sequence
        parallelism one rank per group of it
        (:class:`~digenrl.runtime.comm.sequence_groups.SequenceGroups`)."""
        return pool_group if sequence is None else sequence.data_group

    def ship_and_wait(self, batch: TrajectoryBatch, iteration: int, fragment: int, tags: dict) -> float:
        """Ship a fragment and wait until every trainer has taken it (reap before launch: the transfer
        never competes with the next generation); returns the bytes sent."""
        pending, sent = self.stream.ship(batch, iteration, fragment, tags=tags)
        self.drain(pending, what=f"the trainers to take fragment {fragment} of iteration {iteration}")
        return sent

    def drain(self, pending: list, *, keep: int = 0, what: str) -> list:
        """Wait until at most ``keep`` sends are in flight, joining weight syncs meanwhile where the
        schedule allows it (:meth:`idle_hook`)."""
        from digenrl.runtime.comm.transfer import drain_sends

        return drain_sends(
            pending,
            self.plane,
            keep=keep,
            what=what,
            timeout_s=self.cfg.runtime.timeout_s,
            idle=self.idle_hook(),
        )

    def receive_all(self, iteration: int, version: int, staleness: StalenessStats) -> TrajectoryBatch:
        """A trainer's shares of every fragment of ``iteration``, each checked against the staleness bound
        at trainer ``version`` and counted in ``staleness``, concatenated in fragment order."""
        shards = []
        for f in range(self.stream.num_fragments):
            shard, _ = self.stream.receive(iteration, f)
            stale = self.bound.check_fragment(shard, trainer_version=version, fragment=f, rank=self.ctx.rank)
            staleness.add(shard.batch_size, stale)
            shards.append(shard)
        return TrajectoryBatch.cat(shards)

    def trainer_report(
        self,
        rewards: torch.Tensor,
        samples: float,
        training: Accumulation,
        step_stats: dict[str, float],
        sync: SyncStats,
        staleness: StalenessStats,
        phase_s: dict[str, float],
    ) -> IterationReport:
        """A trainer rank's iteration, reduced over the trainer pool (collectives, in this order, on every
        trainer rank): the ``rewards`` and ``samples`` of its share of the logical batch, its training."""
        group = self.data_group(self.trainer_sequence, self.groups.trainer_group)
        reward_mean, reward_std = reward_summary(rewards, group)
        return IterationReport(
            samples=round(global_sum(samples, group)),
            reward_mean=reward_mean,
            reward_std=reward_std,
            train=training.stats.reduce(group),
            step={
                **step_stats,
                "sync_bytes": float(sync.bytes),
                "sync_s": sync.seconds,
                "staleness": staleness.staleness_max,
                **staleness.metrics(),
            },
            phase_s=phase_s,
        )

    # ------------------------------------------------------------------ weight sync
    def push_next_version(self, iteration: int) -> SyncStats:
        """Trainer ranks, after the iteration's step: publish θ_{k+1} (a ``sync`` span with its bytes)."""
        with self.parts.events.span(
            Phase.SYNC, iteration=iteration, policy_version=self.version.current + 1
        ) as span:
            sync = self.push_weights(self.version.advance())
            span["bytes"] = sync.bytes
        return sync

    def push_weights(self, version: int) -> SyncStats:
        """Every trainer rank: publish the trainer's weights as ``version`` (the source broadcasts)."""
        stats = self.weight_sync.push(self.parts.trainer, version)
        self.sync_history.append(stats)
        return stats

    def service_weight_sync(self) -> bool:
        """Generators: join a push the trainer source announced, receiving into staging. Returns whether
        one was received. Called at fragment boundaries, from :meth:`wait_for_version` and, where the
        schedule allows it, from inside every wait (:meth:`idle_hook`)."""
        announced = self.weight_sync.pending_version()
        if announced is None or announced <= self.version.latest:
            return False
        target = self.version.latest + 1
        self.version.make_room(self.parts.bundle.flow_model)
        with self.parts.events.span(Phase.SYNC, policy_version=target):
            staged = self.weight_sync.receive(self.parts.bundle.flow_model, target)
        self.version.stage(staged)
        self.sync_history.append(staged.stats)
        return True

    def wait_for_version(self, version: int, iteration: int = -1) -> None:
        """Generators: wait (logged as ``wait_sync``) until ``version`` has arrived, joining every push
        on the way, and make the model compute with it."""
        if self.version.latest < version:
            with self.parts.events.span(Phase.WAIT_SYNC, iteration=iteration, policy_version=version):
                self.plane.wait_until(
                    lambda: True if self.version.latest >= version else None,
                    key=f"version/{POLICY_VERSION_NAME}",
                    peer=self.layout.sync_source,
                    what=f"policy version {version}",
                    timeout_s=self.cfg.runtime.timeout_s,
                    idle=self.service_weight_sync,
                )
        self.version.apply_staged(self.parts.bundle.flow_model, up_to=version)

    def initial_sync(self) -> None:
        """Version 0: make every generator start from the trainer's exact weights."""
        current = self.version.current
        if self.is_trainer:
            with self.parts.events.span(Phase.SYNC, iteration=-1, policy_version=current):
                self.push_weights(current)
        elif self.is_generator:
            with self.parts.events.span(Phase.SYNC, iteration=-1, policy_version=current):
                self.sync_history.append(self.weight_sync.pull(self.parts.bundle.flow_model, current))

    def after_run(self) -> None:
        """Generators join the trainer's last push (θ after the final iteration) before leaving."""
        if self.is_generator:
            self.wait_for_version(self.cfg.iterations)
