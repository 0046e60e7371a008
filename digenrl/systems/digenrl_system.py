"""``digenrl``: disaggregated FlowGRPO with GAP, TSP, TAG and TCSS (docs/design.md §3), each switchable.

The generator pool is D pipelines × S stages (TSP, ``tsp.stages``; S = 1 is data parallelism). The logical
batch is cut into F-group fragments (GAP, ``gap.fragment_groups``). Stage 0 of a free pipeline claims the
next fragment of the stream; the fragment flows through the stages, each running its step range and
handing the partial trajectory on; the last stage decodes, scores, normalises the fragment's groups and
ships its (sample, timestep) units to *all* trainer ranks. Trainers accumulate each fragment's gradient
the moment it arrives and step once after the last::

    pipeline stage 0 │ claim f0 ─ steps 0..b │ claim f2 ─ steps 0..b │ claim f4 …           (fill: S − 1)
    pipeline stage 1 │                       │ f0 steps b..T, score ─▶ ship │ f2 … ─▶ ship │
    trainer          │ TAG: claim f7 (tail), generate, ship │ train f0 │ train f2 │ … │ step │ push θ_k+1 │
    (TCSS on)        generators start iteration k+1 with θ_k here ──▶ θ_k+1 applies at a fragment boundary

* GAP — :class:`~digenrl.gap.stream.FragmentStream`: claims (dynamic tickets on the c10d store), keys,
  unit shards, readiness. ``gap.enabled=false`` makes the trainer wait for every fragment before training
  (the separate-sync timeline, TSP still available).
* TSP — :class:`~digenrl.tsp.stage_worker.StageWorker` runs this rank's step range and hands fragments on.
* TAG — :class:`~digenrl.tag.helper.TagHelper`: a trainer rank whose next fragment is not ready claims one
  from the tail and generates it with its own model; :class:`~digenrl.tag.policy.TagPolicy` sets the
  per-iteration budget (``tag.policy=auto``: the simulator's prediction from this run's measured costs).
* TCSS — :class:`~digenrl.async_policy.tcss.StalenessBound`: with ``tcss.enabled`` fragments [0, s) of
  iteration k are generated with θ_{k−1} and [s, F) with θ_k (``tcss.switch``: s fixed by the plan, so the
  run is reproducible; a producer claiming fragment s or later waits for θ_k, TAG helpers claim only
  there; ``timing``: whatever arrived by the fragment boundary); weights arrive into staging and apply at
  fragment boundaries (:class:`~digenrl.runtime.policy_version.PolicyVersion`); every received fragment
  is checked for one version per trajectory, staleness ≤ 1 (0 with TCSS off) and the plan's version.

With TCSS off the update equals the synchronous one on the same data: every sample's noise is keyed by
its identity, so *who* generates a fragment (a pipeline or a helper) and *when* never changes its
trajectory, and the trainer weights every (sample, timestep) unit by 1/(units of the logical batch), so
fragments, stages and trainer sharding change only the order of the sum (``gap.train_order=index`` keeps
even that fixed).

Per-fragment advantages need complete groups and group statistics only (``algo.adv_std=group``): a global
std would need the whole batch before any fragment could train.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import torch

from digenrl.async_policy.tcss import StalenessBound, StalenessStats, resolve_switch
from digenrl.config import Config, ConfigError
from digenrl.data.trajectory import TrajectoryBatch
from digenrl.gap.fragments import FragmentPlan
from digenrl.gap.unit_packer import UnitPacker
from digenrl.runtime.fault_injection import inject_delay
from digenrl.runtime.memory import free_device_bytes
from digenrl.runtime.profiles import load_profile
from digenrl.systems.base import IterationReport
from digenrl.systems.components import RankComponents
from digenrl.systems.phases import (
    TrainStats,
    assign_advantages,
    global_sum,
    reward_summary,
    train_on,
    units_per_sample,
)
from digenrl.systems.separate import (
    SeparateSystem,
    check_trainer_pool_backend,
    generator_report,
    separate_layout,
)
from digenrl.tag.helper import TagHelper, gathered_weights_fit, tag_supported
from digenrl.tag.policy import TagDecision, TagPolicy
from digenrl.trainer.parallel import ParallelBackend, resolve_backend
from digenrl.tsp.pipeline import TspLayout, check_boundaries, plan_tsp
from digenrl.tsp.stage_worker import EndOfIteration, InFlight, StageWorker

log = logging.getLogger(__name__)

#: scored fragments a last stage may have in flight to the trainers before it waits for them
MAX_SHIPPING = 2


def _trainer_backend(cfg: Config, world_size: int) -> str:
    trainers = len(separate_layout(cfg, world_size).trainer_ranks)
    return resolve_backend(cfg.trainer.backend, world_size=trainers, mode=cfg.trainer.mode)


class DigenRL(SeparateSystem):
    name = "digenrl"
    knobs = (*SeparateSystem.knobs, "gap", "tsp", "tag", "tcss")
    sharding = "units"

    @classmethod
    def check(cls, cfg: Config, world_size: int) -> None:
        from digenrl.models.specs import get_model_spec

        check_trainer_pool_backend(cfg)
        layout = separate_layout(cfg, world_size)
        tsp = TspLayout(layout.generator_ranks, cfg.tsp.stages)
        num_steps = cfg.sampler.num_steps or get_model_spec(cfg.model.name).default_num_steps
        tsp.check_num_steps(num_steps)
        if cfg.tsp.boundaries is not None:
            check_boundaries(cfg.tsp.boundaries, tsp.stages, num_steps)
        plan = FragmentPlan(cfg.algo.prompts_per_iteration, cfg.gap.fragment_groups, tsp.num_pipelines)
        resolve_switch(cfg.tcss.switch, plan.num_fragments)  # tcss.* without tcss: validation.KNOB_RULES
        if cfg.gap.enabled and cfg.algo.adv_std != "group":
            raise ConfigError(
                "gap.enabled=true normalises advantages per fragment, which needs algo.adv_std=group "
                f"(got {cfg.algo.adv_std!r}); a global std needs the whole batch before any fragment trains"
            )
        samples = cfg.gap.fragment_groups * cfg.algo.group_size
        if samples < len(layout.trainer_ranks):
            raise ConfigError(
                f"a fragment of gap.fragment_groups={cfg.gap.fragment_groups} groups holds {samples} "
                f"samples, fewer than pools.trainers={len(layout.trainer_ranks)}: every trainer needs a "
                "unit of every fragment"
            )
        if cfg.tag.enabled and cfg.gap.assignment != "dynamic":
            raise ConfigError(
                f"tag.enabled=true needs gap.assignment=dynamic (got {cfg.gap.assignment!r}): TAG helpers "
                "claim fragments from the shared queue; set tag=false for a static assignment"
            )
        reason = tag_supported(_trainer_backend(cfg, world_size))
        if cfg.tag.enabled and cfg.tag.policy == "always" and reason is not None:
            raise ConfigError(f"tag.policy=always cannot run: {reason}; use tag.policy=auto or tag=false")

    # ------------------------------------------------------------------ set-up
    def trainer_generates(self) -> bool:
        cfg = self.cfg
        if not cfg.tag.enabled:
            return False
        reason = tag_supported(_trainer_backend(cfg, self.ctx.world_size))
        if reason is not None and self.ctx.rank == 0:
            log.warning("TAG off (tag.policy=auto): %s", reason)
        return reason is None

    def fragment_plan(self) -> FragmentPlan:
        cfg = self.cfg
        pipelines = len(self.layout.generator_ranks) // cfg.tsp.stages
        return FragmentPlan(
            cfg.algo.prompts_per_iteration, cfg.gap.fragment_groups, pipelines, assignment=cfg.gap.assignment
        )

    def setup(self) -> RankComponents:
        parts = super().setup()
        cfg, ctx = self.cfg, self.ctx
        profile = load_profile(cfg.profile)
        self.tsp_plan = plan_tsp(
            TspLayout(self.layout.generator_ranks, cfg.tsp.stages),
            parts.sampler.num_steps,
            profile=profile,
            boundaries=cfg.tsp.boundaries,
        )
        self.bound = StalenessBound.from_config(cfg, self.stream.num_fragments)
        self.shipping: list = []  # sends of scored fragments still in flight (this rank is their producer)
        self.helper: TagHelper | None = None
        self.tag_policy: TagPolicy | None = None
        if self.is_trainer and parts.engine is not None:
            self.helper = TagHelper(
                parts.engine,
                self.stream,
                self.stream.plan,
                parts.events,
                backend=parts.trainer.backend,
                park_grads=cfg.tag.park_grads,
                device=ctx.device,
            )
            self.check_tag_memory(parts.trainer.backend)
        if self.helper is not None:
            self.tag_policy = TagPolicy(
                cfg,
                profile,
                trainer_ranks=self.layout.trainer_ranks,
                generator_ranks=self.layout.generator_ranks,
                num_fragments=self.stream.num_fragments,
                fragment_samples=cfg.gap.fragment_groups * cfg.algo.group_size,
                trainer_type=profile.device_type(ctx.rank).name,
            )
        if self.is_generator:
            self.stage = StageWorker(
                parts.engine,
                self.tsp_plan,
                ctx.rank,
                self.plane,
                device=ctx.device,
                timeout_s=cfg.runtime.timeout_s,
            )
        if ctx.rank == 0:
            log.info("%s", self.stream.plan.describe(cfg.algo.group_size))
            log.info("%s", self.tsp_plan.describe())
        return parts

    def check_tag_memory(self, backend: ParallelBackend) -> None:
        """Sharded trainers gather the full weights to generate: every trainer rank must hold them, or
        ``tag.policy=always`` is rejected and ``auto`` turns TAG off (the same on every trainer rank)."""
        if not backend.joint_generation:
            return
        problem = gathered_weights_fit(backend.full_parameter_bytes(), free_device_bytes(self.ctx.device))
        short = global_sum(problem is not None, self.groups.trainer_group)
        if not short:
            return
        reason = problem or f"{short:g} trainer rank(s) cannot hold the gathered weights"
        if self.cfg.tag.policy == "always":
            raise ConfigError(f"tag.policy=always: {reason}; use tag.policy=auto or tag=false")
        if self.ctx.rank == self.trainer_ranks[0]:
            log.warning("TAG off (tag.policy=auto): %s", reason)
        self.helper = None

    def describe_mechanisms(self) -> str:
        """GAP, TSP, TAG and TCSS as this run uses them (rank 0, a trainer, prints it)."""
        cfg, plan, layout = self.cfg, self.stream.plan, self.tsp_plan.layout
        gap = "on" if cfg.gap.enabled else "off"
        tag = f"TAG {cfg.tag.policy}" if self.helper is not None else "TAG off"
        tcss = "TCSS off (on-policy)"
        if cfg.tcss.enabled and self.bound.planned:
            tcss = (
                f"TCSS on (tcss.switch={cfg.tcss.switch}: fragments [0, {self.bound.switch}) of "
                f"{plan.num_fragments} one version stale)"
            )
        elif cfg.tcss.enabled:
            tcss = "TCSS on (tcss.switch=timing: stale fragments depend on timing, not reproducible)"
        return (
            f"GAP {gap} ({plan.num_fragments} fragments of {plan.fragment_groups} group(s)), "
            f"TSP {layout.num_pipelines} pipeline(s) x {layout.stages} stage(s), {tag}, {tcss}"
        )

    def restore(self, payload: dict) -> int:
        """A resumed process starts on-policy: its generators hold only the checkpointed θ."""
        start = super().restore(payload)
        self.bound = dataclasses.replace(self.bound, start=start)
        return start

    def before_first_iteration(self) -> None:
        self.initial_sync()

    def head_only(self, iteration: int) -> int:
        """Fragments of ``iteration`` that only generator pipelines claim: with TCSS's planned switch the
        ones bound to θ_{k−1}, which a trainer rank (a TAG helper, at θ_k) no longer holds."""
        return self.bound.switch_at(iteration) if self.bound.planned else 0

    # ------------------------------------------------------------------ generator pool: one TSP stage
    def generate_iteration(self, iteration: int) -> IterationReport:
        """This rank's stage of its pipeline, for every fragment of ``iteration`` that comes its way."""
        events, stage = self.parts.events, self.stage
        rewards, samples, t0 = [], 0, time.perf_counter()
        while True:
            fragment = self.claim(iteration) if stage.is_first else self.take_hand_off(iteration)
            if isinstance(fragment, EndOfIteration):
                stage.end_iteration(iteration)
                break
            if self.version.latest < fragment.version:  # a later stage: the version may still be on its way
                self.wait_for_version(fragment.version, iteration)
            self.version.require(
                fragment.version,
                self.parts.bundle.flow_model,
                what=f"rank {self.ctx.rank}: fragment {fragment.fragment} of iteration {iteration}",
            )
            inject_delay(self.ctx.rank, "generate")  # robustness tests only: a deliberately slow generator
            start = time.perf_counter()
            with events.span(
                "generate",
                iteration=iteration,
                fragment=fragment.fragment,
                policy_version=fragment.version,
                samples=fragment.batch.batch_size,
                extra={"stage": stage.stage, "steps": [stage.steps.start, stage.steps.stop]},
            ):
                fragment = stage.run(fragment)
            fragment.tags["steps_s"] = fragment.tags.get("steps_s", 0.0) + time.perf_counter() - start
            if not stage.is_last:
                with events.span("transfer", iteration=iteration, fragment=fragment.fragment):
                    stage.hand_on(fragment, idle=self.service_weight_sync)
                continue
            score = self.finish_fragment(fragment)
            rewards.append(score)
            samples += fragment.batch.batch_size
        t1 = time.perf_counter()
        if not self.bound.lag:  # on-policy: the next iteration starts from θ_{k+1}
            self.wait_for_version(iteration + 1, iteration)
        local = torch.cat(rewards) if rewards else torch.zeros(0)
        return generator_report(local, samples, {"rollout": t1 - t0, "sync": time.perf_counter() - t1})

    def claim(self, iteration: int) -> InFlight | EndOfIteration:
        """Stage 0: claim the next fragment and bind it to the version the plan gives it (waiting for that
        version if it has not arrived; TCSS off: θ_k). ``tcss.switch=timing``: at the fragment boundary
        take the newest weights that arrived, at most one version behind ``iteration``, then claim."""
        self.service_weight_sync()
        if self.bound.planned:
            fragment = self.stream.claim(
                iteration, pipeline=self.stage.pipeline, head_only=self.head_only(iteration)
            )
            if fragment is None:
                return EndOfIteration(iteration)
            version = self.bound.version_of(iteration, fragment)
            self.wait_for_version(version, iteration)
            self.version.require(
                version,
                self.parts.bundle.flow_model,
                what=f"rank {self.ctx.rank}: fragment {fragment} of iteration {iteration}",
            )
        else:
            self.version.apply_staged(self.parts.bundle.flow_model)
            oldest = self.bound.oldest_version(iteration)
            if self.version.current < oldest:
                self.wait_for_version(oldest, iteration)
            fragment = self.stream.claim(iteration, pipeline=self.stage.pipeline)
            if fragment is None:
                return EndOfIteration(iteration)
            version = self.version.current
        prompts = self.parts.prompts.prompts_for(iteration, self.cfg.algo.prompts_per_iteration)
        ids = list(self.stream.plan.prompt_ids(fragment))
        batch = self.parts.engine.start(
            [prompts[i] for i in ids], ids, iteration=iteration, policy_version=version
        )
        return InFlight(batch, {"iteration": iteration, "fragment": fragment, "policy_version": version})

    def take_hand_off(self, iteration: int) -> InFlight | EndOfIteration:
        """Stages 1..S−1: the next message from the previous stage (joining weight syncs meanwhile)."""
        with self.parts.events.span("wait_stage", iteration=iteration):
            message = self.stage.receive(idle=self.service_weight_sync)
        if message.iteration != iteration:
            raise RuntimeError(
                f"rank {self.ctx.rank}: TSP stage {self.stage.stage} expected iteration {iteration}, the "
                f"previous stage sent {message} of iteration {message.iteration}"
            )
        return message

    def finish_fragment(self, fragment: InFlight) -> torch.Tensor:
        """Decode, score and normalise a generated fragment, then ship its units to every trainer (a
        pipeline's last stage and a TAG helper alike); returns the kept rewards."""
        events, batch = self.parts.events, fragment.batch
        tags = {**fragment.tags, "producer": self.ctx.rank}
        start = time.perf_counter()
        with events.span(self.score_phase, iteration=fragment.iteration, fragment=fragment.fragment):
            score = self.score(batch, fragment.iteration, fragment.fragment)
            batch = assign_advantages(batch, score, self.cfg.algo, local=True)
        tags["score_s"] = time.perf_counter() - start
        with events.span("transfer", iteration=fragment.iteration, fragment=fragment.fragment):
            pending, _ = self.stream.ship(batch, fragment.iteration, fragment.fragment, tags=tags)
            self.shipping = self.drain(
                self.shipping + pending,
                keep=MAX_SHIPPING * len(self.trainer_ranks),
                what=f"the trainers to take fragment {fragment.fragment}",
            )
        return score.rewards[score.keep]

    def after_run(self) -> None:
        super().after_run()
        if self.is_generator:
            self.stage.flush(idle=self.service_weight_sync)
        self.shipping = self.drain(self.shipping, what="the trainers to take the last fragments")

    # ------------------------------------------------------------------ trainer pool
    def train_iteration(self, iteration: int) -> IterationReport:
        cfg, events, group = self.cfg, self.parts.events, self.groups.trainer_group
        version = self.version.current
        decision = self.tag_decision(iteration)
        per_sample = units_per_sample(cfg, self.parts.sampler)
        total_units = cfg.algo.prompts_per_iteration * cfg.algo.group_size * per_sample
        prompts = self.parts.prompts.prompts_for(iteration, cfg.algo.prompts_per_iteration)
        stats, staleness, received = TrainStats(), StalenessStats(), []
        pending = list(range(self.stream.num_fragments))
        helped, train_s, t0 = 0, 0.0, time.perf_counter()

        def train(units: TrajectoryBatch) -> None:
            nonlocal train_s
            inject_delay(self.ctx.rank, "train")  # robustness tests only: a deliberately slow trainer
            start = time.perf_counter()
            with events.span("train", iteration=iteration, policy_version=version, samples=units.batch_size):
                train_on(self.parts.trainer, units, total_units, stats)
            train_s += time.perf_counter() - start

        # micro-batches span fragments (not under lockstep backends, whose accumulate is a collective)
        packer = UnitPacker(
            train, cfg.trainer.micro_batch_size, enabled=not self.parts.trainer.backend.lockstep
        )
        switches = (self.helper.switches, self.helper.switch_s) if self.helper is not None else (0, 0.0)
        if self.helper is not None and self.helper.joint and decision.budget != 0:
            # sharded weights: all trainer ranks gather them together, here at the head (the bubble)
            helped = self.helper.head_round(
                iteration,
                version,
                prompts,
                decision.budget,
                next_ready=lambda: self.stream.ready(iteration, pending[0]),
                finish=self.finish_helper_fragment,
                head_only=self.head_only(iteration),
            )
        while pending:
            f = self.next_to_train(iteration, pending)
            if not self.stream.ready(iteration, f) and self.may_help(decision, helped):
                # nothing to train yet: a ready training unit would have won
                made = self.helper.try_help(iteration, version, prompts, head_only=self.head_only(iteration))
                if made is not None:
                    self.finish_helper_fragment(made)
                    helped += 1
                    continue
            if self.helper is not None:
                self.helper.leave(iteration, version)
            with events.span("wait_fragment", iteration=iteration, fragment=f, policy_version=version):
                shard, transfer = self.stream.receive(iteration, f)
            stale = self.bound.check_fragment(shard, trainer_version=version, fragment=f, rank=self.ctx.rank)
            staleness.add(shard.batch_size, stale)
            self.observe_fragment(transfer, shard)
            pending.remove(f)
            received.append((f, shard))
            if cfg.gap.enabled:  # GAP: this fragment's gradient now, while generators make the next
                packer.add(shard)
        if self.helper is not None:
            self.helper.leave(iteration, version)
        if not cfg.gap.enabled:
            for _, shard in received:
                packer.add(shard)
        packer.flush()
        step_stats = self.optimizer_step(iteration, version)
        trained_s = train_s
        for _ in range(cfg.algo.num_updates_per_batch - 1):  # flow_grpo's inner epochs over the batch
            for _, shard in received:
                packer.add(shard)
            packer.flush()
            step_stats = self.optimizer_step(iteration, version)
        t1 = time.perf_counter()
        self.shipping = self.drain(
            self.shipping, what=f"the other trainers to take helper fragments of {iteration}"
        )
        with events.span("sync", iteration=iteration, policy_version=version + 1):
            sync = self.push_weights(self.version.advance())
        if self.tag_policy is not None:
            self.tag_policy.observed.sync_bytes = sync.bytes
            self.tag_policy.observed.train_s += trained_s
            self.tag_policy.observed.train_units += sum(s.batch_size for _, s in received)
        batch = TrajectoryBatch.cat([shard for _, shard in received])
        # Every sample contributes the same number of units, so unit-weighted reward moments are the
        # sample moments.
        reward_mean, reward_std = reward_summary(batch.rewards, group)
        units = global_sum(batch.num_units, group)
        return IterationReport(
            samples=round(units / per_sample),
            reward_mean=reward_mean,
            reward_std=reward_std,
            train=stats.reduce(group),
            step={
                **step_stats,
                "sync_bytes": float(sync.bytes),
                "sync_s": sync.seconds,
                "staleness": staleness.staleness_max,
                **staleness.metrics(),
                **self.tag_metrics(decision, helped, switches, group),
            },
            phase_s={"fragments_and_train": t1 - t0, "sync": time.perf_counter() - t1},
        )

    def next_to_train(self, iteration: int, pending: list[int]) -> int:
        """``gap.train_order``: the lowest pending fragment (index), or the lowest one ready (arrival)."""
        if self.cfg.gap.train_order == "arrival":
            for f in pending:
                if self.stream.ready(iteration, f):
                    return f
        return pending[0]

    def may_help(self, decision: TagDecision | None, helped: int) -> bool:
        """A helper on replicated weights helps whenever idle, within the iteration's budget (a joint
        helper only at the head, :meth:`TagHelper.head_round`)."""
        if self.helper is None or decision is None or self.helper.joint:
            return False
        return decision.budget is None or helped < decision.budget

    def finish_helper_fragment(self, fragment: InFlight) -> None:
        self.finish_fragment(fragment)
        self.tag_policy.observed.helper_steps_s.append(fragment.tags["steps_s"])

    def optimizer_step(self, iteration: int, version: int) -> dict[str, float]:
        start = time.perf_counter()
        with self.parts.events.span("optimizer", iteration=iteration, policy_version=version):
            step_stats = self.parts.trainer.step(iteration)
        if self.tag_policy is not None:
            self.tag_policy.observed.optimizer_s.append(time.perf_counter() - start)
        return step_stats

    # ------------------------------------------------------------------ TAG bookkeeping
    def tag_decision(self, iteration: int) -> TagDecision | None:
        """Rank 0 decides the iteration's helper budget and publishes it; every trainer follows it."""
        if self.tag_policy is None:
            return None
        key = f"tag/budget/it{iteration}"
        if self.ctx.rank == self.trainer_ranks[0]:
            decision = self.tag_policy.decide(iteration)
            self.plane.publish(key, "none" if decision.budget is None else str(decision.budget))
            self.parts.events.note(decision.reason, kind="tag", iteration=iteration, budget=decision.budget)
            return decision
        raw = self.plane.wait_for(
            key, peer=self.trainer_ranks[0], what="the TAG budget of the iteration"
        ).decode()
        return TagDecision(None if raw == "none" else int(raw))

    def observe_fragment(self, transfer, shard: TrajectoryBatch) -> None:
        if self.tag_policy is None:
            return
        profile = self.tag_policy.profile
        self.tag_policy.observed.fragment(transfer.tags, lambda rank: profile.device_type(rank).name)
        if transfer.bytes and shard.batch_size:
            self.tag_policy.observed.unit_bytes.append(transfer.bytes / shard.batch_size)

    def tag_metrics(
        self, decision: TagDecision | None, helped: int, before: tuple[int, float], group
    ) -> dict[str, float]:
        """This iteration's helper work: fragments (summed over the pool), switches and their seconds
        (this rank), the budget and what the simulator predicted for it."""
        if self.helper is None:
            return {}
        switches = self.helper.switches - before[0]
        switch_s = self.helper.switch_s - before[1]
        if switches:
            self.tag_policy.observed.switch_s.append(switch_s / switches)
        out = {
            "tag_fragments": global_sum(helped, group),
            "tag_switches": float(switches),
            "tag_switch_s": switch_s,
        }
        if decision is not None and decision.budget is not None:
            out["tag_budget"] = float(decision.budget)
        if decision is not None and decision.predicted_s is not None:
            out["tag_predicted_s"] = decision.predicted_s
            out["tag_predicted_off_s"] = decision.predicted_off_s
        return out
