"""``colocated-engine``: the veRL-Omni hybrid engine baseline (docs/design.md §4).

Colocated like ``colocated-sync`` (same shares, rollout, scoring, advantages and training, inherited), but
the rollout runs on a separate generation copy of the policy, as veRL's hybrid engine runs it in an
inference engine beside the FSDP actor. Every iteration, on every rank
(:mod:`digenrl.systems.engine_switch`)::

    offload optimizer state + gradients ─▶ onload generation copy ─▶ re-shard θ_k into it ─▶ offload the
    trainer's weights (full fine-tuning) ─▶ generate ─▶ offload generation copy ─▶ onload trainer ─▶
    score ─▶ advantages ─▶ accumulate ─▶ optimizer step (θ_{k+1}) ─▶ next iteration

The re-shard reads the step's result, so it is "after the optimizer step" of the previous iteration; it sits
at the start of the rollout so that an evaluation or a checkpoint between iterations finds the trainer on
the device. The generation copy starts from the same base weights and its trainable tensors are the
trainer's after every re-shard, so the update is colocated-sync's on the same data and seed (system test);
what differs is the time and memory the switch costs, recorded as ``offload`` / ``onload`` / ``reshard``
spans. ``engine.offload=false`` keeps both copies on the device (only the re-shard runs) and is refused at
startup when the estimate says they do not fit (digenrl/validation.py, :func:`digenrl.planning.shared_device.
engine_copies_error`).
"""

from __future__ import annotations

from digenrl.config import Config, ConfigError
from digenrl.data.trajectory import TrajectoryBatch
from digenrl.plan import RunPlan
from digenrl.rollout.scoring import ScoreResult
from digenrl.runtime.comm.weight_sync import resolve_sync_mode
from digenrl.runtime.observe.span_phases import Phase
from digenrl.systems.colocated_sync import ColocatedSync
from digenrl.systems.components import RankComponents
from digenrl.systems.engine_switch import EngineSwitch
from digenrl.systems.residency import ResidencyPlanner, ResidencyPolicy
from digenrl.trainer.parallel.base import resolve_backend


class ColocatedEngine(ColocatedSync):
    name = "colocated-engine"
    knobs = ("colocated", "engine")
    generation_copy = True

    @classmethod
    def check(cls, cfg: Config, plan: RunPlan) -> None:
        super().check(cfg, plan)
        backend = resolve_backend(plan.trainer_backend, world_size=plan.world_size, mode=cfg.trainer.mode)
        if backend == "deepspeed":
            raise ConfigError(
                "trainer.backend=deepspeed is not supported by system=colocated-engine (its re-shard reads "
                "FSDP2 shards or replicas); use trainer.backend=fsdp2, ddp or auto"
            )

    def setup(self) -> RankComponents:
        parts = super().setup()
        events = parts.events

        def span(phase: str, start: float, end: float, extra: dict) -> None:
            now = events.now()  # the switch timed itself with perf_counter: end it now, keep its length
            events.record_span(phase, now - (end - start), now, iteration=self.iteration, extra=extra)

        trainer = parts.trainer
        self.switch = EngineSwitch(
            trainer_module=trainer.backend.module,
            trainer_named=trainer.backend.named_trainable(),
            optimizer=trainer.optimizer,
            generation_model=parts.generation_model,
            device=self.ctx.device,
            mode=resolve_sync_mode(self.cfg),
            offload=self.plan.engine_offload,
            on_span=span,
        )
        return parts

    def build_residency(self, parts: RankComponents) -> ResidencyPlanner:
        """Nothing moves through the residency planner: the switch moves the trainer's states and the
        generation copy, and the reward stays resident (an evaluation then moves nothing either)."""
        policy = ResidencyPolicy(train_resident=True, rollout_resident=True, reward_resident=True)
        return ResidencyPlanner(policy, tracked=(), transitions={})

    def describe_pools(self) -> str:
        offload = "offloaded while generating" if self.plan.engine_offload else "resident"
        return f"colocated hybrid engine: every rank generates on its generation copy and trains ({offload})"

    def rollout(self, iteration: int, version: int) -> tuple[TrajectoryBatch, ScoreResult]:
        """Switch to the generation copy, generate this rank's samples, switch back, decode and score (veRL
        leaves its sharding manager right after ``generate_sequences``; the reward runs beside the actor)."""
        events = self.parts.events
        self.switch.to_generation()
        with events.span(Phase.GENERATE, iteration=iteration, policy_version=version):
            batch = self.generate_share(self.share, iteration, version)
        self.switch.to_training()
        with events.span(Phase.SCORE, iteration=iteration, policy_version=version):
            score = self.parts.scorer(batch)
        return batch, score
