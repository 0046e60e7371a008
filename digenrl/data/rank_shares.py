"""How a colocated iteration's samples are shared over its ranks (docs/design.md §4, "Work split").

The iteration's logical batch is ``P`` prompt groups of ``G`` samples, numbered group-major
(``sample = group · G + index``). Every rank of a colocated system generates, scores and trains one
contiguous run of those numbers. A run may start or end inside a group: public trainers do so when
groups are fewer than ranks, and the advantages stay those of the whole group because they are computed
after every rank's rewards are gathered (:func:`digenrl.systems.phases.assign_advantages`). Each sample's
noise is keyed by ``(seed, iteration, group, index)`` (:mod:`digenrl.rollout.noise`), so which rank
generates it does not change its trajectory, and per-unit weights are ``1 / (units of the whole batch)``
(:mod:`digenrl.trainer.trainer`), so the share does not change the update.

``equal`` (``colocated.split=equal``): ``P·G / R`` samples per rank at ``trainer.micro_batch_size``.
``speed``: samples in proportion to each device's ``relative_speed`` (largest remainder), every rank at
the full ``trainer.micro_batch_size``, so a device twice as fast runs about twice as many full-size
micro-batches: gradient accumulation does not need equal counts, and a backend that reduces the gradient
once per step (``ddp``, LoRA's default) synchronises only after each rank's last micro-batch. This is the
strongest colocated plan on mixed devices (docs/design.md §4).
``speed-lockstep``: for backends whose every micro-batch is a collective (FSDP2, ZeRO-2/3; full
fine-tuning's default): rank r gets ``q · m_r`` samples in micro-batches of ``m_r``, ``m_r`` proportional to
its speed and ``q`` the same on every rank, so every rank runs ``K · q`` micro-batch steps in step and a
device twice as fast does twice the work per step. ``q`` is the smallest count for which the fastest rank's
micro-batch stays within ``trainer.micro_batch_size`` (the memory the planner checked). With ``speed`` such
a backend would pad the slower ranks with empty micro-batches up to the fastest one's count, so that pair
is refused (:func:`split_backend_conflict`).
The runtime (:class:`digenrl.systems.colocated_sync.ColocatedSync`) and the simulator
(:mod:`digenrl.sim.schedules.colocated`) both take their shares from :func:`rank_shares`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from digenrl.config import COLOCATED_SPLITS


@dataclass(frozen=True)
class RankShare:
    """Samples ``[start, stop)`` of the iteration (group-major numbering), trained in micro-batches of
    ``micro_batch_size`` units."""

    start: int
    stop: int
    micro_batch_size: int

    @property
    def samples(self) -> int:
        return self.stop - self.start

    def picks(self, group_size: int) -> list[tuple[int, list[int]]]:
        """``(group, sample indices)`` for every group the share touches, in order."""
        out: list[tuple[int, list[int]]] = []
        for sample in range(self.start, self.stop):
            group, index = divmod(sample, group_size)
            if out and out[-1][0] == group:
                out[-1][1].append(index)
            else:
                out.append((group, [index]))
        return out


def rank_shares(
    prompts: int, group_size: int, speeds: Sequence[float], micro_batch_size: int, split: str
) -> list[RankShare]:
    """One :class:`RankShare` per rank (``len(speeds)`` ranks, ``speeds[r]`` = rank r's
    ``relative_speed``); ValueError when the batch cannot be shared so, saying why."""
    if split not in COLOCATED_SPLITS:
        raise ValueError(f"split={split!r} is not allowed; choose one of: {', '.join(COLOCATED_SPLITS)}")
    ranks, total = len(speeds), prompts * group_size
    if ranks < 1 or total < 1 or micro_batch_size < 1:
        raise ValueError(
            f"need ranks, samples and micro_batch_size >= 1, got {ranks}, {total}, {micro_batch_size}"
        )
    if split == "equal":
        if total % ranks:
            raise ValueError(
                f"{prompts} prompt groups x {group_size} samples = {total} samples do not divide evenly over "
                f"{ranks} ranks"
            )
        sizes, micro = [total // ranks] * ranks, [micro_batch_size] * ranks
    elif split == "speed":
        _check_speeds(speeds)
        sizes = _proportional(total, speeds)
        if sizes is None:
            raise ValueError(
                f"{total} samples cannot give each of {ranks} ranks at least one sample (and so a "
                "micro-batch) under colocated.split=speed; use fewer ranks or a larger batch"
            )
        micro = [micro_batch_size] * ranks
    else:
        sizes, micro = _speed_sizes(total, speeds, micro_batch_size)
    bounds = [0, *[sum(sizes[: r + 1]) for r in range(ranks)]]
    return [RankShare(bounds[r], bounds[r + 1], micro[r]) for r in range(ranks)]


def split_backend_conflict(split: str, backend: str, deepspeed_stage: int = 2) -> str | None:
    """Why ``split`` cannot run with the resolved training ``backend`` (None: it can). ``speed`` gives
    ranks different numbers of micro-batches, which a lockstep backend runs in step, padding the slower
    ranks with empty ones: the fast ranks' advantage is lost and the slow ones compute for nothing."""
    lockstep = backend == "fsdp2" or (backend == "deepspeed" and deepspeed_stage >= 2)
    if split == "speed" and lockstep:
        return (
            "colocated.split=speed gives the ranks different numbers of micro-batches, but trainer.backend "
            f"{backend} runs every micro-batch as a collective in step (the slower ranks would pad with "
            "empty micro-batches); use colocated.split=speed-lockstep (the same number of smaller "
            "micro-batches on the slower ranks) or a LoRA run with trainer.backend=ddp"
        )
    return None


def _check_speeds(speeds: Sequence[float]) -> None:
    if any(not (s > 0 and math.isfinite(s)) for s in speeds):
        raise ValueError(f"relative speeds must be positive and finite, got {list(speeds)}")


def _speed_sizes(total: int, speeds: Sequence[float], micro_batch_size: int) -> tuple[list[int], list[int]]:
    """(samples, micro-batch size) per rank for the ``speed-lockstep`` split (module docstring)."""
    _check_speeds(speeds)
    ranks = len(speeds)
    for steps in range(1, total + 1):  # q: micro-batch rows per trained timestep, the same on every rank
        if total % steps or total // steps < ranks:
            continue
        micro = _proportional(total // steps, speeds)
        if micro is not None and max(micro) <= micro_batch_size:
            return [steps * m for m in micro], micro
    raise ValueError(
        f"{total} samples cannot be shared over {ranks} ranks in proportion to their speeds {list(speeds)} "
        f"with the same number of micro-batches on every rank and micro-batches of at most "
        f"trainer.micro_batch_size={micro_batch_size}; use colocated.split=speed, equal, or change the batch"
    )


def _proportional(total: int, speeds: Sequence[float]) -> list[int] | None:
    """``total`` over ``speeds`` by largest remainder, at least 1 each (None if that is impossible)."""
    exact = [total * s / sum(speeds) for s in speeds]
    shares = [max(1, int(x)) for x in exact]
    left = total - sum(shares)
    if left < 0:
        return None
    for r in sorted(range(len(speeds)), key=lambda r: (-(exact[r] - int(exact[r])), r))[:left]:
        shares[r] += 1
    return shares
