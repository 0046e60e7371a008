"""Scorer pools: rewards computed on ranks of their own (docs/design.md §2 "Processes and roles").

Heavy reward models (PickScore, OCR, GenEval detectors, VLM judges of ~7B parameters) are where
disaggregation can win: colocated systems must hold them beside the policy or swap them in and out,
while a separate layout can give them their own GPUs (``pools.scorers=N``). The producer of a finished
fragment — a generator pipeline's last stage, a separate baseline's generator, or a TAG helper — hands
the fragment's final latents to a scorer rank and gets the rewards back; advantages, shipping to the
trainers and everything else stay where they were.

Protocol (control plane on the c10d store, data plane point-to-point, both as in
:mod:`digenrl.runtime.comm.transfer`):

* fragment f of iteration k goes to scorer ``scorer_ranks[f mod S]`` — a fixed rule, so each scorer knows
  how many requests an iteration brings it (:meth:`ScorerPool.expected`);
* the producer draws the scorer's next request ticket j and publishes ``score/<scorer>/req<j>`` naming the
  key its latents travel under (a zero-record :class:`TrajectoryBatch`: identity, prompts, condition and
  final latents only — the transition records stay with the producer) and the reply key;
* the scorer serves its requests in ticket order (a sender's tickets grow with its send order, so the
  point-to-point receives match), decodes and scores, and publishes the rewards and keep mask under the
  reply key (a few floats per sample: a store value, like every other small fact);
* the producer waits for the reply — a generator joins pending weight syncs meanwhile (``idle``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace

import torch

from digenrl.data.trajectory import TrajectoryBatch
from digenrl.rollout.scoring import Scorer, ScoreResult
from digenrl.runtime.comm.control_plane import ControlPlane
from digenrl.runtime.comm.transfer import drain_sends, recv_trajectories, start_send
from digenrl.runtime.observe.events import EventLogger
from digenrl.runtime.observe.span_phases import Phase


def scoring_request(batch: TrajectoryBatch) -> TrajectoryBatch:
    """What a scorer needs of a finished fragment: the final latents, prompts, ids and condition; the
    per-step records (latents, log-probs, sigmas) are cut to zero trained steps and do not travel."""
    if batch.final_latents is None:
        raise ValueError("a fragment to score must carry its final latents")
    cut = {name: getattr(batch, name)[:, :0] for name in ("latents", "next_latents", "log_probs")}
    cut |= {name: getattr(batch, name)[:, :0] for name in ("step_indices", "sigmas", "next_sigmas")}
    return replace(batch, **cut, rewards=None, advantages=None)


class ScorerPool:
    """The producer's side: send a fragment to its scorer, wait for the rewards."""

    def __init__(self, plane: ControlPlane, scorer_ranks: tuple[int, ...], *, timeout_s: float) -> None:
        if not scorer_ranks:
            raise ValueError("a scorer pool needs at least one scorer rank")
        self.plane = plane
        self.scorer_ranks = tuple(scorer_ranks)
        self.timeout_s = timeout_s

    def scorer_of(self, fragment: int) -> int:
        return self.scorer_ranks[fragment % len(self.scorer_ranks)]

    def expected(self, scorer: int, num_fragments: int) -> int:
        """How many fragments of one iteration scorer rank ``scorer`` scores."""
        index = self.scorer_ranks.index(scorer)
        return len(range(index, num_fragments, len(self.scorer_ranks)))

    def score(
        self, batch: TrajectoryBatch, iteration: int, fragment: int, idle: Callable[[], bool] | None = None
    ) -> ScoreResult:
        """Have fragment ``fragment``'s scorer decode and score it; blocks until the rewards are back."""
        scorer = self.scorer_of(fragment)
        data_key = f"score/it{iteration}/frag{fragment}/data"
        reply_key = f"score/it{iteration}/frag{fragment}/reply"
        ticket = self.plane.ticket(f"score/{scorer}")
        pending = start_send(scoring_request(batch), scorer, plane=self.plane, key=data_key)
        envelope = {"data": data_key, "reply": reply_key, "iteration": iteration, "fragment": fragment}
        self.plane.publish(f"score/{scorer}/req{ticket}", json.dumps(envelope))
        raw = self.plane.wait_for(
            reply_key,
            peer=scorer,
            what=f"the rewards of fragment {fragment} of iteration {iteration}",
            timeout_s=self.timeout_s,
            idle=idle,
        )
        self.plane.delete(reply_key)
        drain_sends([pending], self.plane, what=f"scorer rank {scorer} to take fragment {fragment}")
        reply = json.loads(raw)
        rewards = torch.tensor([math.nan if r is None else r for r in reply["rewards"]], dtype=torch.float32)
        return ScoreResult(rewards=rewards, keep=torch.tensor(reply["keep"], dtype=torch.bool))


class ScoringServer:
    """A scorer rank's side: serve this rank's requests in ticket order with its decoder and reward."""

    def __init__(
        self, scorer: Scorer, plane: ControlPlane, *, device: torch.device, timeout_s: float
    ) -> None:
        self.scorer = scorer
        self.plane = plane
        self.device = device
        self.timeout_s = timeout_s
        self._next = 0  # the next request ticket of this rank
        self.served: dict[int, int] = {}  # iteration -> fragments scored

    def serve_one(self, events: EventLogger, waiting_for: int) -> tuple[int, int, int]:
        """Wait for the next request (a ``wait_request`` span tagged ``waiting_for``, the iteration the
        rank is in), score it (a ``score`` span tagged with the request's own iteration and fragment) and
        reply; returns (iteration, fragment, samples)."""
        key = f"score/{self.plane.rank}/req{self._next}"
        with events.span(Phase.WAIT_REQUEST, iteration=waiting_for):
            raw = self.plane.wait_for(
                key,
                peer="the generator pool",
                what=f"scoring request #{self._next}",
                timeout_s=self.timeout_s,
            )
        self.plane.delete(key)
        self._next += 1
        envelope = json.loads(raw)
        iteration, fragment = int(envelope["iteration"]), int(envelope["fragment"])
        batch, _ = recv_trajectories(
            None, plane=self.plane, key=envelope["data"], device=self.device, timeout_s=self.timeout_s
        )
        with events.span(Phase.SCORE, iteration=iteration, fragment=fragment, samples=batch.batch_size):
            result = self.scorer(batch)
        rewards = [float(r) if math.isfinite(float(r)) else None for r in result.rewards.tolist()]
        reply = {"rewards": rewards, "keep": [bool(k) for k in result.keep.tolist()]}
        self.plane.publish(envelope["reply"], json.dumps(reply))
        self.served[iteration] = self.served.get(iteration, 0) + 1
        return iteration, fragment, batch.batch_size
