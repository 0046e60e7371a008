"""Plumbing shared by every schedule on disjoint pools (``separate-*`` baselines and ``digenrl``).

A :class:`SeparateSystem` builds the layout and process groups, gives trainer ranks a
:class:`PolicyTrainer` and generator ranks a :class:`RolloutEngine`, and offers the three moves those
schedules are made of:

* ``ship(batch, key)`` / ``receive(key)`` — a generator splits a scored batch over the trainer ranks
  (by samples) and sends each share point-to-point; metadata rides on the c10d store;
* ``push_weights(version)`` / ``pull_weights(version)`` — trainer → generators weight sync with a
  policy version and a checksum;
* ``generator_pool_group`` — advantages are normalised over the generator pool, which holds the whole
  logical batch.

Ordering rule that keeps the point-to-point traffic deadlock-free: a generator sends to trainers in
increasing rank order, and a trainer receives from generators in increasing rank order.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from digenrl.config import Config, ConfigError
from digenrl.rollout.trajectory import TrajectoryBatch
from digenrl.runtime.control_plane import ControlPlane
from digenrl.runtime.layout import Layout, build_layout, build_process_groups
from digenrl.runtime.transfer import recv_trajectories, send_trajectories
from digenrl.runtime.weight_sync import (
    POLICY_VERSION_NAME,
    SyncStats,
    WeightSync,
    prepare_generator_model,
    resolve_sync_mode,
)
from digenrl.systems import SystemRequirements
from digenrl.systems.base import IterationReport, System
from digenrl.systems.components import RankComponents, build_rank_components

log = logging.getLogger(__name__)


def separate_layout(cfg: Config, world_size: int) -> Layout:
    """The layout of a separate-pool system, or a ConfigError naming the ``pools.*`` keys."""
    from digenrl.rewards.registry import reward_needs_weights

    reward_names = list(cfg.reward.weights) if cfg.reward.weights else [cfg.reward.name]
    pools = cfg.pools
    if pools.trainers == pools.generators == pools.scorers == 0 and world_size >= 2:
        # No split given: half the ranks train, the rest generate (printed at startup by the system).
        pools = dataclasses.replace(pools, trainers=world_size // 2, generators=world_size - world_size // 2)
    layout = build_layout(
        pools,
        world_size,
        needs_scorer_model=any(reward_needs_weights(n) for n in reward_names),
        reward_name=",".join(reward_names),
    )
    if layout.is_colocated:
        raise ConfigError(
            f"system={cfg.system!r} runs on disjoint pools and needs at least 2 ranks; launch with "
            f"torchrun and set pools.trainers and pools.generators (they must add up to the launched "
            f"ranks, {world_size} now)"
        )
    if layout.scorer_ranks:
        raise ConfigError("pools.scorers > 0 is not supported by this system yet; score on the generators")
    return layout


class SeparateRequirements(SystemRequirements):
    """Start-up checks of separate-pool systems: pools fit the world, groups split evenly."""

    def check(self, cfg: Config, world_size: int) -> None:
        layout = separate_layout(cfg, world_size)
        gens, trainers = len(layout.generator_ranks), len(layout.trainer_ranks)
        p = cfg.algo.prompts_per_iteration
        if p % gens:
            raise ConfigError(
                f"algo.prompts_per_iteration={p} must be divisible by pools.generators={gens} so every "
                "generator produces whole prompt groups"
            )
        per_generator = p // gens * cfg.algo.group_size
        if per_generator < trainers:
            raise ConfigError(
                f"each generator produces {per_generator} samples per iteration, fewer than "
                f"pools.trainers={trainers}: raise algo.prompts_per_iteration or lower pools.trainers"
            )


def generator_report(rewards: torch.Tensor, samples: int, phase_s: dict[str, float]) -> IterationReport:
    """A generator rank's own view of an iteration (rank 0, a trainer, writes the metrics)."""
    return IterationReport(
        samples=samples,
        reward_mean=float(rewards.mean()) if rewards.numel() else 0.0,
        reward_std=float(rewards.std(unbiased=False)) if rewards.numel() else 0.0,
        train={},
        step={},
        phase_s=phase_s,
    )


class SeparateSystem(System):
    """Base of the schedules on disjoint generator / trainer pools."""

    def setup(self) -> RankComponents:
        cfg, ctx = self.cfg, self.ctx
        if not ctx.is_distributed:
            raise ConfigError(
                f"system={cfg.system!r} needs torchrun with pools.trainers + pools.generators ranks"
            )
        self.layout = separate_layout(cfg, ctx.world_size)
        self.groups = build_process_groups(self.layout, timeout_s=cfg.runtime.timeout_s)
        self.role = self.layout.role_of(ctx.rank)
        if ctx.rank == 0:
            log.info(
                "layout: trainers %s, generators %s",
                list(self.layout.trainer_ranks),
                list(self.layout.generator_ranks),
            )
        self.is_trainer = self.role == "trainer"
        self.plane = ControlPlane.from_default_group(self.role, cfg.runtime.timeout_s)
        parts = build_rank_components(
            cfg,
            ctx,
            role=self.role,
            generate=not self.is_trainer,
            train=self.is_trainer,
            clock_origin=self.clock_origin,
            process_group=self.groups.trainer_group,
        )
        if not self.is_trainer:
            prepare_generator_model(parts.bundle.flow_model, cfg)
        self.weight_sync = WeightSync(
            cfg.sync,
            layout=self.layout,
            groups=self.groups,
            device=ctx.device,
            mode=resolve_sync_mode(cfg),
            plane=self.plane,
        )
        self.sync_history: list[SyncStats] = []
        return parts

    def checkpoint_ranks(self) -> tuple[bool, object]:
        """Only the trainer pool holds state worth saving; generators get their weights from the
        sync after a resume. Keeping generators out also keeps the save off their timeline, which
        under ``separate-async`` runs ahead of the trainer's."""
        return self.is_trainer, self.groups.trainer_group

    max_staleness = 0  # policy versions a trained trajectory may lag; checked on every received batch

    def check_staleness(self, batch: TrajectoryBatch, version: int) -> int:
        """Run-time invariant: no trajectory trained at version v is older than v − max_staleness."""
        oldest = int(batch.policy_version.min())
        staleness = version - oldest
        if staleness > self.max_staleness:
            raise RuntimeError(
                f"rank {self.ctx.rank}: trajectories of policy version {oldest} reached the trainer at "
                f"version {version} (staleness {staleness} > allowed {self.max_staleness})"
            )
        return staleness

    # ------------------------------------------------------------------ data plane
    @property
    def trainer_ranks(self) -> tuple[int, ...]:
        return self.layout.trainer_ranks

    @property
    def generator_ranks(self) -> tuple[int, ...]:
        return self.layout.generator_ranks

    def ship(self, batch: TrajectoryBatch, key: str) -> float:
        """Send a scored batch's share to every trainer (samples split as evenly as possible);
        returns the bytes sent. The clean latents stay behind: the trainer does not need them."""
        batch.final_latents = None
        shares = torch.arange(batch.batch_size).tensor_split(len(self.trainer_ranks))
        sent = 0.0
        for trainer, idx in zip(self.trainer_ranks, shares, strict=True):
            share_key = f"{key}/from{self.ctx.rank}/to{trainer}"
            stats = send_trajectories(batch.select(idx), trainer, plane=self.plane, key=share_key)
            sent += stats.bytes
        return sent

    def receive(self, key: str, sources: tuple[int, ...] | None = None) -> TrajectoryBatch:
        """This trainer's shares of ``key`` from every generator (or ``sources``), concatenated."""
        parts = []
        for generator in sources if sources is not None else self.generator_ranks:
            batch, _ = recv_trajectories(
                generator,
                plane=self.plane,
                key=f"{key}/from{generator}/to{self.ctx.rank}",
                device=self.ctx.device,
                timeout_s=self.cfg.runtime.timeout_s,
            )
            parts.append(batch)
        return TrajectoryBatch.cat(parts)

    # ------------------------------------------------------------------ weight sync
    def push_weights(self, version: int) -> SyncStats:
        stats = self.weight_sync.push(self.parts.trainer, version)
        self.sync_history.append(stats)
        return stats

    def pull_weights(self, version: int, iteration: int = -1) -> SyncStats:
        """Wait (on the store, logged as ``wait_sync``) until the trainer announces ``version``, then
        join its broadcast — so the timeline separates idle waiting from the transfer itself."""
        with self.parts.events.span("wait_sync", iteration=iteration, policy_version=version):
            self.plane.wait_version(
                POLICY_VERSION_NAME,
                version,
                peer=self.layout.sync_source,
                timeout_s=self.cfg.runtime.timeout_s,
            )
        with self.parts.events.span("sync", iteration=iteration, policy_version=version):
            stats = self.weight_sync.pull(self.parts.bundle.flow_model, version)
        self.sync_history.append(stats)
        return stats

    def initial_sync(self) -> None:
        """Version 0: make every generator start from the trainer's exact weights."""
        if self.is_trainer:
            with self.parts.events.span("sync", iteration=-1, policy_version=self.policy_version):
                self.push_weights(self.policy_version)
        else:
            self.pull_weights(self.policy_version)
