"""``fsdp2``: ``fully_shard`` per transformer block, then the root (torch.distributed.fsdp).

``trainer.sharding=flat`` shards over the whole trainer group. ``hybrid`` (HSDP) shards over the trainer
ranks of this rank's node and keeps one replica per node
(:class:`~digenrl.runtime.comm.shard_groups.ShardGroups`): every micro-batch's all-gathers and reduce-scatter
stay inside the node, and the gradient shard is summed over its replicas once per optimizer step, in
:meth:`FSDP2Backend.finish_gradients`, as the simulator prices it (digenrl/sim/training.py ``optimizer_s``).
FSDP2's own 2-D-mesh HSDP all-reduces across replicas in every backward unless the caller marks all but the
step's last backward (``set_requires_all_reduce(False)``), and the accumulation here cannot know the last one
ahead: fragments train as they arrive (GAP) and each rank pads to the longest rank's micro-batches. So the
weights are sharded on the node's mesh and the cross-node sum is this module's, as DDP's is
(:func:`~digenrl.trainer.parallel.ddp.all_reduce_gradients`). After it every replica holds the same gradient
shard: clipping's norm over the node's shards is the global norm, the optimizer steps alike everywhere, and a
sharded checkpoint (DCP) writes each shard once (its planner de-duplicates the replicas' identical chunks) and
loads into any layout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from digenrl.runtime.comm.distributed import named_collective
from digenrl.trainer.parallel.base import ParallelBackend, broadcast_module
from digenrl.trainer.parallel.ddp import all_reduce_gradients

if TYPE_CHECKING:
    from digenrl.runtime.comm.shard_groups import ShardGroups


class FSDP2Backend(ParallelBackend):
    """``fully_shard`` per transformer block, then the root (FSDP2, torch.distributed.fsdp); with
    ``shard_groups`` (``trainer.sharding=hybrid``) inside the node, replicated across nodes (module doc)."""

    name = "fsdp2"
    lockstep = True

    def __init__(
        self, flow_model: nn.Module, *, mode: str, shard_groups: ShardGroups | None = None, **kwargs: Any
    ) -> None:
        super().__init__(flow_model, **kwargs)
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

        group = self.group if self.group is not None else dist.group.WORLD
        broadcast_module(self.module, group)  # every replica starts from the same weights
        self.shard_groups = shard_groups
        mesh = DeviceMesh.from_group(group if shard_groups is None else shard_groups.shard, self.device.type)
        model_dtype = next(self.module.parameters()).dtype
        mp = MixedPrecisionPolicy()
        self._param_dtype: torch.dtype | None = None
        if self.device.type == "cuda" and model_dtype == torch.bfloat16:
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            self._param_dtype = torch.bfloat16
            if mode == "full":
                # fp32 master weights (sharded); compute still runs in bf16 through the policy
                for p in self.module.parameters():
                    p.data = p.data.float()
        for block in reversed(_repeated_blocks(self.module)):
            fully_shard(block, mesh=mesh, mp_policy=mp)
        fully_shard(self.module, mesh=mesh, mp_policy=mp)
        for m in self.module.modules():
            if isinstance(m, FSDPModule):
                m.set_gradient_divide_factor(1.0)
                if hasattr(m, "set_force_sum_reduction_for_comms"):  # torch >= 2.9; gloo needs it
                    m.set_force_sum_reduction_for_comms(True)

    def finish_gradients(self) -> None:
        """Hybrid sharding: sum each gradient shard over its replicas on the other nodes (once per step)."""
        if self.shard_groups is not None:
            groups = self.shard_groups
            what = f"rank {dist.get_rank()}: the gradient all-reduce over replicas {groups.replica_ranks}"
            with named_collective(what):
                all_reduce_gradients(self.trainable_parameters(), groups.replica, self.local_view)

    def _reduce_sharded(self, value: torch.Tensor) -> torch.Tensor:
        if self.shard_groups is None:
            return self._sum_over_ranks(value)
        dist.all_reduce(value, op=dist.ReduceOp.SUM, group=self.shard_groups.shard)  # one node's shards
        return value

    joint_generation = True

    @contextlib.contextmanager
    def generation_weights(self) -> Iterator[int]:
        """All-gather every block's parameters (a collective: every trainer rank enters together), keep
        them unsharded through forwards — which then need no collective, so each rank can generate on its
        own — and release them after. Gradients live on the sharded parameters and are not touched."""
        from torch.distributed.fsdp import FSDPModule

        modules = [m for m in self.module.modules() if isinstance(m, FSDPModule)]
        for m in modules:
            m.set_reshard_after_forward(False, recurse=False)
        for m in modules:
            m.unshard()
        try:
            yield self.full_parameter_bytes()
        finally:
            for m in modules:
                m.reshard()
                m.set_reshard_after_forward(True, recurse=False)

    def full_parameter_bytes(self) -> int:
        """Unsharded bytes in the forward's dtype (the mixed-precision param dtype when one is set)."""
        total = 0
        for p in self.module.parameters():
            numel = p.numel()  # a DTensor reports the global shape
            dtype = self._param_dtype or p.dtype
            total += numel * torch.empty((), dtype=dtype).element_size()
        return total


def _repeated_blocks(module: nn.Module) -> list[nn.Module]:
    """The transformer blocks to shard one by one, in pre-order: the classes diffusers lists in
    ``_no_split_modules`` (e.g. ``JointTransformerBlock``), else the children of top-level ModuleLists."""
    names = set(getattr(module, "_no_split_modules", None) or ())
    blocks = [m for m in module.modules() if m is not module and type(m).__name__ in names]
    if not blocks:
        blocks = [b for child in module.children() if isinstance(child, nn.ModuleList) for b in child]
    return blocks
