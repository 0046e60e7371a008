"""``ddp``: replicated parameters, gradients all-reduced (SUM) once per optimizer step
(:mod:`digenrl.trainer.parallel`, "Gradient semantics")."""

from __future__ import annotations

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
        grads = []
        for p in self.trainable_parameters():  # a rank without units still takes part, with zeros
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        for bucket in _buckets(grads):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
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
