"""How many fragments a trainer rank may generate per iteration: TAG's bubble-triggered search
(docs/design.md §3 "TAG": insert helper work only where the cost model predicts a shorter makespan).

``tag.policy=always`` helps whenever a trainer is idle and a fragment is left (up to ``tag.max_fragments``
per iteration, 0 = no limit). ``tag.policy=auto`` decides before every iteration from what this run has
measured so far:

1. the trainer collects per-operation costs from the spans its event log records anyway
   (:meth:`TagPolicy.observe`, subscribed to the rank's :class:`~digenrl.runtime.observe.events.EventLogger`;
   :class:`TagObservations`): the producers' stepping and scoring seconds per fragment (a received
   fragment's ``wait_fragment`` span names its producer and carries the costs the producer measured), its
   own training seconds per unit (``train``), optimizer step (``optimizer``), helper switch
   (``tag_switch``) and, once it has helped, its own generation seconds (``generate`` as a helper); bytes
   per unit from the received fragments and per weight sync from the trainer's ``sync`` span;
2. these become a :class:`~digenrl.costs.cost_model.CostModel` on the trainer's device type (a producer's time
   on another type is scaled by the hardware profile's ``relative_speed``, as TSP's stage balancing does);
3. a :class:`TagPredictor` the system hands over — the discrete-event simulator's
   (:class:`digenrl.sim.predict.SimPredictor`, the same model the planner and the throughput tables use,
   with their budget search; ``tag/`` never imports the simulator) — predicts the steady iteration time
   of this run's plan with budgets 0, 1, 2, … per trainer, stopping after two in a row that do not
   improve; the smallest budget with the shortest prediction wins (0 = no TAG).

Iteration 0 has nothing measured yet, so ``auto`` does not help in it. The prediction for the chosen
budget and for budget 0 go into ``metrics.jsonl`` next to the measured ``wall_s``
(``tag_predicted_s``, ``tag_predicted_off_s``), so every decision can be checked against what happened.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from digenrl.config import Config
from digenrl.costs.cost_model import CFG_KEYS, CostModel
from digenrl.plan import RunPlan
from digenrl.rules import TagPrediction
from digenrl.runtime.hardware.profiles import HardwareProfile
from digenrl.runtime.observe.span_phases import Phase

log = logging.getLogger(__name__)


@dataclass
class TagObservations:
    """Costs this trainer rank measured (seconds on the device that ran them; see the module docstring)."""

    producer_steps_s: list[tuple[str, float]] = field(default_factory=list)  # (device type, s/fragment)
    score_s: list[tuple[str, float]] = field(default_factory=list)
    helper_steps_s: list[float] = field(default_factory=list)  # this rank generating a whole fragment
    train_s: float = 0.0
    train_units: int = 0
    optimizer_s: list[float] = field(default_factory=list)
    switch_s: list[float] = field(default_factory=list)
    unit_bytes: list[float] = field(default_factory=list)
    sync_bytes: int = 0

    def record(self, span: dict, device_type_of: Callable[[int], str]) -> None:
        """Take what one span record of this rank measured (see the module docstring; others are ignored)."""
        phase, extra = span["phase"], span.get("extra") or {}
        if "error" in extra:  # interrupted: not a measurement
            return
        seconds = span["t_end"] - span["t_start"]
        if phase == Phase.TRAIN:
            self.train_s += seconds
            self.train_units += int(span.get("samples") or 0)
        elif phase == Phase.OPTIMIZER:
            self.optimizer_s.append(seconds)
        elif phase == Phase.TAG_SWITCH:
            self.switch_s.append(seconds)
        elif phase == Phase.GENERATE and extra.get("helper"):
            self.helper_steps_s.append(seconds)
        elif phase == Phase.SYNC and "bytes" in extra:
            self.sync_bytes = int(extra["bytes"])
        elif phase == Phase.WAIT_FRAGMENT:
            if extra.get("bytes") and span.get("samples"):
                self.unit_bytes.append(extra["bytes"] / span["samples"])
            producer = int(extra.get("producer", -1))
            if producer >= 0 and "steps_s" in extra:
                self.producer_steps_s.append((device_type_of(producer), float(extra["steps_s"])))
            if producer >= 0 and "score_s" in extra:
                self.score_s.append((device_type_of(producer), float(extra["score_s"])))

    @property
    def ready(self) -> bool:
        return bool(self.producer_steps_s and self.score_s and self.train_units and self.optimizer_s)


class TagPredictor(Protocol):
    """What ``tag.policy=auto`` asks of a model of the run's schedule (:class:`digenrl.sim.predict.
    SimPredictor` is the one the systems hand over): the workload's guidance and step count, and the
    predicted steady iteration by helper budget."""

    @property
    def cfg_pass(self) -> bool: ...

    @property
    def num_steps(self) -> int: ...

    def iteration_s(self, costs: CostModel, budget: int) -> float: ...

    def best_budget(self, costs: CostModel, num_fragments: int) -> TagPrediction: ...


@dataclass(frozen=True)
class TagDecision:
    """The budget for one iteration and what the simulator predicted for it."""

    budget: int | None  # fragments per trainer this iteration; None = no limit (policy always)
    predicted_s: float | None = None  # predicted steady iteration seconds with ``budget``
    predicted_off_s: float | None = None  # … and without helper work
    reason: str = ""


class TagPolicy:
    """Chooses the per-iteration helper budget of every trainer rank (rank 0 decides for the pool)."""

    def __init__(
        self,
        cfg: Config,
        plan: RunPlan,
        profile: HardwareProfile,
        *,
        trainer_ranks: tuple[int, ...],
        generator_ranks: tuple[int, ...],
        num_fragments: int,
        fragment_samples: int,
        trainer_type: str,
        predictor: TagPredictor | None = None,
    ) -> None:
        """``plan``: the run's (``tag.policy`` / ``tag.max_fragments``, ``tsp.stages``); ``cfg``: the model
        and the trainer's micro-batch; ``predictor``: what ``tag.policy=auto`` decides by (None: ``auto``
        never helps, and says so)."""
        self.cfg = cfg
        self.plan = plan
        self.predictor = predictor
        self.profile = profile
        self.trainers = len(trainer_ranks)
        self.generators = len(generator_ranks)
        self.generator_ranks = frozenset(generator_ranks)
        # seconds per fragment of a generator pipeline (one stage's share of the steps + the scoring) and
        # of this rank helping, as received / measured: the generators' share (digenrl.gap.helper_share)
        self.generator_fragment_s: list[float] = []
        self.num_fragments = num_fragments
        self.fragment_samples = fragment_samples
        self.trainer_type = trainer_type
        self.observed = TagObservations()

    def observe(self, span: dict) -> None:
        """One span record of this rank's event log (:meth:`EventLogger.subscribe`)."""
        self.observed.record(span, lambda rank: self.profile.device_type(rank).name)
        extra = span.get("extra") or {}
        from_generator = int(extra.get("producer", -1)) in self.generator_ranks
        if (
            span["phase"] == Phase.WAIT_FRAGMENT
            and "error" not in extra
            and "steps_s" in extra
            and from_generator
        ):
            period = float(extra["steps_s"]) / self.plan.tsp_stages + float(extra.get("score_s", 0.0))
            self.generator_fragment_s.append(period)

    def fragment_seconds(self) -> tuple[float | None, float | None]:
        """(a generator pipeline's seconds per fragment, this rank's seconds to help with one) from what
        was measured so far; None where nothing is (:func:`digenrl.gap.helper_share.helper_may_claim`)."""
        o = self.observed
        if not self.generator_fragment_s or not (o.helper_steps_s or o.producer_steps_s):
            return None, None
        steps = (
            statistics.median(o.helper_steps_s) if o.helper_steps_s else self._on_trainer(o.producer_steps_s)
        )
        score = self._on_trainer(o.score_s) if o.score_s else 0.0
        switch = statistics.median(o.switch_s) if o.switch_s else 0.0
        return statistics.median(self.generator_fragment_s), steps + score + switch

    def decide(self, iteration: int) -> TagDecision:
        """The budget for ``iteration`` (see the module docstring)."""
        if self.plan.tag_policy == "always":
            return TagDecision(self.plan.tag_max_fragments or None, reason="tag.policy=always")
        if self.predictor is None:
            return TagDecision(0, reason="tag.policy=auto: no predictor was given (no helper work)")
        if not self.observed.ready:
            return TagDecision(0, reason="tag.policy=auto: measuring costs first (no helper work)")
        try:
            costs = self.cost_model()
        except ValueError as error:  # an observation the cost model rejects: say so, do not help
            return TagDecision(0, reason=f"tag.policy=auto: no usable cost model ({error})")
        prediction = self.predictor.best_budget(costs, self.num_fragments)
        predictions = prediction.iteration_s
        return TagDecision(
            prediction.budget,
            predictions[prediction.budget],
            predictions[0],
            reason=(
                "tag.policy=auto: predicted s/iteration by helper budget "
                + ", ".join(f"{b}: {s:.4g}" for b, s in predictions.items())
            ),
        )

    # ------------------------------------------------------------------ prediction
    def _on_trainer(self, samples: list[tuple[str, float]]) -> float:
        """Median seconds of a producer operation, converted to the trainer's device type."""
        target = self.profile.gpu_types[self.trainer_type].relative_speed
        return statistics.median(
            t * self.profile.gpu_types[kind].relative_speed / target for kind, t in samples
        )

    def cost_model(self) -> CostModel:
        """The measured costs as a cost model on the trainer's device type."""
        o, cfg = self.observed, self.cfg
        if self.predictor is None:
            raise ValueError("TagPolicy.cost_model needs a predictor (the workload's guidance and steps)")
        flag = CFG_KEYS[self.predictor.cfg_pass]
        num_steps = self.predictor.num_steps
        steps_s = (
            statistics.median(o.helper_steps_s) if o.helper_steps_s else self._on_trainer(o.producer_steps_s)
        )
        unit_s = o.train_s / o.train_units
        mb = cfg.trainer.micro_batch_size
        samples = self.fragment_samples
        return CostModel(
            device=self.trainer_type,
            model=cfg.model.name,
            generator_step_points={flag: {samples: steps_s / num_steps}},
            vae_decode_points={samples: self._on_trainer(o.score_s)},
            reward_points={samples: 0.0},
            train_points={flag: {mb: unit_s * mb}},
            optimizer_step_s=statistics.median(o.optimizer_s),
            weight_sync_bytes=int(o.sync_bytes),
            grad_bytes=int(o.sync_bytes),
            fragment_bytes_per_sample=0,
            unit_bytes=int(statistics.median(o.unit_bytes)) if o.unit_bytes else 0,
            cond_bytes_per_sample=0,
            latent_bytes_per_sample=0,
            param_bytes=0,
            optimizer_bytes=0,
            # the measured switch, whatever it moved (with tag.park_grads the parking is in it, so the plan
            # prices no bytes on top: digenrl.sim.predict.SimPredictor.plan_with leaves park_grads False)
            switch_sync_s=statistics.median(o.switch_s) if o.switch_s else 0.0,
            source="measured",
            command="measured online by digenrl.tag.policy during the run",
        )

    def predict(self, costs: CostModel, budget: int) -> float:
        """Predicted steady iteration seconds with ``budget`` helper fragments per trainer."""
        if self.predictor is None:
            raise ValueError("TagPolicy.predict needs a predictor")
        return self.predictor.iteration_s(costs, budget)
