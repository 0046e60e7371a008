"""``colocated-sync``: the veRL-Omni / flow_grpo schedule (DESIGN.md §4).

Every rank holds the whole policy and, each iteration, in turn::

    generate its share of prompt groups ─▶ decode + score ─▶ advantages (rewards gathered over all
    ranks) ─▶ accumulate the gradient of its units ─▶ optimizer step (gradients reduced) ─▶ next

No weight sync is needed: the rank that trains is the rank that generates. With one process this is
plain single-GPU FlowGRPO.
"""

from __future__ import annotations

import time

from digenrl.rollout.scoring import ScoreResult
from digenrl.rollout.trajectory import TrajectoryBatch
from digenrl.systems import SystemRequirements
from digenrl.systems.base import IterationReport, System
from digenrl.systems.components import RankComponents, build_rank_components
from digenrl.systems.phases import assign_advantages, global_sum, reward_summary, train_logical_batch


class ColocatedSync(System):
    name = "colocated-sync"
    requirements = SystemRequirements(name="colocated-sync", prompts_divisible_by_world=True)

    def setup(self) -> RankComponents:
        return build_rank_components(
            self.cfg, self.ctx, role="colocated", generate=True, train=True, clock_origin=self.clock_origin
        )

    def my_prompt_ids(self, iteration: int) -> tuple[list[str], list[int]]:
        """This rank's contiguous share of the iteration's prompt groups."""
        prompts = self.parts.prompts.prompts_for(iteration, self.cfg.algo.prompts_per_iteration)
        per_rank = len(prompts) // self.ctx.world_size
        mine = list(range(self.ctx.rank * per_rank, (self.ctx.rank + 1) * per_rank))
        return [prompts[i] for i in mine], mine

    def rollout(self, iteration: int, version: int) -> tuple[TrajectoryBatch, ScoreResult]:
        """Generate every group of this rank, then decode and score them all."""
        events = self.parts.events
        prompts, ids = self.my_prompt_ids(iteration)
        with events.span("generate", iteration=iteration, policy_version=version, samples=len(ids)):
            batch = self.parts.engine.generate(prompts, ids, iteration=iteration, policy_version=version)
        with events.span("score", iteration=iteration, policy_version=version):
            score = self.parts.scorer(batch)
        return batch, score

    def run_iteration(self, iteration: int) -> IterationReport:
        version = self.policy_version
        t0 = time.perf_counter()
        batch, score = self.rollout(iteration, version)
        batch = assign_advantages(batch, score, self.cfg.algo)
        t1 = time.perf_counter()
        stats, step_stats = train_logical_batch(
            self.parts.trainer,
            [batch],
            self.cfg.algo.num_updates_per_batch,
            self.parts.events,
            iteration,
            version,
        )
        self.policy_version = version + 1
        reward_mean, reward_std = reward_summary(score.rewards[score.keep])
        return IterationReport(
            samples=int(global_sum(batch.batch_size)),
            reward_mean=reward_mean,
            reward_std=reward_std,
            train=stats.reduce(),
            step=step_stats,
            phase_s={"rollout": t1 - t0, "train": time.perf_counter() - t1},
        )
