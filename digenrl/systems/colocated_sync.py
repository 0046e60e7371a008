"""``colocated-sync``: the veRL-Omni / flow_grpo schedule (docs/design.md §4).

Every rank holds the whole policy and, each iteration, in turn::

    generate its share of the samples ─▶ decode + score ─▶ advantages (rewards gathered over all
    ranks) ─▶ accumulate the gradient of its units ─▶ optimizer step (gradients reduced) ─▶ next

No weight sync is needed: the rank that trains is the rank that generates. With one process this is
plain single-GPU FlowGRPO. A rank's share is a contiguous run of the iteration's samples, which may cut a
prompt group when groups are fewer than ranks (``colocated.split``, :mod:`digenrl.data.rank_shares`).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager

import torch

from digenrl.config import Config, ConfigError
from digenrl.data.rank_shares import RankShare, rank_shares, split_backend_conflict
from digenrl.data.trajectory import TrajectoryBatch
from digenrl.plan import RunPlan
from digenrl.rollout.scoring import ScoreResult
from digenrl.runtime.comm.distributed import global_sum
from digenrl.runtime.comm.sequence_groups import build_sequence_groups
from digenrl.runtime.hardware.profiles import load_profile
from digenrl.runtime.observe.events import EventLogger
from digenrl.runtime.observe.span_phases import Phase
from digenrl.systems.base import IterationReport, System
from digenrl.systems.components import RankComponents, build_rank_components
from digenrl.systems.phases import Accumulation, assign_advantages, reward_summary, train_logical_batch
from digenrl.systems.residency import (
    EvaluationPhases,
    ResidencyPlanner,
    ResidencyPolicy,
    TransitionRecord,
    module_transitions,
    optimizer_transitions,
)
from digenrl.trainer.parallel.base import resolve_backend


def residency_span(events: EventLogger, record: TransitionRecord, iteration: int | None) -> None:
    """A transition that just returned, as a ``residency`` span (it ended now, lasted its seconds)."""
    end = events.now()
    extra = {"role": record.role, "kind": record.kind, "bytes": record.bytes}
    events.record_span(Phase.RESIDENCY, end - record.seconds, end, iteration=iteration, extra=extra)


def colocated_shares(cfg: Config, plan: RunPlan) -> list[RankShare]:
    """Every data-parallel member's share of the iteration (the plan's ``colocated.split`` on its
    ``world_size`` ranks), or a ConfigError naming the keys. A member is a rank, or a group of
    ``trainer.sequence_parallel`` consecutive ranks that generate and train the same samples together
    (docs/models.md, "Sequence parallelism")."""
    split, world_size = plan.work_split, plan.world_size
    backend = resolve_backend(plan.trainer_backend, world_size=world_size, mode=cfg.trainer.mode)
    conflict = split_backend_conflict(split, backend, plan.deepspeed_stage)
    if conflict:
        raise ConfigError(conflict)
    if split != "equal":
        profile = load_profile(cfg.profile)
        if world_size > profile.world_size:
            raise ConfigError(
                f"colocated.split=speed: profile={cfg.profile!r} declares {profile.world_size} devices, "
                f"fewer than the {world_size} ranks"
            )
        speeds = list(profile.relative_speeds[:world_size])
    else:
        speeds = [1.0] * (world_size // plan.sequence_parallel)
    try:
        return rank_shares(
            cfg.algo.prompts_per_iteration, cfg.algo.group_size, speeds, cfg.trainer.micro_batch_size, split
        )
    except ValueError as error:
        raise ConfigError(
            f"colocated.split={split} with algo.prompts_per_iteration={cfg.algo.prompts_per_iteration}, "
            f"algo.group_size={cfg.algo.group_size}, trainer.micro_batch_size={cfg.trainer.micro_batch_size} "
            f"on {world_size} ranks: {error}"
        ) from None


class ColocatedSync(System):
    name = "colocated-sync"
    knobs = ("residency", "colocated")

    track_reward_residency = True  # colocated-overlap scores during generation, so it cannot park the reward
    generation_copy = False  # colocated-engine generates on its own copy of the policy

    @classmethod
    def check(cls, cfg: Config, plan: RunPlan) -> None:
        super().check(cfg, plan)
        colocated_shares(cfg, plan)
        from digenrl.rewards.registry import reward_needs_weights

        names = list(cfg.reward.weights) if cfg.reward.weights else [cfg.reward.name]
        if not plan.reward_resident and not any(reward_needs_weights(n) for n in names):
            raise ConfigError(
                f"residency.reward_resident=false: reward {cfg.reward.name!r} has no weights to park "
                f"under system={cls.name!r}; leave it true"
            )

    def setup(self) -> RankComponents:
        # trainer.sequence_parallel > 1: groups of consecutive ranks, each one data-parallel member
        self.sequence = build_sequence_groups(
            range(self.ctx.world_size),
            self.plan.sequence_parallel,
            timeout_s=self.cfg.runtime.timeout_s,
        )
        # samples are shared out, counted and their rewards gathered over it (None: every rank)
        self.data_group = self.sequence.data_group if self.sequence else None
        parts = build_rank_components(
            self.cfg,
            self.ctx,
            role="colocated",
            generate=True,
            train=True,
            clock_origin=self.clock_origin,
            run=self.run_start,
            generation_copy=self.generation_copy,
            sequence=self.sequence,
            shard_groups=self.trainer_shard_groups(range(self.ctx.world_size)),
        )
        self.residency = self.build_residency(parts)
        member = self.sequence.member if self.sequence else self.ctx.rank
        self.share = colocated_shares(self.cfg, self.plan)[member]
        parts.trainer.micro_batch_size = self.share.micro_batch_size  # colocated.split=speed: per rank
        return parts

    def build_residency(self, parts: RankComponents) -> ResidencyPlanner:
        """Roles sharing this device: ``train`` = the optimizer state (generation reads the trainer's own
        weights, so those never move), ``reward`` = the reward model's weights, if it has any."""
        plan = self.plan
        transitions = {"train": optimizer_transitions(parts.trainer.optimizer, self.ctx.device)}
        reward_models = parts.scorer.reward.modules()
        if self.track_reward_residency and any(True for m in reward_models for _ in m.parameters()):
            transitions["reward"] = module_transitions(torch.nn.ModuleList(reward_models), self.ctx.device)
        elif not plan.reward_resident:
            raise ConfigError(
                f"residency.reward_resident=false: reward {self.cfg.reward.name!r} has no weights to park "
                f"under system={self.name!r}; leave it true"
            )
        policy = ResidencyPolicy(
            train_resident=plan.train_resident, rollout_resident=True, reward_resident=plan.reward_resident
        )
        events = parts.events
        return ResidencyPlanner(
            policy,
            tracked=set(transitions),
            transitions=transitions,
            initial={role: True for role in transitions},
            log=lambda message: events.note(message, kind="residency"),
            on_transition=lambda record: residency_span(events, record, self.iteration),
        )

    def evaluation_phases(self) -> AbstractContextManager[EvaluationPhases]:
        """An evaluation brings the rollout and the reward in chunk by chunk like a rollout; generation goes
        on right after, so the rollout stays awake."""
        return self.residency.evaluation(keep_rollout_awake=True, sleep_after=False)

    def generate_share(self, share: RankShare, iteration: int, version: int) -> TrajectoryBatch:
        """Roll out the samples of ``share``: its groups whole, or — when it cuts a group — the groups
        started and cut to the share's samples before any step runs (as a TAG helper generates a GAP
        fragment smaller than a group); every sample's draws are keyed by its (group, index), so they are
        the samples a whole-group rollout would make."""
        g = self.cfg.algo.group_size
        prompts = self.parts.prompts.prompts_for(iteration, self.cfg.algo.prompts_per_iteration)
        picks = share.picks(g)
        texts, ids = [prompts[i] for i, _ in picks], [i for i, _ in picks]
        whole = all(len(samples) == g for _, samples in picks)
        rows = None if whole else [n * g + j for n, (_, samples) in enumerate(picks) for j in samples]
        return self.parts.engine.generate_rows(texts, ids, rows, iteration=iteration, policy_version=version)

    def rollout(self, iteration: int, version: int) -> tuple[TrajectoryBatch, ScoreResult]:
        """Generate this rank's samples, then decode and score them all."""
        events = self.parts.events
        with (
            self.residency.generation(),
            events.span(Phase.GENERATE, iteration=iteration, policy_version=version),
        ):
            batch = self.generate_share(self.share, iteration, version)
        with self.residency.scoring(), events.span(Phase.SCORE, iteration=iteration, policy_version=version):
            score = self.parts.scorer(batch)
        return batch, score

    iteration: int | None = None  # the iteration running now (tags the residency spans)

    def run_iteration(self, iteration: int) -> IterationReport:
        self.iteration = iteration
        version = self.version.current
        t0 = time.perf_counter()
        batch, score = self.rollout(iteration, version)
        data = self.data_group
        batch = assign_advantages(batch, score, self.cfg.algo, group=data)
        t1 = time.perf_counter()
        self.residency.before_optimizer_step()
        training = Accumulation(
            self.parts.trainer, self.parts.events, iteration, version, global_sum(batch.num_units, data)
        )
        step_stats = train_logical_batch(training, [batch], self.cfg.algo.num_updates_per_batch)
        self.version.advance()
        reward_mean, reward_std = reward_summary(score.rewards[score.keep], data)
        return IterationReport(
            samples=int(global_sum(batch.batch_size, data)),
            reward_mean=reward_mean,
            reward_std=reward_std,
            train=training.stats.reduce(data),
            step=step_stats,
            phase_s={"rollout": t1 - t0, "train": time.perf_counter() - t1},
        )
