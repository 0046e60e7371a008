"""TAG on a trainer rank, as one component (docs/design.md §3 "TAG"): the helper that generates
(:class:`~digenrl.tag.helper.TagHelper`), the policy that sets its budget (:class:`~digenrl.tag.policy.
TagPolicy`), the budget's publication to the trainer pool, the cost observations and the metrics.

The trainer loop calls it in timeline order; nothing of it calls back into the system::

    tag.begin(k, θ_k)   head of iteration k: the pool's first trainer decides the budget and publishes it
                        on the control plane, the others wait for it; sharded weights (FSDP2) are gathered
                        here, by all trainer ranks together (the bubble before the first fragment)
    tag.help()          the next fragment is not ready: claim one from the tail and generate it — the
                        system scores and ships it like a last stage; None: budget spent, nothing left,
                        (sharded) the head is over, or the generators' share (:mod:`digenrl.gap.
                        helper_share`: not before every generator holds θ_k — ``waiting`` says so, and
                        the trainer asks again — and only fragments they cannot finish sooner)
    tag.leave()         switch back before receiving or training anything
    tag.metrics()       the iteration's helper work, for ``metrics.jsonl``

Observations need no call at all: the policy reads this rank's costs from the span records its event log
writes anyway (:meth:`~digenrl.runtime.observe.events.EventLogger.subscribe`, :meth:`TagPolicy.observe`).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from digenrl.async_policy.tcss import StalenessBound
from digenrl.config import Config, ConfigError
from digenrl.data.prompts import PromptSource
from digenrl.gap.helper_share import helper_may_claim
from digenrl.gap.stream import FragmentStream
from digenrl.plan import RunPlan
from digenrl.rollout.engine import RolloutEngine
from digenrl.runtime.comm.control_plane import ControlPlane
from digenrl.runtime.comm.distributed import global_sum
from digenrl.runtime.hardware.memory import free_device_bytes
from digenrl.runtime.hardware.profiles import HardwareProfile
from digenrl.runtime.observe.events import EventLogger
from digenrl.tag.helper import TagHelper, gathered_weights_fit, tag_supported
from digenrl.tag.policy import TagDecision, TagPolicy, TagPredictor
from digenrl.trainer.parallel import ParallelBackend
from digenrl.tsp.stage_worker import InFlight

log = logging.getLogger(__name__)


def check_tag_config(plan: RunPlan, trainer_backend: str) -> None:
    """Start-up checks of the plan's TAG (``tag.*``, before any model exists)."""
    if plan.tag and plan.fragment_assignment != "dynamic":
        raise ConfigError(
            f"tag.enabled=true needs gap.assignment=dynamic (got {plan.fragment_assignment!r}): TAG helpers "
            "claim fragments from the shared queue; set tag=false for a static assignment"
        )
    reason = tag_supported(trainer_backend)
    if plan.tag and plan.tag_policy == "always" and reason is not None:
        raise ConfigError(f"tag.policy=always cannot run: {reason}; use tag.policy=auto or tag=false")


def tag_wanted(plan: RunPlan, trainer_backend: str, *, announce: bool) -> bool:
    """Whether trainer ranks generate (and so build a rollout engine); ``announce``: log why not."""
    if not plan.tag:
        return False
    reason = tag_supported(trainer_backend)
    if reason is not None and announce:
        log.warning("TAG off (tag.policy=auto): %s", reason)
    return reason is None


def gathered_weights_fit_pool(
    policy: str,
    backend: ParallelBackend,
    device: torch.device,
    group: dist.ProcessGroup | None,
    announce: bool,
) -> bool:
    """Sharded trainers gather the full weights to generate: every trainer rank must hold them, or
    ``tag.policy=always`` is rejected and ``auto`` turns TAG off (the same on every trainer rank: a
    collective over the trainer ``group``). ``policy``: the plan's ``tag.policy``; ``announce``: log it
    (one rank)."""
    if not backend.joint_generation:
        return True
    problem = gathered_weights_fit(backend.full_parameter_bytes(), free_device_bytes(device))
    short = global_sum(problem is not None, group)
    if not short:
        return True
    reason = problem or f"{short:g} trainer rank(s) cannot hold the gathered weights"
    if policy == "always":
        raise ConfigError(f"tag.policy=always: {reason}; use tag.policy=auto or tag=false")
    if announce:
        log.warning("TAG off (tag.policy=auto): %s", reason)
    return False


@dataclass
class Tag:
    """A trainer rank's TAG (see the module docstring). ``Tag()`` is TAG off: it never helps."""

    helper: TagHelper | None = None
    policy: TagPolicy | None = None
    plane: ControlPlane | None = None
    events: EventLogger | None = None
    trainer_ranks: tuple[int, ...] = ()
    group: dist.ProcessGroup | None = None
    bound: StalenessBound | None = None
    prompts: PromptSource | None = None
    prompts_per_iteration: int = 0
    generators: int = 0  # generator ranks (all must hold θ_k before a helper claims)
    pipelines: int = 1  # D: fragments the generator pool works on at once
    stages: int = 1  # S: stages per pipeline (a pipeline holds up to S fragments in flight)
    stream: FragmentStream | None = None
    # the iteration under way (set by begin)
    iteration: int = field(default=-1, init=False)
    version: int = field(default=-1, init=False)
    decision: TagDecision | None = field(default=None, init=False)
    helped: int = field(default=0, init=False)  # fragments this rank generated in it
    waiting: bool = field(default=False, init=False)  # help refused only until the generators hold θ_k
    head_only: int = field(default=0, init=False)
    iteration_prompts: list[str] = field(default_factory=list, init=False)
    switches_before: tuple[int, float] = field(default=(0, 0.0), init=False)

    @classmethod
    def build(
        cls,
        cfg: Config,
        plan: RunPlan,
        *,
        engine: RolloutEngine,
        backend: ParallelBackend,
        stream: FragmentStream,
        events: EventLogger,
        profile: HardwareProfile,
        generator_ranks: tuple[int, ...],
        group: dist.ProcessGroup | None,
        bound: StalenessBound,
        prompts: PromptSource,
        predictor: TagPredictor | None = None,
    ) -> Tag:
        """A trainer rank's TAG of the run's ``plan`` (``tag.*``, its pools and stages; every trainer rank
        calls it: the memory check is a collective); ``cfg``: the algorithm and the model;
        ``predictor``: what ``tag.policy=auto`` decides by (:class:`~digenrl.tag.policy.TagPolicy`)."""
        trainer_ranks, rank, device = stream.trainer_ranks, stream.plane.rank, backend.device
        announce = rank == trainer_ranks[0]
        if not gathered_weights_fit_pool(plan.tag_policy, backend, device, group, announce=announce):
            return cls()
        helper = TagHelper(
            engine, stream, stream.plan, events, backend=backend, park_grads=plan.park_grads, device=device
        )
        policy = TagPolicy(
            cfg,
            plan,
            profile,
            trainer_ranks=trainer_ranks,
            generator_ranks=generator_ranks,
            num_fragments=stream.num_fragments,
            fragment_samples=stream.plan.fragment_samples(cfg.algo.group_size),
            trainer_type=profile.device_type(rank).name,
            predictor=predictor,
        )
        events.subscribe(policy.observe)
        return cls(
            helper=helper,
            policy=policy,
            plane=stream.plane,
            events=events,
            trainer_ranks=trainer_ranks,
            group=group,
            bound=bound,
            prompts=prompts,
            prompts_per_iteration=cfg.algo.prompts_per_iteration,
            generators=len(generator_ranks),
            pipelines=max(1, len(generator_ranks) // plan.tsp_stages),
            stages=plan.tsp_stages,
            stream=stream,
        )

    @property
    def on(self) -> bool:
        return self.helper is not None

    def describe(self) -> str:
        """The start banner's word on TAG."""
        return f"TAG {self.policy.plan.tag_policy}" if self.on else "TAG off"

    # ------------------------------------------------------------------ the iteration, in timeline order
    def begin(self, iteration: int, version: int) -> None:
        """Head of ``iteration`` (trainer weights θ_``version``): the budget, and with sharded weights the
        joint gather (module docstring)."""
        if not self.on:
            return
        self.iteration, self.version, self.helped = iteration, version, 0
        self.decision = self.publish_budget(iteration)
        self.switches_before = (self.helper.switches, self.helper.switch_s)
        self.head_only = self.bound.head_only(iteration)
        self.iteration_prompts = self.prompts.prompts_for(iteration, self.prompts_per_iteration)
        if self.helper.joint and self.decision.budget != 0:
            self.helper.enter(iteration, version)  # collective: every trainer rank gathers, here

    def help(self, pending: Collection[int] = ()) -> InFlight | None:
        """Generate one fragment from the tail, within the budget; None when this rank may not (or nothing
        is left). Ask only when the next fragment to train is not ready: a ready training unit wins.
        ``pending``: the fragments this rank has not received yet (those the pipelines claimed among them
        are in flight on the generators: :func:`~digenrl.gap.helper_share.helper_may_claim`)."""
        self.waiting = False
        if not self.on or (self.decision.budget is not None and self.helped >= self.decision.budget):
            return None
        if self.helper.joint and not self.helper.generating:
            return None  # sharded weights: only while gathered, at the head of the iteration
        remaining = self.stream.unclaimed(self.iteration, self.head_only)
        if not self.stream.generators_hold(self.version, self.generators):
            self.waiting = remaining > 0  # ask again once they do
            return None
        claimed = self.stream.generator_claims(self.iteration, self.head_only)
        in_flight = min(sum(f in pending for f in claimed), self.pipelines * self.stages)
        generator_s, helper_s = self.policy.fragment_seconds()
        if not helper_may_claim(remaining, self.pipelines, generator_s, helper_s, in_flight):
            return None  # the generators reach every fragment left before this rank would finish it
        made = self.helper.try_help(
            self.iteration, self.version, self.iteration_prompts, head_only=self.head_only
        )
        self.helped += made is not None
        return made

    def leave(self) -> None:
        """Back to training (releases gathered weights, restores parked gradients)."""
        if self.on:
            self.helper.leave(self.iteration, self.version)

    def metrics(self) -> dict[str, float]:
        """This iteration's helper work: fragments (summed over the trainer pool: a collective), switches
        and their seconds (this rank), the budget and what the simulator predicted for it."""
        if not self.on:
            return {}
        out = {
            "tag_fragments": global_sum(self.helped, self.group),
            "tag_switches": float(self.helper.switches - self.switches_before[0]),
            "tag_switch_s": self.helper.switch_s - self.switches_before[1],
        }
        if self.decision.budget is not None:
            out["tag_budget"] = float(self.decision.budget)
        if self.decision.predicted_s is not None:
            out["tag_predicted_s"] = self.decision.predicted_s
            out["tag_predicted_off_s"] = self.decision.predicted_off_s
        return out

    # ------------------------------------------------------------------ the budget on the control plane
    def publish_budget(self, iteration: int) -> TagDecision:
        """The pool's first trainer decides the iteration's budget and publishes it; every trainer
        follows it (waiting for it on the control plane, bounded by its timeout)."""
        key = f"tag/budget/it{iteration}"
        if self.plane.rank == self.trainer_ranks[0]:
            decision = self.policy.decide(iteration)
            self.plane.publish(key, "none" if decision.budget is None else str(decision.budget))
            self.events.note(decision.reason, kind="tag", iteration=iteration, budget=decision.budget)
            return decision
        raw = self.plane.wait_for(key, peer=self.trainer_ranks[0], what="the TAG budget of the iteration")
        return TagDecision(None if raw.decode() == "none" else int(raw.decode()))
