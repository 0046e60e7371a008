"""The phases every schedule is built from: generate, score, advantages, train, optimizer step.

Baselines and DigenRL call exactly these functions; a system differs from another only in *when* and
*on which ranks* it calls them (docs/design.md §4: "same components, different schedule").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from digenrl.algo.advantages import gather_rewards, group_advantages
from digenrl.config import AlgoConfig, Config
from digenrl.data.trajectory import TrajectoryBatch
from digenrl.gap.unit_packer import UnitPacker
from digenrl.rollout.sampler import Sampler
from digenrl.rollout.scoring import ScoreResult
from digenrl.rules.schedule import trained_step_count
from digenrl.runtime.comm.distributed import comm_device, named_collective
from digenrl.runtime.faults.fault_injection import inject_delay
from digenrl.runtime.observe.events import EventLogger
from digenrl.runtime.observe.span_phases import Phase
from digenrl.trainer.trainer import PolicyTrainer


def assign_advantages(
    batch: TrajectoryBatch,
    score: ScoreResult,
    algo: AlgoConfig,
    group: dist.ProcessGroup | None = None,
    *,
    local: bool = False,
) -> TrajectoryBatch:
    """Fill ``rewards``/``advantages`` and drop samples of groups with a non-finite reward.

    Rewards are gathered over ``group`` (the ranks that together hold the logical batch) before
    normalising, because with ``adv_std=global`` the std spans the whole batch and, in general, a
    rank's slice need not hold a group's every sample (docs/algorithm.md, "Advantages"). ``local=True``
    normalises over this batch alone (a GAP fragment: complete groups, per-group std).
    """
    keep = score.keep
    local_rewards = score.rewards.float()
    group_ids = batch.prompt_ids.cpu()
    sample_ids = batch.sample_ids.cpu()
    # Dropped samples stay out of the statistics: give them a unique negative group id.
    masked_ids = torch.where(keep, group_ids, -1 - (group_ids * 1_000_003 + sample_ids))
    if local:
        all_rewards, all_ids = local_rewards, masked_ids
    else:
        device = comm_device(group) if dist.is_available() and dist.is_initialized() else torch.device("cpu")
        rank = dist.get_rank() if dist.is_initialized() else 0
        members = f"ranks {dist.get_process_group_ranks(group)}" if group is not None else "all ranks"
        with named_collective(
            f"rank {rank} gathering the rewards of iteration {batch.iteration} over {members}"
        ):
            all_rewards, all_ids = gather_rewards(
                local_rewards.to(device), masked_ids.to(device), group=group
            )
        all_rewards, all_ids = all_rewards.cpu(), all_ids.cpu()
    all_keep = all_ids >= 0
    if not bool(all_keep.any()):
        raise FloatingPointError(
            f"every reward of iteration {batch.iteration} is non-finite, so no prompt group is left to train "
            "on: the policy's samples are not finite. The last update was likely too large (see update_norm "
            "in metrics.jsonl and lower trainer.lr)"
        )
    result = group_advantages(
        all_rewards[all_keep], all_ids[all_keep], std_mode=algo.adv_std, clamp=algo.adv_clamp
    )
    advantages_all = torch.zeros_like(all_rewards)
    advantages_all[all_keep] = result.advantages
    offset = 0 if local else _local_offset(local_rewards.numel(), group)
    advantages = advantages_all[offset : offset + local_rewards.numel()]
    device = batch.log_probs.device
    batch.rewards = local_rewards.to(device)
    batch.advantages = advantages.to(device)
    kept = torch.nonzero(keep).flatten()
    return batch if kept.numel() == batch.batch_size else batch.select(kept)


def _local_offset(n_local: int, group: dist.ProcessGroup | None) -> int:
    """Index of this rank's first sample in the rank-ordered gather of ``gather_rewards``."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    sizes = [None] * dist.get_world_size(group)
    dist.all_gather_object(sizes, n_local, group=group)
    return sum(sizes[: dist.get_rank(group)])


@dataclass
class TrainStats:
    """Sums over training units, reduced over the trainer pool by :meth:`reduce`."""

    units: float = 0.0
    loss_sum: float = 0.0
    ratio_sum: float = 0.0
    clipped: float = 0.0
    kl_sum: float = 0.0
    ratio_min: float = float("inf")
    ratio_max: float = float("-inf")
    # units whose real text lengths are known, and the sums of those lengths and their squares (the FLOP
    # count of forwards with the text padding cut, digenrl/costs/flops.py text_forward_flops)
    text_units: float = 0.0
    text_sum: float = 0.0
    text_sq_sum: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    def add(self, stats: dict[str, float]) -> None:
        self.units += stats["units"]
        self.loss_sum += stats["loss_sum"]
        self.ratio_sum += stats["ratio_sum"]
        self.clipped += stats["clipped_count"]
        self.kl_sum += stats.get("kl_sum", 0.0)
        self.text_units += stats.get("text_units", 0.0)
        self.text_sum += stats.get("text_tokens_sum", 0.0)
        self.text_sq_sum += stats.get("text_tokens_sq_sum", 0.0)
        if stats["units"]:
            self.ratio_min = min(self.ratio_min, stats["ratio_min"])
            self.ratio_max = max(self.ratio_max, stats["ratio_max"])

    def reduce(self, group: dist.ProcessGroup | None = None) -> dict[str, float]:
        sums = torch.tensor(
            [
                *(self.units, self.loss_sum, self.ratio_sum, self.clipped, self.kl_sum),
                *(self.text_units, self.text_sum, self.text_sq_sum),
            ],
            dtype=torch.float64,
        )
        extremes = torch.tensor([-self.ratio_min, self.ratio_max], dtype=torch.float64)
        if dist.is_available() and dist.is_initialized():
            sums, extremes = sums.to(comm_device(group)), extremes.to(comm_device(group))
            dist.all_reduce(sums, group=group)
            dist.all_reduce(extremes, op=dist.ReduceOp.MAX, group=group)
            sums, extremes = sums.cpu(), extremes.cpu()
        units = max(sums[0].item(), 1.0)
        return {
            "units": sums[0].item(),
            "loss": sums[1].item() / units,
            "ratio_mean": sums[2].item() / units,
            "ratio_min": -extremes[0].item(),
            "ratio_max": extremes[1].item(),
            "clip_frac": sums[3].item() / units,
            "kl": sums[4].item() / units,
        } | (
            # every trained unit's text length known: the mean real text tokens a forward computes, and of its
            # square (with the padding cut, a forward's FLOPs are quadratic in them: digenrl/costs/flops.py)
            {"text_tokens_mean": sums[6].item() / units, "text_tokens_sq_mean": sums[7].item() / units}
            if sums[0].item() > 0 and sums[5].item() == sums[0].item()
            else {}
        )


@dataclass
class Accumulation:
    """One logical batch's gradient on a trainer rank: each part's units weighted 1 / ``total_units`` (the
    units of the whole logical batch, all ranks), each part trained in a ``train`` span, each optimizer
    step an ``optimizer`` span."""

    trainer: PolicyTrainer
    events: EventLogger
    iteration: int
    version: int
    total_units: float
    stats: TrainStats = field(default_factory=TrainStats)

    def train(self, part: TrajectoryBatch) -> None:
        inject_delay(self.events.rank, "train")  # robustness tests only: a deliberately slow trainer
        with self.events.span(
            Phase.TRAIN, iteration=self.iteration, policy_version=self.version, samples=part.batch_size
        ):
            train_on(self.trainer, part, self.total_units, self.stats)

    def step(self) -> dict[str, float]:
        with self.events.span(Phase.OPTIMIZER, iteration=self.iteration, policy_version=self.version):
            return self.trainer.step(self.iteration)


def train_logical_batch(
    training: Accumulation,
    parts: list[TrajectoryBatch],
    num_updates: int,
    *,
    packer: UnitPacker | None = None,
    fed: bool = False,
) -> dict[str, float]:
    """``num_updates`` passes over the logical batch's ``parts`` (flow_grpo's inner epochs), each
    accumulated, then stepped; returns the last step's stats. Every schedule trains through here.

    ``packer``: the parts' units reach ``training.train`` in whole micro-batches across parts (GAP's unit
    shards, :class:`~digenrl.gap.unit_packer.UnitPacker`; default: each part as it is). ``fed``: the first
    pass already went through ``packer`` as the parts arrived (GAP on: a fragment trains on arrival)."""
    packer = packer or UnitPacker(training.train, 1, enabled=False)
    step_stats: dict[str, float] = {}
    for update in range(num_updates):
        if update or not fed:
            for part in parts:
                packer.add(part)
        packer.flush()
        step_stats = training.step()
    return step_stats


def train_on(trainer: PolicyTrainer, batch: TrajectoryBatch, total_units: float, stats: TrainStats) -> None:
    """Accumulate the gradient of ``batch``'s units, weighted so that the sum over every part of the
    logical batch (all fragments, all ranks) is the gradient of the mean unit loss."""
    if batch.batch_size == 0:
        return
    stats.add(trainer.accumulate(batch, unit_weight=1.0 / total_units))


def reward_summary(rewards: torch.Tensor, group: dist.ProcessGroup | None = None) -> tuple[float, float]:
    """Mean and population std of the rewards held by all ranks of ``group``."""
    local = rewards.detach().double().cpu()
    moments = torch.tensor([local.numel(), local.sum().item(), (local**2).sum().item()], dtype=torch.float64)
    if dist.is_available() and dist.is_initialized():
        moments = moments.to(comm_device(group))
        dist.all_reduce(moments, group=group)
        moments = moments.cpu()
    n = max(moments[0].item(), 1.0)
    mean = moments[1].item() / n
    var = max(moments[2].item() / n - mean**2, 0.0)
    return mean, var**0.5


def units_per_sample(cfg: Config, sampler: Sampler) -> int:
    """Trained transitions per trajectory (K), as the engine selects them (same count in every mode)."""
    return trained_step_count(cfg.algo, sampler.num_steps)
