"""``digenrl``: disaggregated FlowGRPO with GAP, TSP, TAG and TCSS (docs/design.md §3), each switchable.

The generator pool is D pipelines × S stages (TSP, ``tsp.stages``; S = 1 is data parallelism). The logical
batch is cut into fragments of F groups or S samples (GAP, ``gap.fragment_groups``,
``gap.fragment_samples``). Stage 0 of a free pipeline claims the next fragment of the stream; the
fragment flows through the stages, each running its step range and handing the partial trajectory on;
the last stage decodes, scores, normalises the fragment's groups and ships its (sample, timestep) units
to the trainer ranks (a rank with no unit of a small fragment gets an empty shard and skips it; every
unit keeps its global weight, so the update is unchanged). A fragment smaller than a group ships its
rewards instead of advantages; trainers normalise a group once all its rewards are in
(:class:`~digenrl.algo.group_completion.GroupCompletion`). Trainers accumulate each fragment's gradient
the moment it arrives and step once after the last::

    pipeline stage 0 │ claim f0 ─ steps 0..b │ claim f2 ─ steps 0..b │ claim f4 …           (fill: S − 1)
    pipeline stage 1 │                       │ f0 steps b..T, score ─▶ ship │ f2 … ─▶ ship │
    trainer          │ TAG: claim f7 (tail), generate, ship │ train f0 │ train f2 │ … │ step │ push θ_k+1 │
    (TCSS on)        generators start iteration k+1 with θ_k here ──▶ θ_k+1 applies at a fragment boundary

* GAP — :class:`~digenrl.gap.stream.FragmentStream`: claims (dynamic tickets on the c10d store), keys,
  unit shards, readiness; :class:`~digenrl.gap.consumer.FragmentConsumer`: the trainer's side (training
  order, micro-batches across fragments, the staleness check). ``gap.enabled=false`` makes the trainer
  wait for every fragment before training (the separate-sync timeline, TSP still available).
* TSP — :class:`~digenrl.tsp.stage_worker.StageWorker` runs this rank's step range and hands fragments on.
* TAG — :class:`~digenrl.tag.component.Tag`: a trainer rank whose next fragment is not ready claims one
  from the tail and generates it with its own model (:class:`~digenrl.tag.helper.TagHelper`);
  :class:`~digenrl.tag.policy.TagPolicy` sets the per-iteration budget (``tag.policy=auto``: the
  simulator's prediction from this run's measured costs).
* TCSS — :class:`~digenrl.async_policy.tcss.StalenessBound`: with ``tcss.enabled`` fragments [0, s) of
  iteration k are generated with θ_{k−1} and [s, F) with θ_k (``tcss.switch``: s fixed by the plan, so the
  run is reproducible; a producer claiming fragment s or later waits for θ_k, TAG helpers claim only
  there; ``timing``: whatever arrived by the fragment boundary); weights arrive into staging and apply at
  fragment boundaries (:class:`~digenrl.runtime.comm.policy_version.PolicyVersion`); every received fragment
  is checked for one version per trajectory, staleness ≤ 1 (0 with TCSS off) and the plan's version.

With TCSS off the update equals the synchronous one on the same data: every sample's noise is keyed by
its identity, so *who* generates a fragment (a pipeline or a helper) and *when* never changes its
trajectory, and the trainer weights every (sample, timestep) unit by 1/(units of the logical batch), so
fragments, stages and trainer sharding change only the order of the sum (``gap.train_order=index`` keeps
even that fixed).

Per-fragment advantages need group statistics only (``algo.adv_std=group``): a global std would need the
whole batch before any fragment could train.
"""

from __future__ import annotations

import logging
import time

from digenrl.config import Config
from digenrl.data.trajectory import TrajectoryBatch
from digenrl.gap.consumer import FragmentConsumer, check_gap_config
from digenrl.gap.fragments import FragmentPlan
from digenrl.plan import RunPlan
from digenrl.rules import resolve_switch
from digenrl.systems.base import IterationReport
from digenrl.systems.components import RankComponents
from digenrl.systems.digenrl_generators import DigenRLGenerators
from digenrl.systems.phases import Accumulation, train_logical_batch, units_per_sample
from digenrl.systems.separate import check_trainer_pool_backend, separate_layout
from digenrl.tag.component import Tag, check_tag_config, tag_wanted
from digenrl.tag.policy import TagPredictor
from digenrl.trainer.parallel import resolve_backend
from digenrl.tsp.pipeline import TspLayout, check_boundaries

log = logging.getLogger(__name__)

#: seconds between a trainer's looks at the store while TAG waits for the generators to hold θ_k
TAG_POLL_S = 0.005


def _trainer_backend(cfg: Config, plan: RunPlan) -> str:
    return resolve_backend(plan.trainer_backend, world_size=plan.trainers, mode=cfg.trainer.mode)


def fragment_plan(cfg: Config, plan: RunPlan) -> FragmentPlan:
    """The fragments of an iteration of ``plan`` (``gap.*``) over its D = generators / ``tsp.stages``
    pipelines."""
    return FragmentPlan(
        cfg.algo.prompts_per_iteration,
        plan.fragment_groups,
        plan.pipelines,
        assignment=plan.fragment_assignment,
        group_size=cfg.algo.group_size,
        sample_size=plan.fragment_samples,
    )


class DigenRL(DigenRLGenerators):
    name = "digenrl"
    knobs = (*DigenRLGenerators.knobs, "gap", "tsp", "tag", "tcss")
    sharding = "units"

    @classmethod
    def check(cls, cfg: Config, plan: RunPlan) -> None:
        from digenrl.models.specs import get_model_spec

        check_trainer_pool_backend(plan)
        layout = separate_layout(cfg, plan)
        tsp = TspLayout(layout.generator_ranks, plan.tsp_stages)
        num_steps = cfg.sampler.num_steps or get_model_spec(cfg.model.name).default_num_steps
        tsp.check_num_steps(num_steps)
        if plan.tsp_boundaries is not None:
            check_boundaries(list(plan.tsp_boundaries), tsp.stages, num_steps)
        fragments = fragment_plan(cfg, plan)
        if plan.tcss:
            resolve_switch(plan.tcss_switch, fragments.num_fragments)
        backend = _trainer_backend(cfg, plan)
        check_gap_config(cfg, plan, len(layout.trainer_ranks), lockstep=backend == "fsdp2")
        check_tag_config(plan, backend)

    # ------------------------------------------------------------------ set-up
    def trainer_generates(self) -> bool:
        return tag_wanted(self.plan, _trainer_backend(self.cfg, self.plan), announce=self.ctx.rank == 0)

    def fragment_plan(self) -> FragmentPlan:
        return fragment_plan(self.cfg, self.plan)

    def tag_predictor(self) -> TagPredictor | None:
        """What ``tag.policy=auto`` decides by: the simulator's prediction of this run's plan (imported only
        then: a run that does not ask it never loads the simulator)."""
        if not self.plan.searches_tag_budget:
            return None
        from digenrl.sim.predict import SimPredictor

        return SimPredictor.for_run(self.cfg, self.profile, self.plan)

    def setup(self) -> RankComponents:
        parts = super().setup()
        cfg, ctx = self.cfg, self.ctx
        self.tag = Tag()  # TAG off unless this is a trainer rank that can generate
        if self.is_trainer:
            self.units_per_sample = units_per_sample(cfg, parts.sampler)
            self.batch_units = cfg.algo.prompts_per_iteration * cfg.algo.group_size * self.units_per_sample
            self.consumer = FragmentConsumer(
                self.stream,
                self.bound,
                parts.events,
                train_order=self.plan.train_order,
                streaming=self.plan.gap,
                micro_batch_size=cfg.trainer.micro_batch_size,
                pack=not parts.trainer.backend.lockstep,  # lockstep: one micro-batch per fragment
                clamp=cfg.algo.adv_clamp,
            )
        if self.is_trainer and parts.engine is not None:
            self.tag = Tag.build(
                cfg,
                self.plan,
                engine=parts.engine,
                backend=parts.trainer.backend,
                stream=self.stream,
                events=parts.events,
                profile=self.profile,
                generator_ranks=self.layout.generator_ranks,
                group=self.groups.trainer_group,
                bound=self.bound,
                prompts=parts.prompts,
                predictor=self.tag_predictor(),
            )
        if ctx.rank == 0:
            log.info("%s", self.stream.plan.describe(cfg.algo.group_size))
            log.info("%s", self.tsp_plan.describe())
        return parts

    def describe_mechanisms(self) -> str:
        """GAP, TSP, TAG and TCSS as this run uses them (rank 0, a trainer, prints it)."""
        cfg, plan, layout = self.cfg, self.stream.plan, self.tsp_plan.layout
        tcss = self.bound.describe_tcss(self.plan.tcss_switch, plan.num_fragments)
        size = f"{plan.fragment_samples(cfg.algo.group_size)} samples"
        return (
            f"GAP {'on' if self.plan.gap else 'off'} ({plan.num_fragments} fragments of "
            f"{size}), TSP {layout.num_pipelines} pipeline(s) x {layout.stages} "
            f"stage(s), {self.tag.describe()}, {tcss}"
        )

    def before_first_iteration(self) -> None:
        self.initial_sync()

    # ------------------------------------------------------------------ trainer pool
    def train_iteration(self, iteration: int) -> IterationReport:
        """The trainer row of the module's timeline: TAG's budget; the fragments in training order, each
        trained on arrival (GAP), a tail fragment generated while the next is not ready (TAG); the optimizer
        step (``algo.num_updates_per_batch`` passes over the batch); the push of θ_k+1."""
        cfg, version, fragments, t0 = self.cfg, self.version.current, self.consumer, time.perf_counter()
        training = Accumulation(self.parts.trainer, self.parts.events, iteration, version, self.batch_units)
        fragments.begin(iteration, version, train=training.train)
        self.tag.begin(iteration, version)  # the pool's budget; sharded weights gathered here, at the head
        patience = time.perf_counter() + cfg.runtime.timeout_s  # then receive()'s own timeout applies
        while (f := fragments.next()) is not None:
            if not fragments.ready(f):
                if (made := self.tag.help(fragments.pending)) is not None:
                    self.finish_fragment(made)  # scored and shipped like a last stage's
                    continue
                if self.tag.waiting and time.perf_counter() < patience:  # generators lack θ_k yet
                    time.sleep(TAG_POLL_S)
                    continue
            self.tag.leave()
            fragments.receive(f)  # GAP on: trained now, while the generators make the next ones
        self.tag.leave()
        passes, fed = cfg.algo.num_updates_per_batch, self.plan.gap
        step = train_logical_batch(training, fragments.received, passes, packer=fragments.packer, fed=fed)
        t1 = time.perf_counter()
        self.shipping = self.drain(
            self.shipping, what=f"the other trainers to take helper fragments of {iteration}"
        )
        sync = self.push_next_version(iteration)
        phase_s = {"fragments_and_train": t1 - t0, "sync": time.perf_counter() - t1}
        # every sample has the same number of units: unit-weighted reward moments are the samples'
        batch = TrajectoryBatch.cat(fragments.received)
        samples = batch.num_units / self.units_per_sample
        report = self.trainer_report(
            batch.rewards, samples, training, step, sync, fragments.staleness, phase_s
        )
        report.step.update(self.tag.metrics())
        return report
