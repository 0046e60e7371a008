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

Evaluation (``eval.every``) scores there too: rollout call c of an evaluation goes to
``scorer_ranks[c mod S]`` as a request of kind ``eval``; the scorer replies with every reward term
(:meth:`Scorer.score_terms`), and the evaluating rank decodes its own latents for the grid. The trainers
then never build the reward model, and a scorer rank's iteration also serves the calls of that iteration's
evaluation, a number it knows from the config (:func:`digenrl.rollout.evaluate.rollout_calls`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace

import torch

from digenrl.data.trajectory import TrajectoryBatch
from digenrl.models.vae import LatentDecoder
from digenrl.rollout.evaluate import EvalScoring
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
        what = f"the rewards of fragment {fragment} of iteration {iteration}"
        reply = self._request(batch, iteration, "fragment", fragment, what, idle)
        return ScoreResult(
            rewards=_floats(reply["rewards"]), keep=torch.tensor(reply["keep"], dtype=torch.bool)
        )

    def evaluation_scoring(self, decoder: LatentDecoder) -> EvalScoring:
        """An evaluating rank's :data:`EvalScoring`: every reward term of rollout call c from scorer rank
        ``scorer_ranks[c mod S]``, the pixels for the grid decoded here with ``decoder``."""

        def score(batch: TrajectoryBatch, iteration: int, call: int) -> tuple[torch.Tensor, dict]:
            what = f"the rewards of evaluation call {call} of iteration {iteration}"
            reply = self._request(batch, iteration, "eval", call, what, None)
            return decoder.decode(batch.final_latents).cpu(), {
                k: _floats(v) for k, v in reply["terms"].items()
            }

        return score

    def _request(
        self,
        batch: TrajectoryBatch,
        iteration: int,
        kind: str,
        index: int,
        what: str,
        idle: Callable[[], bool] | None,
    ) -> dict:
        """Send ``batch`` (its scoring request) to the scorer of ``index`` and wait for its JSON reply."""
        scorer = self.scorer_of(index)
        data_key = f"score/it{iteration}/{kind}{index}/data"
        reply_key = f"score/it{iteration}/{kind}{index}/reply"
        ticket = self.plane.ticket(f"score/{scorer}")
        pending = start_send(scoring_request(batch), scorer, plane=self.plane, key=data_key)
        envelope = {
            "data": data_key,
            "reply": reply_key,
            "iteration": iteration,
            "kind": kind,
            "index": index,
        }
        self.plane.publish(f"score/{scorer}/req{ticket}", json.dumps(envelope))
        raw = self.plane.wait_for(reply_key, peer=scorer, what=what, timeout_s=self.timeout_s, idle=idle)
        self.plane.delete(reply_key)
        drain_sends([pending], self.plane, what=f"scorer rank {scorer} to take {kind} {index}")
        return json.loads(raw)


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
        self.evaluated: dict[int, int] = {}  # iteration -> rollout calls of its evaluation scored

    def serve_one(self, events: EventLogger, waiting_for: int) -> tuple[int, int, int]:
        """Wait for the next request (a ``wait_request`` span tagged ``waiting_for``, the iteration the
        rank is in), score it (a ``score`` span tagged with the request's own iteration and fragment, or an
        ``eval`` span for an evaluation's rollout call) and reply; returns (iteration, fragment or call,
        training samples scored: 0 for an evaluation)."""
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
        iteration, index = int(envelope["iteration"]), int(envelope["index"])
        batch, _ = recv_trajectories(
            None, plane=self.plane, key=envelope["data"], device=self.device, timeout_s=self.timeout_s
        )
        if envelope["kind"] == "eval":
            with events.span(
                Phase.EVAL, iteration=iteration, samples=batch.batch_size, extra={"call": index}
            ):
                _, terms = self.scorer.score_terms(batch.final_latents, list(batch.prompts))
            self.plane.publish(
                envelope["reply"], json.dumps({"terms": {k: _json(v) for k, v in terms.items()}})
            )
            self.evaluated[iteration] = self.evaluated.get(iteration, 0) + 1
            return iteration, index, 0
        with events.span(Phase.SCORE, iteration=iteration, fragment=index, samples=batch.batch_size):
            result = self.scorer(batch)
        reply = {"rewards": _json(result.rewards), "keep": [bool(k) for k in result.keep.tolist()]}
        self.plane.publish(envelope["reply"], json.dumps(reply))
        self.served[iteration] = self.served.get(iteration, 0) + 1
        return iteration, index, batch.batch_size


def _json(values: torch.Tensor) -> list[float | None]:
    """Rewards as JSON: non-finite values as null (JSON has no NaN)."""
    return [float(r) if math.isfinite(float(r)) else None for r in values.tolist()]


def _floats(values: list[float | None]) -> torch.Tensor:
    """:func:`_json`'s list back as float32, null as NaN."""
    return torch.tensor([math.nan if r is None else r for r in values], dtype=torch.float32)
