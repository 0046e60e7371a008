"""``colocated-overlap``: GenRL / flow_grpo's asynchronous-reward schedule (docs/design.md §4).

Colocated like ``colocated-sync``, but the rank's share is generated in sub-batches and each
finished sub-batch is decoded and scored by a background worker while the next one generates
(flow_grpo submits reward calls to a thread-pool executor during sampling)::

    generate sb0 ─▶ generate sb1 ─▶ generate sb2 ─▶ wait ─▶ advantages ─▶ train ─▶ step
                    score sb0 ───▶  score sb1 ───▶  score sb2

Every sample keeps its own seeded noise, so the trajectories are those of ``colocated-sync``; only
the batch composition of the forward (sub-batch vs whole share) differs.

On a GPU a thread alone overlaps only host work: both threads queue their kernels on the default stream,
so the decode and the reward wait behind the next generation's kernels. With ``runtime.score_stream``
(default) the worker runs on a side stream that first waits for an event recorded after its sub-batch was
generated (:class:`ScoreStream`): the same kernels on the same inputs, so the same rewards, free to fill the
generation's gaps. The generated latents stay referenced until every score is in, and the reward's
read-back to the host synchronises the side stream, so no memory is reused under it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

from digenrl.data.rank_shares import RankShare
from digenrl.data.trajectory import TrajectoryBatch
from digenrl.rollout.scoring import ScoreResult
from digenrl.runtime.observe.span_phases import Phase
from digenrl.systems.colocated_sync import ColocatedSync
from digenrl.systems.components import RankComponents

T = TypeVar("T")


class ScoreStream:
    """The background scorer's CUDA stream (module docstring); a pass-through on a CPU or when off."""

    def __init__(self, device: torch.device, enabled: bool) -> None:
        self.stream = torch.cuda.Stream(device) if enabled and device.type == "cuda" else None

    def mark_ready(self) -> torch.cuda.Event | None:
        """An event on the current (generating) stream after the work queued so far: the sub-batch's."""
        if self.stream is None:
            return None
        ready = torch.cuda.Event()
        ready.record()
        return ready

    def run(self, ready: torch.cuda.Event | None, fn: Callable[[], T]) -> T:
        """``fn()`` on the side stream once ``ready`` has passed (called from the worker thread: the current
        stream is per thread)."""
        if self.stream is None:
            return fn()
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(ready)
            return fn()


class ColocatedOverlap(ColocatedSync):
    name = "colocated-overlap"
    knobs = ("residency.train_resident", "colocated")
    track_reward_residency = False

    def setup(self) -> RankComponents:
        parts = super().setup()
        self.score_stream = ScoreStream(self.ctx.device, self.cfg.runtime.score_stream)
        return parts

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
        events, scorer, stream = self.parts.events, self.parts.scorer, self.score_stream

        def score(fragment: int, batch: TrajectoryBatch, ready: torch.cuda.Event | None) -> ScoreResult:
            with events.span(Phase.SCORE, iteration=iteration, fragment=fragment, policy_version=version):
                return stream.run(ready, lambda: scorer(batch))

        batches, futures = [], []
        with (
            self.residency.generation(),
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward") as pool,
        ):
            for j, part in enumerate(self.sub_batches()):
                with events.span(Phase.GENERATE, iteration=iteration, fragment=j, policy_version=version):
                    batch = self.generate_share(part, iteration, version)
                batches.append(batch)
                futures.append(pool.submit(score, j, batch, stream.mark_ready()))
            with events.span(Phase.WAIT_SCORE, iteration=iteration, policy_version=version):
                scores = [f.result() for f in futures]
        return TrajectoryBatch.cat(batches), ScoreResult.cat(scores)
