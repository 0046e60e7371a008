"""``ddp``: replicated parameters, gradients all-reduced (SUM) once per optimizer step
(:mod:`digenrl.trainer.parallel`, "Gradient semantics")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from digenrl.trainer.parallel.base import ParallelBackend, broadcast_module

_BUCKET_ELEMENTS = 1 << 26  # 64 Mi elements per all-reduce bucket (256 MB in fp32)


class DDPBackend(ParallelBackend):
    """Replicated parameters; gradients all-reduced (SUM) once per optimizer step (see module doc)."""

    name = "ddp"

    def __init__(self, flow_model: nn.Module, **kwargs: Any) -> None:
        super().__init__(flow_model, **kwargs)
        broadcast_module(self.module, self.group if self.group is not None else dist.group.WORLD)

    def finish_gradients(self) -> None:
        all_reduce_gradients(self.trainable_parameters(), self.group, self.local_view)


def all_reduce_gradients(
    params: list[nn.Parameter], group: Any, local_view: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    """Sum every parameter's gradient over ``group`` in place (the part ``local_view`` gives: the whole
    gradient of a replica, this rank's shard of a DTensor's), in same-dtype buckets; a parameter without a
    gradient (this rank ran no unit) takes part with zeros. DDP's once-per-step reduction, and hybrid
    sharding's across the replicas of a shard (digenrl/trainer/parallel/fsdp2.py)."""
    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(local_view(p.grad))
    for bucket in _buckets(grads):
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        offset = 0
        for g in bucket:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def _buckets(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Consecutive same-dtype runs of at most ``_BUCKET_ELEMENTS`` elements (one all-reduce each)."""
    out: list[list[torch.Tensor]] = []
    size = 0
    for t in tensors:
        if not out or out[-1][0].dtype != t.dtype or size + t.numel() > _BUCKET_ELEMENTS:
            out.append([])
            size = 0
        out[-1].append(t)
        size += t.numel()
    return out
