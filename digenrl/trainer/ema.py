"""An exponential moving average (EMA) of the trainable weights (``trainer.ema_decay`` > 0).

The arithmetic is diffusers' ``EMAModel`` (diffusers/training_utils.py), used as is: after committed
optimizer step n, ``ema ← ema − (1 − d_n)·(ema − θ_n)`` with ``d_n = min(ema_decay, n / (9 + n))`` and
``d_1 = 0`` (the first update copies θ). flow_grpo's ``EMAModuleWrapper`` (flow_grpo/ema.py, used by its
scripts/train_sd3.py with ``train.ema``) has the same warm-up ``min(decay, (1 + k) / (10 + k))``, counted
from k = 0. This module adds what EMAModel leaves to its caller:

* layout: the averaged ("shadow") tensors are clones of the trainable parameters as the backend holds
  them (digenrl/trainer/parallel/). Under FSDP2 they are DTensors sharded like the weights, so every rank
  averages its own shard without communication; under DDP and DeepSpeed ZeRO ≤ 2 they are full replicas
  that every rank updates alike from identical weights. They are kept in fp32 whatever the parameters'
  dtype (a bf16 average loses the small updates it exists to accumulate). ZeRO-3 partitions parameters in
  DeepSpeed's own layout and is refused at startup (digenrl/validation.py).
* checkpoints keyed by parameter name, in both formats (full tensors in ``trainer.pt``, or shards in the
  sharded format's DCP directory), with the update count that drives the warm-up: a resumed run's EMA
  equals the uninterrupted run's bit for bit, under any process layout (digenrl/trainer/checkpoint.py);
* :meth:`TrainerEMA.swapped_in`: the EMA as the live weights for a block (evaluation, export), the trained
  weights restored bit for bit after it (EMAModel's ``store`` / ``copy_to`` / ``restore``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from digenrl.trainer.parallel import ParallelBackend


class TrainerEMA:
    """The EMA of ``backend``'s trainable parameters; :meth:`update` after every committed optimizer step."""

    def __init__(self, backend: ParallelBackend, decay: float) -> None:
        from diffusers.training_utils import EMAModel

        if not 0.0 < decay < 1.0:
            raise ValueError(f"trainer.ema_decay must lie in (0, 1) for an EMA, got {decay}")
        if backend.name == "deepspeed" and getattr(backend, "stage", 0) == 3:
            raise ValueError(
                "trainer.ema_decay > 0 cannot average ZeRO-3's partitioned parameters; use "
                "trainer.deepspeed_stage <= 2 or trainer.backend=fsdp2"
            )
        self.backend = backend
        self.names = [name for name, _ in backend.named_trainable()]
        self._ema = EMAModel(backend.trainable_parameters(), decay=decay)
        self._ema.to(dtype=torch.float32)

    @property
    def decay(self) -> float:
        return float(self._ema.decay)

    @property
    def updates(self) -> int:
        """Committed optimizer steps averaged so far (drives the warm-up of the decay)."""
        return int(self._ema.optimization_step)

    def update(self) -> None:
        """Fold the current trainable weights in (after a committed optimizer step; no communication)."""
        self._ema.step(self.backend.trainable_parameters())

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Inside the block the trainable parameters hold the EMA (cast to their dtype); after it, the
        weights they held before, bit for bit. Gradients and optimizer state are not touched."""
        params = self.backend.trainable_parameters()
        self._ema.store(params)
        self._ema.copy_to(params)
        try:
            yield
        finally:
            self._ema.restore(params)

    # ------------------------------------------------------------------ state
    def meta(self) -> dict[str, Any]:
        """The small part of the state: the decay and the update count."""
        return {"decay": self.decay, "updates": self.updates}

    def shards(self) -> dict[str, torch.Tensor]:
        """The averaged tensors as this rank holds them (DTensor shards under FSDP2), keyed by parameter
        name: what the sharded checkpoint format saves and loads in place."""
        return dict(zip(self.names, self._ema.shadow_params, strict=True))

    def full_state(self, *, all_ranks: bool = False) -> dict[str, Any]:
        """:meth:`meta` plus ``weights``: full fp32 tensors on CPU keyed by parameter name. Collective under
        FSDP2; complete on the trainer group's first rank (on all with ``all_ranks``), ``{}`` elsewhere."""
        keep = all_ranks or self.backend.rank == 0
        weights = {}
        for name, shadow in self.shards().items():
            full = shadow.full_tensor() if hasattr(shadow, "full_tensor") else shadow
            if keep:
                weights[name] = full.to("cpu", copy=True)
        return {**self.meta(), "weights": weights} if keep else {}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`full_state` (``weights`` given: full tensors, each rank takes its part) or, after
        the sharded format's DCP load has filled :meth:`shards` in place, only :meth:`meta`'s update count."""
        weights = state.get("weights")
        if weights is not None:
            missing, unexpected = (
                sorted(set(self.names) - set(weights)),
                sorted(set(weights) - set(self.names)),
            )
            if missing or unexpected:
                raise ValueError(
                    f"EMA state does not match the trained parameters: missing {missing[:8]}, "
                    f"unexpected {unexpected[:8]}"
                )
            with torch.no_grad():
                for name, shadow in self.shards().items():
                    value = weights[name]
                    if tuple(value.shape) != tuple(shadow.shape):
                        raise ValueError(
                            f"EMA state {name!r} has shape {tuple(value.shape)}, model {tuple(shadow.shape)}"
                        )
                    # laid out like the shadow: this rank's slice of a DTensor, locally, no communication
                    src = self.backend.to_param_layout(value.to(torch.float32), shadow)
                    self.backend.local_view(shadow).copy_(self.backend.local_view(src))
        self._ema.optimization_step = int(state["updates"])
