"""``separate-sync``: naive disaggregation with a full-batch barrier (docs/design.md §4).

Generator pool and trainer pool alternate; each waits for the other every iteration::

    generators │ generate k ─ score k ─ advantages ─ ship k │ ············ idle ············ │ pull θ_k+1 │
    trainers   │ ······ idle ······ │ receive k │ train k (accumulate all) ─ optimizer step │ push θ_k+1 │

The bubbles this leaves — trainers idle during generation, generators idle during training — are
what GAP, TSP, TAG and TCSS remove. Same sampler, reward, loss, trainer and sync code as every
other system; with the same seed it trains on exactly the trajectories ``colocated-sync`` generates.
"""

from __future__ import annotations

import time

from digenrl.async_policy.tcss import StalenessStats
from digenrl.data.trajectory import TrajectoryBatch
from digenrl.rollout.scoring import ScoreResult
from digenrl.runtime.comm.distributed import global_sum
from digenrl.runtime.faults.fault_injection import inject_delay
from digenrl.runtime.observe.span_phases import Phase
from digenrl.systems.base import IterationReport
from digenrl.systems.phases import Accumulation, assign_advantages, train_logical_batch
from digenrl.systems.separate import SeparateSystem, generator_report


class SeparateSync(SeparateSystem):
    name = "separate-sync"
    # the rollout ends in a gather over the generator pool: pushes are joined in wait_for_version only
    joins_pushes_while_waiting = False

    def before_first_iteration(self) -> None:
        self.initial_sync()

    def my_fragment(self) -> int:
        """This generator's fragment: its contiguous share of the iteration's samples (its sequence-parallel
        group's, shared by the group's ranks)."""
        return self.generator_ranks.index(self.ctx.rank) // self.plan.generator_sequence_parallel

    def advantages(self, batch: TrajectoryBatch, score: ScoreResult) -> TrajectoryBatch:
        """Group advantages with rewards gathered over the generator pool (it holds the whole batch; one
        rank per sequence-parallel group of it)."""
        group = self.data_group(self.generator_sequence, self.groups.generator_group)
        return assign_advantages(batch, score, self.cfg.algo, group=group)

    # ------------------------------------------------------------------ generator pool
    def rollout(self, iteration: int) -> tuple[TrajectoryBatch, ScoreResult]:
        """Generate, score and normalise this generator's samples with the weights it holds (a share that
        cuts a group: its groups started and cut to the share before any step runs, as a TAG helper does)."""
        events, version, engine = self.parts.events, self.version.current, self.parts.engine
        prompts = self.parts.prompts.prompts_for(iteration, self.cfg.algo.prompts_per_iteration)
        plan, fragment = self.stream.plan, self.my_fragment()
        ids = list(plan.prompt_ids(fragment))
        texts = [prompts[i] for i in ids]
        samples = plan.fragment_samples(self.cfg.algo.group_size)
        with events.span(Phase.GENERATE, iteration=iteration, policy_version=version, samples=samples):
            inject_delay(self.ctx.rank, "generate")  # robustness tests only: a deliberately slow generator
            rows = plan.rows(fragment) if plan.splits_groups else None
            batch = engine.generate_rows(texts, ids, rows, iteration=iteration, policy_version=version)
        with events.span(self.score_phase, iteration=iteration, policy_version=version):
            score = self.score(batch, iteration, self.my_fragment())
            batch = self.advantages(batch, score)
        return batch, score

    def ship(self, batch: TrajectoryBatch, iteration: int) -> None:
        """Send the fragment to the trainers: from the first rank of a sequence-parallel group only (its
        peers computed the same fragment)."""
        if self.generator_sequence is not None and self.generator_sequence.local:
            return
        with self.parts.events.span(Phase.TRANSFER, iteration=iteration, policy_version=self.version.current):
            tags = {"policy_version": self.version.current, "producer": self.ctx.rank}
            self.ship_and_wait(batch, iteration, self.my_fragment(), tags)

    def generate_iteration(self, iteration: int) -> IterationReport:
        t0 = time.perf_counter()
        batch, score = self.rollout(iteration)
        self.ship(batch, iteration)
        t1 = time.perf_counter()
        self.wait_for_version(iteration + 1, iteration)
        phase_s = {"rollout": t1 - t0, "sync": time.perf_counter() - t1}
        return generator_report(score.rewards[score.keep], batch.batch_size, phase_s)

    # ------------------------------------------------------------------ trainer pool
    def train_iteration(self, iteration: int) -> IterationReport:
        events, version, group = self.parts.events, self.version.current, self.groups.trainer_group
        t0, staleness = time.perf_counter(), StalenessStats()
        with events.span(Phase.WAIT_TRANSFER, iteration=iteration, policy_version=version):
            batch = self.receive_all(iteration, version, staleness)
        t1 = time.perf_counter()
        data = self.data_group(self.trainer_sequence, group)  # each sample counted once per group
        training = Accumulation(
            self.parts.trainer, events, iteration, version, global_sum(batch.num_units, data)
        )
        step_stats = train_logical_batch(training, [batch], self.cfg.algo.num_updates_per_batch)
        t2 = time.perf_counter()
        sync = self.push_next_version(iteration)
        phase_s = {"wait_rollout": t1 - t0, "train": t2 - t1, "sync": time.perf_counter() - t2}
        return self.trainer_report(
            batch.rewards, batch.batch_size, training, step_stats, sync, staleness, phase_s
        )
