"""The generator pool of ``digenrl``: the pipeline rows of the timeline in :mod:`~digenrl.systems.
digenrl_system`.

Every generator rank is one TSP stage of one pipeline (:class:`~digenrl.tsp.stage_worker.StageWorker`).
Stage 0 claims the iteration's next fragment from the stream (GAP) and binds it to the policy version
TCSS's plan gives it (:class:`~digenrl.async_policy.tcss.StalenessBound`); every stage makes its model
compute with exactly that version before running its step range, joining weight syncs whenever it waits;
the last stage finishes the fragment — decode, score, normalise its complete groups (or, for a fragment
smaller than a group, publish its rewards for the trainers to normalise), ship its (sample, timestep)
units to every trainer rank, with at most ``MAX_SHIPPING`` fragments per trainer in flight. A
TAG helper on a trainer rank finishes the fragments it generates the same way (:meth:`finish_fragment`).
"""

from __future__ import annotations

import time

import torch

from digenrl.runtime.observe.span_phases import Phase
from digenrl.systems.base import IterationReport
from digenrl.systems.components import RankComponents
from digenrl.systems.phases import assign_advantages
from digenrl.systems.separate import SeparateSystem, generator_report
from digenrl.tsp.pipeline import TspLayout, plan_tsp
from digenrl.tsp.stage_worker import EndOfIteration, InFlight, StageWorker

#: scored fragments a last stage may have in flight to the trainers before it waits for them
MAX_SHIPPING = 2


class DigenRLGenerators(SeparateSystem):
    """The generator side of ``digenrl`` (see the module docstring); :class:`~digenrl.systems.
    digenrl_system.DigenRL` adds the trainer side."""

    def setup(self) -> RankComponents:
        parts = super().setup()
        cfg, ctx = self.cfg, self.ctx
        tsp = TspLayout(self.layout.generator_ranks, self.plan.tsp_stages)
        boundaries = self.plan.tsp_boundaries
        self.tsp_plan = plan_tsp(
            tsp,
            parts.sampler.num_steps,
            profile=self.profile,
            boundaries=None if boundaries is None else list(boundaries),
        )
        self.shipping: list = []  # sends of scored fragments still in flight (this rank is their producer)
        if self.is_generator:
            self.stage = StageWorker(
                parts.engine,
                self.tsp_plan,
                ctx.rank,
                self.plane,
                parts.events,
                device=ctx.device,
                timeout_s=cfg.runtime.timeout_s,
            )
        return parts

    def service_weight_sync(self) -> bool:
        """Generators: as :class:`SeparateSystem`, then count this rank among those holding the version
        (TAG helpers wait for every generator: :mod:`digenrl.gap.helper_share`)."""
        received = super().service_weight_sync()
        if received:
            self.stream.announce_held(self.version.latest)
        return received

    def initial_sync(self) -> None:
        super().initial_sync()
        if self.is_generator:
            self.stream.announce_held(self.version.current)

    def generate_iteration(self, iteration: int) -> IterationReport:
        """This rank's stage of its pipeline, for every fragment of ``iteration`` that comes its way."""
        stage, rewards, samples, t0 = self.stage, [], 0, time.perf_counter()
        while True:
            if stage.is_first:
                fragment = self.claim(iteration)
            else:  # joining weight syncs while it waits
                fragment = stage.receive(iteration, idle=self.service_weight_sync)
            if isinstance(fragment, EndOfIteration):
                stage.end_iteration(iteration)
                break
            if self.version.latest < fragment.version:  # not here yet (TCSS: θ_k while training k − 1)
                self.wait_for_version(fragment.version, iteration)
            what = f"rank {self.ctx.rank}: fragment {fragment.fragment} of iteration {iteration}"
            self.version.require(fragment.version, self.parts.bundle.flow_model, what=what)
            fragment = stage.run(fragment)
            if not stage.is_last:
                stage.hand_on(fragment, idle=self.service_weight_sync)
                continue
            rewards.append(self.finish_fragment(fragment))
            samples += fragment.batch.batch_size
        t1 = time.perf_counter()
        if not self.bound.lag:  # on-policy: the next iteration starts from θ_{k+1}
            self.wait_for_version(iteration + 1, iteration)
        local = torch.cat(rewards) if rewards else torch.zeros(0)
        return generator_report(local, samples, {"rollout": t1 - t0, "sync": time.perf_counter() - t1})

    def claim(self, iteration: int) -> InFlight | EndOfIteration:
        """Stage 0: claim the next fragment, bound to the version the plan gives it (TCSS off: θ_k), which
        :meth:`generate_iteration` waits for. ``tcss.switch=timing``: at the fragment boundary take the
        newest weights that arrived, at most one version behind ``iteration``, then claim."""
        self.service_weight_sync()
        if not self.bound.planned:
            self.version.apply_staged(self.parts.bundle.flow_model)
            if self.version.current < (oldest := self.bound.oldest_version(iteration)):
                self.wait_for_version(oldest, iteration)
        head_only = self.bound.head_only(iteration)
        fragment = self.stream.claim(iteration, pipeline=self.stage.pipeline, head_only=head_only)
        if fragment is None:
            return EndOfIteration(iteration)
        version = self.bound.version_of(iteration, fragment) if self.bound.planned else self.version.current
        prompts = self.parts.prompts.prompts_for(iteration, self.cfg.algo.prompts_per_iteration)
        ids = list(self.stream.plan.prompt_ids(fragment))
        batch = self.parts.engine.start(
            [prompts[i] for i in ids], ids, iteration=iteration, policy_version=version
        )
        batch = self.stream.cut(batch, fragment)  # a fragment smaller than its groups: its own samples
        return InFlight(batch, {"iteration": iteration, "fragment": fragment, "policy_version": version})

    def finish_fragment(self, fragment: InFlight) -> torch.Tensor:
        """Decode, score and normalise a generated fragment, then ship its units to every trainer (a
        pipeline's last stage and a TAG helper alike); returns the kept rewards."""
        events, batch = self.parts.events, fragment.batch
        tags = {**fragment.tags, "producer": self.ctx.rank}
        start = time.perf_counter()
        with events.span(self.score_phase, iteration=fragment.iteration, fragment=fragment.fragment):
            score = self.score(batch, fragment.iteration, fragment.fragment)
            if self.stream.plan.splits_groups:  # the trainers normalise once the group is complete
                batch.rewards = score.rewards.float().to(batch.log_probs.device)
                batch.advantages = torch.zeros_like(batch.rewards)
                self.stream.publish_rewards(batch, score.keep, fragment.iteration, fragment.fragment)
            else:
                batch = assign_advantages(batch, score, self.cfg.algo, local=True)
        tags["score_s"] = time.perf_counter() - start
        with events.span(Phase.TRANSFER, iteration=fragment.iteration, fragment=fragment.fragment):
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
