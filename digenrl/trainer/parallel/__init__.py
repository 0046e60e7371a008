"""Data parallelism over the trainer ranks: none | ddp | fsdp2 | deepspeed, behind one small interface.

One module per backend: ``base`` (the interface, backend ``none`` and the layout-free state every backend
reads and writes), ``ddp``, ``fsdp2``, ``deepspeed``; :func:`wrap_for_training` picks one.

Gradient semantics (all backends). The trainer backpropagates ``loss_sum · unit_weight`` per micro-batch,
where ``unit_weight = 1 / (units of the logical batch over all ranks)``. Each rank therefore holds the
*sum* over its units of ∇loss_u / N; the cross-rank reduction must be a **sum** (not the usual average) for
the result to be ∇ of the global mean loss, independent of how units are split over micro-batches, GAP
fragments and ranks. Every backend here reduces with SUM:

* ``ddp``: gradients accumulate locally during all micro-batches and fragments; :meth:`finish_gradients`
  all-reduces them (SUM) once, right before clipping. This is exactly what ``DistributedDataParallel``
  does under ``no_sync()`` followed by one synchronised backward, but it does not require every rank to run
  the same number of backwards: with GAP/TSP, ranks receive uneven shares of a fragment's units. Parameters
  and buffers are broadcast from the group's first rank at wrap time, as DDP does at construction.
* ``fsdp2``: ``fully_shard`` per transformer block, then the root, on a ``DeviceMesh`` made from the trainer
  group. Gradients are reduce-scattered every backward with the divide factor set to 1 on *every*
  ``FSDPModule`` (the setting does not recurse; on the root alone the blocks keep averaging — checked on
  torch 2.13) and ``set_force_sum_reduction_for_comms`` (gloo has no PREMUL_SUM). Forward and backward are
  collectives, so ranks must run equally many micro-batches: :attr:`ParallelBackend.lockstep` tells the
  trainer to pad with zero-weight micro-batches.
  ``trainer.sharding=hybrid`` (HSDP) shards on the node's ranks only and sums each gradient shard over its
  replicas on the other nodes once per step, in :meth:`finish_gradients` (digenrl/trainer/parallel/fsdp2.py).
* ``deepspeed``: ZeRO stage 0–3 engine (imported lazily). DeepSpeed averages over the data-parallel world,
  so the loss is multiplied by the world size. Stage ≥ 2 reduce-scatters every backward and stage 3
  all-gathers every forward: lockstep, like FSDP2. Runs on CPU with gloo (DeepSpeed's CPU accelerator) in
  the tests, on CUDA with NCCL.

``trainable state`` helpers gather full (unsharded) tensors keyed by the transformer's parameter names, so
checkpoints and weight sync do not depend on the process layout that wrote them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from digenrl.trainer.parallel.base import BACKENDS, ParallelBackend, resolve_backend
from digenrl.trainer.parallel.ddp import DDPBackend
from digenrl.trainer.parallel.deepspeed import DeepSpeedBackend, import_deepspeed, init_one_rank_group
from digenrl.trainer.parallel.fsdp2 import FSDP2Backend

if TYPE_CHECKING:
    from digenrl.runtime.comm.shard_groups import ShardGroups

__all__ = [
    "BACKENDS",
    "DDPBackend",
    "DeepSpeedBackend",
    "FSDP2Backend",
    "ParallelBackend",
    "import_deepspeed",
    "init_one_rank_group",
    "resolve_backend",
    "wrap_for_training",
]


def wrap_for_training(
    flow_model: nn.Module,
    backend: str,
    *,
    process_group: Any = None,
    device: torch.device | str,
    mode: str,
    deepspeed_stage: int = 2,
    grad_clip: float = 1.0,
    activation_checkpointing: bool = False,
    exact_backend: bool = False,
    shard_groups: ShardGroups | None = None,
) -> ParallelBackend:
    """Prepare ``flow_model.transformer`` (already LoRA-injected or unfrozen) for the given backend.

    ``process_group``: the trainer ranks (``None`` = the default group when torch.distributed is up, else a
    single process). The transformer is modified in place (FSDP2 swaps its parameters for DTensors) and
    keeps its class, so ``flow_model.forward`` and :func:`~digenrl.trainer.lora.reference_policy` still work.
    ``exact_backend``: run ``backend`` as named even in one process (see :func:`resolve_backend`).
    ``shard_groups``: ``trainer.sharding=hybrid``'s groups
    (:func:`digenrl.runtime.comm.shard_groups.build_shard_groups`): FSDP2 shards inside the node and
    replicates across nodes.
    """
    device = torch.device(device)
    world_size = dist.get_world_size(process_group) if dist.is_available() and dist.is_initialized() else 1
    name = resolve_backend(backend, world_size=world_size, mode=mode, exact=exact_backend)
    if activation_checkpointing:
        flow_model.transformer.enable_gradient_checkpointing()
    flow_model.to(device)
    if shard_groups is not None and name != "fsdp2":
        raise ValueError(
            f"trainer.sharding=hybrid is FSDP2's, but trainer.backend={backend} resolved to {name}; "
            "set trainer.backend=fsdp2 (or auto), or trainer.sharding=flat"
        )
    common = {"group": process_group, "world_size": world_size, "device": device}
    if name == "none":
        return ParallelBackend(flow_model, **common)
    if name == "ddp":
        return DDPBackend(flow_model, **common)
    if name == "fsdp2":
        return FSDP2Backend(flow_model, mode=mode, shard_groups=shard_groups, **common)
    import_deepspeed(torch.device(device))  # fail at startup, not at the first step
    return DeepSpeedBackend(flow_model, stage=deepspeed_stage, grad_clip=grad_clip, **common)
