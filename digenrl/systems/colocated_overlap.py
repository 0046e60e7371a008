"""``colocated-overlap``: GenRL / flow_grpo's asynchronous-reward schedule (docs/design.md §4).

Colocated like ``colocated-sync``, but the rank's share is generated in sub-batches and each
finished sub-batch is decoded and scored by a background worker while the next one generates
(flow_grpo submits reward calls to a thread-pool executor during sampling)::

    generate sb0 ─▶ generate sb1 ─▶ generate sb2 ─▶ wait ─▶ advantages ─▶ train ─▶ step
                    score sb0 ───▶  score sb1 ───▶  score sb2

Every sample keeps its own seeded noise, so the trajectories are those of ``colocated-sync``; only
the batch composition of the forward (sub-batch vs whole share) differs.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from digenrl.data.rank_shares import RankShare
from digenrl.data.trajectory import TrajectoryBatch
from digenrl.rollout.scoring import ScoreResult
from digenrl.runtime.observe.span_phases import Phase
from digenrl.systems.colocated_sync import ColocatedSync


class ColocatedOverlap(ColocatedSync):
    name = "colocated-overlap"
    knobs = ("residency.train_resident", "colocated")
    track_reward_residency = False

    def sub_batches(self) -> list[RankShare]:
        """This rank's share cut into sub-batches of ``sampler.samples_per_forward`` samples rounded down to
        whole groups (at least one group's worth; one group when unset)."""
        g = self.cfg.algo.group_size
        spf = self.cfg.sampler.samples_per_forward
        size = (max(1, spf // g) if spf else 1) * g
        share = self.share
        return [
            RankShare(a, min(a + size, share.stop), share.micro_batch_size)
            for a in range(share.start, share.stop, size)
        ]

    def rollout(self, iteration: int, version: int) -> tuple[TrajectoryBatch, ScoreResult]:
        events, scorer = self.parts.events, self.parts.scorer

        def score(fragment: int, batch: TrajectoryBatch) -> ScoreResult:
            with events.span(Phase.SCORE, iteration=iteration, fragment=fragment, policy_version=version):
                return scorer(batch)

        batches, futures = [], []
        with (
            self.residency.generation(),
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward") as pool,
        ):
            for j, part in enumerate(self.sub_batches()):
                with events.span(Phase.GENERATE, iteration=iteration, fragment=j, policy_version=version):
                    batch = self.generate_share(part, iteration, version)
                batches.append(batch)
                futures.append(pool.submit(score, j, batch))
            with events.span(Phase.WAIT_SCORE, iteration=iteration, policy_version=version):
                scores = [f.result() for f in futures]
        return TrajectoryBatch.cat(batches), ScoreResult.cat(scores)
