"""One generator rank's place in a TSP pipeline (docs/design.md §3 "TSP").

A :class:`StageWorker` runs its stage's denoising steps ``[b_s, b_{s+1})`` on each in-flight fragment and
hands the partial trajectory to the next stage. Between two stages of a pipeline the messages form one
ordered sequence: message j from stage s to stage s+1 sits under ``pipe<p>/stage<s+1>/msg<j>`` and is
either a fragment (the key its trajectory travels under, with the fragment's tags: iteration, index,
the policy version it is bound to) or the end of an iteration's stream. With dynamic claiming a later
stage cannot know which fragments its pipeline will get, so stage 0 says so explicitly.

The worker logs its own spans (``generate`` for its steps, ``transfer`` for a hand-off, ``wait_stage``
while it waits for the previous stage) and adds the seconds of its steps to the fragment's ``steps_s``
tag, which the last stage ships with it (the trainers' TAG policy reads the producers' costs from it).

Hand-offs are buffered sends (:func:`digenrl.runtime.comm.transfer.start_send`): stage s starts its next
fragment while stage s+1 receives this one, which is what makes the stages a pipeline. At most
``max_in_flight`` hand-offs wait for their receiver; beyond that the stage waits (servicing whatever the
caller's ``idle`` does meanwhile — a generator joins pending weight syncs).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from digenrl.data.trajectory import TrajectoryBatch
from digenrl.rollout.engine import RolloutEngine
from digenrl.runtime.comm.control_plane import ControlPlane
from digenrl.runtime.comm.transfer import PendingSend, drain_sends, recv_trajectories, start_send
from digenrl.runtime.faults.fault_injection import inject_delay
from digenrl.runtime.observe.events import EventLogger
from digenrl.runtime.observe.span_phases import Phase
from digenrl.tsp.pipeline import TspPlan


@dataclass
class InFlight:
    """A fragment moving through a pipeline: the partial trajectory and its tags."""

    batch: TrajectoryBatch
    tags: dict = field(default_factory=dict)

    @property
    def iteration(self) -> int:
        return int(self.tags["iteration"])

    @property
    def fragment(self) -> int:
        return int(self.tags["fragment"])

    @property
    def version(self) -> int:
        return int(self.tags["policy_version"])


@dataclass(frozen=True)
class EndOfIteration:
    """Stage 0 claimed nothing more of ``iteration``: no more fragments of it come down this pipeline."""

    iteration: int


class StageWorker:
    """Stage ``stage`` of TSP pipeline ``pipeline`` on this rank (see the module docstring)."""

    def __init__(
        self,
        engine: RolloutEngine,
        plan: TspPlan,
        rank: int,
        plane: ControlPlane,
        events: EventLogger,
        *,
        device: torch.device,
        timeout_s: float,
        max_in_flight: int = 2,
    ) -> None:
        layout = plan.layout
        self.engine = engine
        self.plan = plan
        self.rank = rank
        self.plane = plane
        self.events = events
        self.device = device
        self.timeout_s = timeout_s
        self.max_in_flight = max_in_flight
        self.pipeline = layout.pipeline_of(rank)
        self.stage = layout.stage_of(rank)
        self.steps = plan.steps_of(rank)
        self.is_first = layout.is_first_stage(rank)
        self.is_last = layout.is_last_stage(rank)
        self.next_rank = layout.next_rank(rank)
        self.prev_rank = layout.prev_rank(rank)
        self._sent = 0  # messages handed to the next stage
        self._received = 0  # messages taken from the previous stage
        self._pending: list[PendingSend] = []

    # ------------------------------------------------------------------ the stage's work
    def run(self, fragment: InFlight) -> InFlight:
        """Run this stage's steps (a ``generate`` span, its seconds added to the ``steps_s`` tag); refuses a
        fragment that is not at the stage's first step (a mis-routed or duplicated hand-off)."""
        batch = fragment.batch
        if batch.steps_done != self.steps.start:
            raise ValueError(
                f"rank {self.rank} runs steps [{self.steps.start}, {self.steps.stop}) but fragment "
                f"{fragment.tags.get('fragment')} of iteration {batch.iteration} has steps_done="
                f"{batch.steps_done}"
            )
        inject_delay(self.rank, "generate")  # robustness tests only: a deliberately slow generator
        start = time.perf_counter()
        with self.events.span(
            Phase.GENERATE,
            iteration=fragment.iteration,
            fragment=fragment.fragment,
            policy_version=fragment.version,
            samples=batch.batch_size,
            extra={"stage": self.stage, "steps": [self.steps.start, self.steps.stop]},
        ):
            batch = self.engine.advance(batch, self.steps.stop)
        steps_s = fragment.tags.get("steps_s", 0.0) + time.perf_counter() - start
        return InFlight(batch, {**fragment.tags, "steps_s": steps_s})

    # ------------------------------------------------------------------ links
    def _envelope_key(self, stage: int, index: int) -> str:
        return f"pipe{self.pipeline}/stage{stage}/msg{index}"

    def hand_on(self, fragment: InFlight, idle: Callable[[], bool] | None = None) -> PendingSend:
        """Send the partial trajectory to the next stage (buffered) and announce it."""
        if self.next_rank is None:
            raise RuntimeError(f"rank {self.rank} is the last stage of pipeline {self.pipeline}")
        with self.events.span(Phase.TRANSFER, iteration=fragment.iteration, fragment=fragment.fragment):
            self._bound_in_flight(idle, keep=self.max_in_flight - 1)
            data_key = f"it{fragment.iteration}/frag{fragment.fragment}/stage{self.stage + 1}"
            send = start_send(
                fragment.batch, self.next_rank, plane=self.plane, key=data_key, tags=fragment.tags
            )
            self._announce({"kind": "fragment", "key": data_key})
        self._pending.append(send)
        return send

    def end_iteration(self, iteration: int) -> None:
        """Tell the next stage that ``iteration``'s stream through this pipeline is complete."""
        if self.next_rank is not None:
            self._announce({"kind": "end", "iteration": iteration})

    def _announce(self, message: dict) -> None:
        self.plane.publish(self._envelope_key(self.stage + 1, self._sent), json.dumps(message))
        self._sent += 1

    def receive(self, iteration: int, idle: Callable[[], bool] | None = None) -> InFlight | EndOfIteration:
        """The next message from the previous stage — a fragment of ``iteration`` to run, or the end of
        ``iteration`` — waited for in a ``wait_stage`` span; a message of another iteration is an error."""
        if self.prev_rank is None:
            raise RuntimeError(f"rank {self.rank} is the first stage of pipeline {self.pipeline}")
        with self.events.span(Phase.WAIT_STAGE, iteration=iteration):
            message = self._receive(idle)
        if message.iteration != iteration:
            raise RuntimeError(
                f"rank {self.rank}: TSP stage {self.stage} expected iteration {iteration}, the previous "
                f"stage sent {message} of iteration {message.iteration}"
            )
        return message

    def _receive(self, idle: Callable[[], bool] | None) -> InFlight | EndOfIteration:
        key = self._envelope_key(self.stage, self._received)
        raw = self.plane.wait_for(
            key,
            peer=self.prev_rank,
            what=f"the next fragment of TSP pipeline {self.pipeline} (from stage {self.stage - 1})",
            timeout_s=self.timeout_s,
            idle=idle,
        )
        self.plane.delete(key)
        self._received += 1
        message = json.loads(raw)
        if message["kind"] == "end":
            return EndOfIteration(int(message["iteration"]))
        batch, stats = recv_trajectories(
            self.prev_rank, plane=self.plane, key=message["key"], device=self.device, timeout_s=self.timeout_s
        )
        return InFlight(batch, stats.tags)

    def _bound_in_flight(self, idle: Callable[[], bool] | None, keep: int) -> None:
        self._pending = drain_sends(
            self._pending,
            self.plane,
            keep=keep,
            what=f"stage {self.stage + 1} of TSP pipeline {self.pipeline} to take a fragment",
            timeout_s=self.timeout_s,
            idle=idle,
        )

    def flush(self, idle: Callable[[], bool] | None = None) -> None:
        """Wait until the next stage has taken every hand-off (end of the run)."""
        self._bound_in_flight(idle, keep=0)
