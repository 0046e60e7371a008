"""Spread one fragment's training units over the trainer ranks by (sample, timestep).

docs/design.md §3 (TSP, trainer side): the trainer's work unit is one (sample b, trained transition k),
and the units of a single fragment are spread over *all* trainer ranks, so that even one small fragment
keeps every trainer GPU busy. A fragment of B samples with K trained steps holds B·K units; with R trainer
ranks each rank gets ⌊B·K/R⌋ or ⌈B·K/R⌉ of them.

Order. Units are ordered **timestep-major** — by the denoising step they train (``step_indices[b, k]``),
then by sample — and each rank takes one contiguous run of that order. FlowGRPO's rollout runs all
samples of a step through one forward, and its training loop does the same per timestep (flow_grpo
scripts/train_sd3.py: ``for j in train_timesteps: ... transformer(latents[:, j], ...)``); keeping a
rank's units in runs of equal step lets its micro-batches (:func:`digenrl.data.micro_batches.
plan_micro_batches`, which cuts a K = 1 batch into consecutive runs of ``trainer.micro_batch_size``) see
the rollout's batch composition wherever the run boundaries allow. A micro-batch mixes two steps only
where a rank's run crosses a step boundary inside it. For the 'shuffled' selection (per-sample trained
steps) ordering by the step value, not the column k, is what groups equal timesteps.

Representation. A shard is a :class:`TrajectoryBatch` of K = 1 unit rows
(:meth:`TrajectoryBatch.select_units`): one row per unit with its sample's identity, conditioning and
advantage. The trainer's ``accumulate(shard, unit_weight)`` takes it unchanged, and because the loss is
a per-unit sum weighted by ``unit_weight = 1 / (units of the logical batch)`` (see
:mod:`digenrl.trainer.trainer`), the summed gradient over all shards of all fragments equals the one of
the whole batch (up to float summation order). When every sample trains the same steps ('first',
'fast-window'), a run of at most B consecutive units holds each sample at most once, so the
conditioning is repeated only when a rank receives more than B units of one fragment (fewer ranks than
trained steps). ``final_latents`` is dropped from shards (the trainer never
reads it; it would add one latent per unit on the wire) unless ``keep_final_latents``.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from digenrl.data.trajectory import TrajectoryBatch
from digenrl.rules import shard_sizes


def timestep_major_units(step_indices: torch.Tensor) -> list[tuple[int, int]]:
    """All (b, k) units of a ``[B, K]`` trained-step table, ordered by (step value, b, k)."""
    if step_indices.ndim != 2:
        raise ValueError(f"step_indices must be [B, K], got shape {tuple(step_indices.shape)}")
    steps = step_indices.cpu().tolist()
    units = [(b, k) for b, row in enumerate(steps) for k in range(len(row))]
    return sorted(units, key=lambda u: (steps[u[0]][u[1]], u[0], u[1]))


def plan_unit_shards(
    step_indices: torch.Tensor, num_shards: int, offset: int = 0
) -> list[list[tuple[int, int]]]:
    """The (b, k) units of each shard: contiguous runs of the timestep-major order, balanced to ±1 (the
    larger runs from shard ``offset`` on, see :func:`shard_sizes`)."""
    units = timestep_major_units(step_indices)
    shards, start = [], 0
    for size in shard_sizes(len(units), num_shards, offset):
        shards.append(units[start : start + size])
        start += size
    return shards


def shard_units(
    batch: TrajectoryBatch, num_shards: int, *, offset: int = 0, keep_final_latents: bool = False
) -> list[TrajectoryBatch]:
    """``batch``'s units split over ``num_shards`` trainer ranks (shard r goes to trainer rank r; the
    larger shards from rank ``offset`` on).

    Each shard is a K = 1 TrajectoryBatch (possibly empty when the batch has fewer units than shards).
    """
    shards = []
    for units in plan_unit_shards(batch.step_indices, num_shards, offset):
        part = batch.select_units([u[0] for u in units], [u[1] for u in units])
        shards.append(part if keep_final_latents else replace(part, final_latents=None))
    return shards
