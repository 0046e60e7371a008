"""What one simulated run computes: the logical batch, the sampler and the training units (docs/design.md §1).

A :class:`Workload` is schedule-independent: every schedule of the same workload generates the same
``P·G`` trajectories of ``T`` steps and trains the same ``P·G·K`` units per iteration (K trained timesteps
per sample), so their busy GPU-seconds can be compared (the simulator tests check that they are
conserved). Per-operation times come from the :class:`~digenrl.costs.cost_model.CostModel`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from digenrl.config import TRAINER_MODES
from digenrl.costs.cost_model import CostModel
from digenrl.costs.sample_costs import SampleVariance
from digenrl.plan.rollout_defaults import rollout_defaults
from digenrl.rules.schedule import trained_step_count

if TYPE_CHECKING:
    from digenrl.config import Config


@dataclass(frozen=True)
class Workload:
    """One FlowGRPO iteration's work, repeated ``iterations`` times.

    ``samples_per_forward``: most samples in one generator forward (0 = a rank's whole batch, as
    ``sampler.samples_per_forward``). ``activation_checkpointing``: ``trainer.activation_checkpointing``
    (training recomputes the forward in the backward, :meth:`CostModel.train_micro_batch_s`).
    ``trainer_mode``: ``lora`` or ``full`` (full fine-tuning: FSDP2 shards weights, gradients and optimizer
    state over the trainer group, every micro-batch gathers the weights, TAG cannot run). ``variance``:
    per-sample cost distributions of generation and reward (:mod:`digenrl.costs.sample_costs`; None = every
    sample costs the cost file's, the simulator's results without variance).

    The first ``warmup_iterations`` (pipeline fill, docs/design.md §5) and the last
    ``cooldown_iterations`` are excluded from steady-state numbers: schedules that overlap iterations
    (TCSS, the async buffer) generate iteration k+1 during k, and a run's last iteration has no successor
    to prefetch, so counting it would credit the window with less work than a steady iteration does.
    """

    prompts_per_iteration: int
    group_size: int
    num_steps: int
    train_steps: int
    cfg: bool
    micro_batch_size: int = 4
    samples_per_forward: int = 0
    activation_checkpointing: bool = False
    trainer_mode: str = "lora"
    iterations: int = 4
    warmup_iterations: int = 1
    cooldown_iterations: int = 1
    variance: SampleVariance | None = None

    def __post_init__(self) -> None:
        for name in ("prompts_per_iteration", "group_size", "num_steps", "train_steps", "micro_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Workload.{name} must be an int >= 1, got {value!r}")
        if self.train_steps > self.num_steps:
            raise ValueError(
                f"Workload.train_steps ({self.train_steps}) must be <= num_steps ({self.num_steps})"
            )
        if self.trainer_mode not in TRAINER_MODES:
            raise ValueError(f"Workload.trainer_mode must be 'lora' or 'full', got {self.trainer_mode!r}")
        if self.samples_per_forward < 0:
            raise ValueError(f"Workload.samples_per_forward must be >= 0, got {self.samples_per_forward}")
        if self.warmup_iterations < 0 or self.cooldown_iterations < 0:
            raise ValueError(
                f"Workload.warmup_iterations and cooldown_iterations must be >= 0, got "
                f"{self.warmup_iterations}, {self.cooldown_iterations}"
            )
        if self.warmup_iterations + self.cooldown_iterations >= self.iterations:
            raise ValueError(
                f"Workload.iterations ({self.iterations}) must exceed warmup_iterations + "
                f"cooldown_iterations ({self.warmup_iterations} + {self.cooldown_iterations}) "
                "to leave a steady state"
            )

    @property
    def steady_iterations(self) -> range:
        """Iterations counted in steady-state numbers."""
        return range(self.warmup_iterations, self.iterations - self.cooldown_iterations)

    @property
    def samples_per_iteration(self) -> int:
        return self.prompts_per_iteration * self.group_size

    @property
    def units_per_iteration(self) -> int:
        return self.samples_per_iteration * self.train_steps

    def step_s(self, cost: CostModel, samples: int) -> float:
        """One denoising step for ``samples`` samples, in forwards of at most ``samples_per_forward``."""
        if samples <= 0:
            return 0.0
        chunk = self.samples_per_forward or samples
        full, rest = divmod(samples, chunk)
        total = full * cost.generator_step_s(chunk, self.cfg)
        return total + (cost.generator_step_s(rest, self.cfg) if rest else 0.0)

    def generation_s(self, cost: CostModel, samples: int, steps: int | None = None) -> float:
        """``steps`` (default all T) denoising steps for ``samples`` samples on one device."""
        return (self.num_steps if steps is None else steps) * self.step_s(cost, samples)

    def train_s(self, cost: CostModel, units: int) -> float:
        """Accumulate ``units`` training units in micro-batches of ``micro_batch_size``."""
        return cost.train_units_s(units, self.micro_batch_size, self.cfg, self.activation_checkpointing)

    def micro_batch_s(self, cost: CostModel, units: int) -> float:
        """One micro-batch of ``units`` units (at most ``micro_batch_size``)."""
        return cost.train_micro_batch_s(units, self.cfg, self.activation_checkpointing) if units else 0.0

    @classmethod
    def from_config(
        cls,
        cfg: Config,
        *,
        iterations: int | None = None,
        warmup_iterations: int = 1,
        cooldown_iterations: int = 1,
    ) -> Workload:
        """The workload a run of ``cfg`` executes (steps, guidance and trained-step count resolved like
        :meth:`digenrl.rollout.sampler.Sampler.from_config` and ``digenrl.algo.timesteps``)."""
        spec = rollout_defaults(cfg.model.name)  # the model spec's, torch-free
        steps = cfg.sampler.num_steps or spec.num_steps
        guidance = spec.guidance_scale if cfg.sampler.guidance_scale is None else cfg.sampler.guidance_scale
        # K: MixGRPO's / FlowGRPO-Fast's window, else max(1, floor(T * timestep_fraction)); training
        # cost scales with it, so a MixGRPO window of 4 of 25 steps trains 4/24 of FlowGRPO's units
        trained = trained_step_count(cfg.algo, steps)
        return cls(
            prompts_per_iteration=cfg.algo.prompts_per_iteration,
            group_size=cfg.algo.group_size,
            num_steps=steps,
            train_steps=trained,
            cfg=(not spec.guidance_embedded) and guidance > 1.0,
            micro_batch_size=cfg.trainer.micro_batch_size,
            samples_per_forward=cfg.sampler.samples_per_forward,
            activation_checkpointing=cfg.trainer.activation_checkpointing,
            trainer_mode=cfg.trainer.mode,
            iterations=iterations if iterations is not None else cfg.iterations,
            warmup_iterations=warmup_iterations,
            cooldown_iterations=cooldown_iterations,
        )


def split_evenly(total: int, parts: int) -> list[int]:
    """``total`` items over ``parts`` owners, the first ``total % parts`` owners one more."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def fragment_sizes(prompts: int, groups_per_fragment: int) -> list[int]:
    """Groups per fragment when ``prompts`` groups are cut into fragments of ``groups_per_fragment``
    whole groups (a group never straddles fragments, docs/design.md §3 (GAP)); the last may be smaller."""
    if groups_per_fragment < 1:
        raise ValueError(f"fragment_groups must be >= 1, got {groups_per_fragment}")
    full, rest = divmod(prompts, groups_per_fragment)
    return [groups_per_fragment] * full + ([rest] if rest else [])
