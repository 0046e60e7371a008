"""``colocated-overlap``: GenRL / flow_grpo's asynchronous-reward schedule (docs/design.md §4).

Colocated like ``colocated-sync``, but the rank's groups are generated in sub-batches and each
finished sub-batch is decoded and scored by a background worker while the next one generates
(flow_grpo submits reward calls to a thread-pool executor during sampling)::

    generate sb0 ─▶ generate sb1 ─▶ generate sb2 ─▶ wait ─▶ advantages ─▶ train ─▶ step
                    score sb0 ───▶  score sb1 ───▶  score sb2

Every sample keeps its own seeded noise, so the trajectories are those of ``colocated-sync``; only
the batch composition of the forward (sub-batch vs whole share) differs.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from digenrl.data.trajectory import TrajectoryBatch
from digenrl.rollout.scoring import ScoreResult
from digenrl.systems.colocated_sync import ColocatedSync


class ColocatedOverlap(ColocatedSync):
    name = "colocated-overlap"
    knobs = ("residency.train_resident",)
    track_reward_residency = False

    def sub_batches(self, ids: list[int]) -> list[list[int]]:
        """Groups per sub-batch: ``sampler.samples_per_forward`` samples (at least one group)."""
        g = self.cfg.algo.group_size
        groups = (
            max(1, self.cfg.sampler.samples_per_forward // g) if self.cfg.sampler.samples_per_forward else 1
        )
        return [ids[i : i + groups] for i in range(0, len(ids), groups)]

    def rollout(self, iteration: int, version: int) -> tuple[TrajectoryBatch, ScoreResult]:
        events, engine, scorer = self.parts.events, self.parts.engine, self.parts.scorer
        prompts, ids = self.my_prompt_ids(iteration)
        text = dict(zip(ids, prompts, strict=True))

        def score(fragment: int, batch: TrajectoryBatch) -> ScoreResult:
            with events.span("score", iteration=iteration, fragment=fragment, policy_version=version):
                return scorer(batch)

        batches, futures = [], []
        with (
            self.residency.generation(),
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward") as pool,
        ):
            for j, chunk in enumerate(self.sub_batches(ids)):
                with events.span("generate", iteration=iteration, fragment=j, policy_version=version):
                    batch = engine.generate(
                        [text[i] for i in chunk], chunk, iteration=iteration, policy_version=version
                    )
                batches.append(batch)
                futures.append(pool.submit(score, j, batch))
            with events.span("wait_score", iteration=iteration, policy_version=version):
                scores = [f.result() for f in futures]
        return TrajectoryBatch.cat(batches), ScoreResult.cat(scores)
