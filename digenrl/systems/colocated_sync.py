"""``colocated-sync``: the veRL-Omni / flow_grpo schedule (DESIGN.md §4).

Every rank holds the whole policy and, each iteration, in turn::

    generate its share of prompt groups ─▶ decode + score ─▶ advantages (rewards gathered over all
    ranks) ─▶ accumulate the gradient of its units ─▶ optimizer step (gradients reduced) ─▶ next

No weight sync is needed: the rank that trains is the rank that generates. With one process this is
plain single-GPU FlowGRPO.
"""

from __future__ import annotations

import time

from digenrl.systems import SystemRequirements
from digenrl.systems.base import IterationReport, System
from digenrl.systems.components import RankComponents, build_rank_components
from digenrl.systems.phases import TrainStats, assign_advantages, global_sum, reward_summary, train_on


class ColocatedSync(System):
    name = "colocated-sync"
    requirements = SystemRequirements(name="colocated-sync", prompts_divisible_by_world=True)

    def setup(self) -> RankComponents:
        return build_rank_components(
            self.cfg, self.ctx, role="colocated", generate=True, train=True, clock_origin=self.clock_origin
        )

    def run_iteration(self, iteration: int) -> IterationReport:
        cfg, parts, rank, world = self.cfg, self.parts, self.ctx.rank, self.ctx.world_size
        events, engine, scorer, trainer = parts.events, parts.engine, parts.scorer, parts.trainer
        version = self.policy_version
        prompts = parts.prompts.prompts_for(iteration, cfg.algo.prompts_per_iteration)
        per_rank = len(prompts) // world
        mine = list(range(rank * per_rank, (rank + 1) * per_rank))
        phase_s: dict[str, float] = {}

        t = time.perf_counter()
        with events.span("generate", iteration=iteration, policy_version=version):
            batch = engine.generate(
                [prompts[i] for i in mine], mine, iteration=iteration, policy_version=version
            )
        phase_s["generate"] = time.perf_counter() - t

        t = time.perf_counter()
        with events.span("score", iteration=iteration, policy_version=version):
            score = scorer(batch)
            batch = assign_advantages(batch, score, cfg.algo)
        phase_s["score"] = time.perf_counter() - t
        reward_mean, reward_std = reward_summary(score.rewards[score.keep])

        t = time.perf_counter()
        total_units = global_sum(batch.num_units)
        stats = TrainStats()
        step_stats: dict[str, float] = {}
        for _ in range(cfg.algo.num_updates_per_batch):
            with events.span("train", iteration=iteration, policy_version=version):
                train_on(trainer, batch, total_units, stats)
            with events.span("optimizer", iteration=iteration, policy_version=version):
                step_stats = trainer.step()
        self.policy_version = version + 1
        phase_s["train"] = time.perf_counter() - t
        return IterationReport(
            samples=int(global_sum(batch.batch_size)),
            reward_mean=reward_mean,
            reward_std=reward_std,
            train=stats.reduce(),
            step=step_stats,
            phase_s=phase_s,
        )
