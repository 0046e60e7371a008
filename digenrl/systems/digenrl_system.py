"""``digenrl``: disaggregated FlowGRPO with GAP and TSP (DESIGN.md §3), switchable for ablations.

Generator ranks form D pipelines × S stages (``tsp.stages``; S = 1 is data parallelism). The logical
batch is cut into fragments of whole prompt groups (``gap.fragment_groups``); fragment f is produced by
pipeline f mod D. Each fragment flows through its pipeline's stages — stage s runs denoising steps
[b_s, b_{s+1}) from the :class:`~digenrl.tsp.TspPlan` and hands the partial trajectory to stage s+1 —
and the last stage decodes, scores, normalises the fragment's groups and spreads its training units
over *all* trainer ranks (by (sample, timestep), :func:`~digenrl.gap.shard_units`)::

    pipeline stage 0 │ f0 steps 0..b │ f2 steps 0..b │ f4 … │            (fill / drain: S − 1 slots)
    pipeline stage 1 │               │ f0 steps b..T + score ─▶ ship │ f2 … ─▶ ship │
    trainers         │ ······························│ accumulate f0 │ accumulate f2 │ … │ step │ push θ │

With GAP on, a trainer accumulates each fragment's gradient the moment it arrives and steps once
after the last one: the gradient is the same sum of per-unit terms, weighted by 1/(total units), as
the synchronous update — only *when* each term is computed changes. With GAP off the trainer waits
for every fragment first (the separate-sync timeline, with TSP still available). The policy is
on-policy (TCSS off): every fragment of iteration k is generated with θ_k, and generators pull θ_{k+1}
after their last fragment.

Per-fragment advantages need complete groups and group statistics only (``algo.adv_std=group``):
a global std would need the whole batch before any fragment could train.
"""

from __future__ import annotations

import logging
import time

import torch

from digenrl.config import Config, ConfigError
from digenrl.gap.fragments import FragmentPlan
from digenrl.gap.unit_sharding import shard_units
from digenrl.rollout.trajectory import TrajectoryBatch
from digenrl.runtime.profiles import load_profile
from digenrl.runtime.transfer import recv_trajectories, send_trajectories
from digenrl.systems.base import IterationReport
from digenrl.systems.components import RankComponents
from digenrl.systems.phases import (
    TrainStats,
    assign_advantages,
    global_sum,
    reward_summary,
    train_on,
    units_per_sample,
)
from digenrl.systems.separate import SeparateRequirements, SeparateSystem, generator_report, separate_layout
from digenrl.tsp.pipeline import TspLayout, plan_tsp

log = logging.getLogger(__name__)


class DigenRLRequirements(SeparateRequirements):
    def check(self, cfg: Config, world_size: int) -> None:
        super().check(cfg, world_size)
        layout = separate_layout(cfg, world_size)
        tsp = TspLayout(layout.generator_ranks, cfg.tsp.stages)
        FragmentPlan(cfg.algo.prompts_per_iteration, cfg.gap.fragment_groups, tsp.num_pipelines)
        if cfg.gap.enabled and cfg.algo.adv_std != "group":
            raise ConfigError(
                "gap.enabled=true normalises advantages per fragment, which needs algo.adv_std=group "
                f"(got {cfg.algo.adv_std!r}); a global std needs the whole batch before any fragment trains"
            )
        if cfg.tag.enabled or cfg.tcss.enabled:
            raise ConfigError("tag.enabled and tcss.enabled are not built yet; set them to false")
        samples = cfg.gap.fragment_groups * cfg.algo.group_size
        if samples < len(layout.trainer_ranks):
            raise ConfigError(
                f"a fragment of gap.fragment_groups={cfg.gap.fragment_groups} groups holds {samples} "
                f"samples, fewer than pools.trainers={len(layout.trainer_ranks)}: every trainer needs a "
                "unit of every fragment"
            )


class DigenRL(SeparateSystem):
    name = "digenrl"
    requirements = DigenRLRequirements(name="digenrl", prompts_divisible_by_world=False)

    def setup(self) -> RankComponents:
        parts = super().setup()
        cfg = self.cfg
        self.tsp_layout = TspLayout(self.layout.generator_ranks, cfg.tsp.stages)
        self.tsp_plan = plan_tsp(self.tsp_layout, parts.sampler.num_steps, profile=load_profile(cfg.profile))
        fragment_groups = cfg.gap.fragment_groups
        self.fragments = FragmentPlan(
            cfg.algo.prompts_per_iteration, fragment_groups, self.tsp_layout.num_pipelines
        )
        if self.ctx.rank == 0:
            log.info(
                "GAP %s: %s", "on" if cfg.gap.enabled else "off", self.fragments.describe(cfg.algo.group_size)
            )
            log.info("%s", self.tsp_plan.describe())
        return parts

    def before_first_iteration(self) -> None:
        self.initial_sync()

    def run_iteration(self, iteration: int) -> IterationReport:
        if self.is_trainer:
            return self.train_iteration(iteration)
        return self.generate_iteration(iteration)

    # ------------------------------------------------------------------ generator pool: D × S
    def _key(self, iteration: int, fragment: int, what: str) -> str:
        return f"it{iteration}/frag{fragment}/{what}"

    def generate_iteration(self, iteration: int) -> IterationReport:
        events, version, rank = self.parts.events, self.policy_version, self.ctx.rank
        engine, tsp = self.parts.engine, self.tsp_layout
        pipeline, stage = tsp.pipeline_of(rank), tsp.stage_of(rank)
        steps = self.tsp_plan.steps_of(rank)
        prompts = self.parts.prompts.prompts_for(iteration, self.cfg.algo.prompts_per_iteration)
        rewards, samples, t0 = [], 0, time.perf_counter()
        for f in self.fragments.fragments_of(pipeline):
            if tsp.is_first_stage(rank):
                ids = list(self.fragments.prompt_ids(f))
                batch = engine.start(
                    [prompts[i] for i in ids], ids, iteration=iteration, policy_version=version
                )
            else:
                with events.span("wait_stage", iteration=iteration, fragment=f, policy_version=version):
                    batch, _ = recv_trajectories(
                        tsp.prev_rank(rank),
                        plane=self.plane,
                        key=self._key(iteration, f, f"stage{stage}"),
                        device=self.ctx.device,
                        timeout_s=self.cfg.runtime.timeout_s,
                    )
            with events.span("generate", iteration=iteration, fragment=f, policy_version=version):
                batch = engine.advance(batch, steps.stop)
            if not tsp.is_last_stage(rank):
                with events.span("transfer", iteration=iteration, fragment=f, policy_version=version):
                    send_trajectories(
                        batch,
                        tsp.next_rank(rank),
                        plane=self.plane,
                        key=self._key(iteration, f, f"stage{stage + 1}"),
                    )
                continue
            with events.span("score", iteration=iteration, fragment=f, policy_version=version):
                score = self.parts.scorer(batch)
                batch = assign_advantages(batch, score, self.cfg.algo, local=True)
            with events.span("transfer", iteration=iteration, fragment=f, policy_version=version):
                for trainer, shard in zip(
                    self.trainer_ranks, shard_units(batch, len(self.trainer_ranks)), strict=True
                ):
                    send_trajectories(
                        shard, trainer, plane=self.plane, key=self._key(iteration, f, f"to{trainer}")
                    )
            rewards.append(score.rewards[score.keep])
            samples += batch.batch_size
        t1 = time.perf_counter()
        self.pull_weights(version + 1, iteration)
        self.policy_version = version + 1
        local = torch.cat(rewards) if rewards else torch.zeros(0)
        return generator_report(local, samples, {"rollout": t1 - t0, "sync": time.perf_counter() - t1})

    # ------------------------------------------------------------------ trainer pool
    def train_iteration(self, iteration: int) -> IterationReport:
        cfg, events, version, group = (
            self.cfg,
            self.parts.events,
            self.policy_version,
            self.groups.trainer_group,
        )
        trainer, rank = self.parts.trainer, self.ctx.rank
        total_units = (
            cfg.algo.prompts_per_iteration * cfg.algo.group_size * units_per_sample(cfg, self.parts.sampler)
        )
        stats, received = TrainStats(), []
        t0 = time.perf_counter()
        for f in range(self.fragments.num_fragments):
            source = self.tsp_layout.last_stage_ranks[self.fragments.pipeline_of(f)]
            with events.span("wait_fragment", iteration=iteration, fragment=f, policy_version=version):
                shard, _ = recv_trajectories(
                    source,
                    plane=self.plane,
                    key=self._key(iteration, f, f"to{rank}"),
                    device=self.ctx.device,
                    timeout_s=cfg.runtime.timeout_s,
                )
            self.check_staleness(shard, version)
            received.append(shard)
            if cfg.gap.enabled:  # GAP: this fragment's gradient now, while generators make the next
                with events.span("train", iteration=iteration, fragment=f, policy_version=version):
                    train_on(trainer, shard, total_units, stats)
        if not cfg.gap.enabled:
            for f, shard in enumerate(received):
                with events.span("train", iteration=iteration, fragment=f, policy_version=version):
                    train_on(trainer, shard, total_units, stats)
        with events.span("optimizer", iteration=iteration, policy_version=version):
            step_stats = trainer.step()
        t1 = time.perf_counter()
        with events.span("sync", iteration=iteration, policy_version=version + 1):
            sync = self.push_weights(version + 1)
        self.policy_version = version + 1
        batch = TrajectoryBatch.cat(received)
        # Every sample contributes the same number of units, so unit-weighted reward moments are the
        # sample moments.
        reward_mean, reward_std = reward_summary(batch.rewards, group)
        units = global_sum(batch.num_units, group)
        return IterationReport(
            samples=round(units / units_per_sample(cfg, self.parts.sampler)),
            reward_mean=reward_mean,
            reward_std=reward_std,
            train=stats.reduce(group),
            step={**step_stats, "sync_bytes": float(sync.bytes), "sync_s": sync.seconds, "staleness": 0},
            phase_s={"fragments_and_train": t1 - t0, "sync": time.perf_counter() - t1},
        )
