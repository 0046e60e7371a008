"""The switch of a veRL-style hybrid engine between training and generation (``colocated-engine``).

A hybrid engine keeps two copies of the policy on every rank: the trainer's (sharded or replicated, with its
optimizer state, gradients and — full fine-tuning — fp32 master weights) and the rollout's own generation
copy (full weights in the compute dtype, laid out for inference; with LoRA the base plus the attached
adapter). Between the phases it switches, as veRL's ``ShardingManager`` does around ``generate_sequences``
(``__enter__``: wake the inference engine, load the actor's weights into it, offload the actor;
``__exit__``: put the engine to sleep, load the actor back):

``to_generation``: offload the optimizer state and gradients ─▶ onload the generation copy ─▶ re-shard the
trainer's weights into it (FSDP2: an all-gather of every shard; replicas: a device copy) ─▶ offload the
trainer's weights (full fine-tuning: the masters).

``to_training``: offload the generation copy ─▶ onload the trainer's weights and states.

Each step is timed (device synchronised) and reported to ``on_span(phase, start, end, extra)`` as an
``offload`` / ``onload`` / ``reshard`` span with its bytes, so the switch's cost shows on the timeline and
``experiments/measure.py switch`` (:mod:`digenrl.perf.measure_switch`) measures the same code. Host copies
are pinned where CUDA exists (:mod:`digenrl.systems.residency`, whose parking this reuses). The generation
copy goes to host memory (vLLM's sleep level 1) rather than being discarded: with LoRA only the adapter is
re-sharded, so the base must survive.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch
from torch import nn

from digenrl.runtime.comm.weight_sync import full_tensor, generator_sync_parameters
from digenrl.runtime.observe.span_phases import Phase
from digenrl.systems.residency import (
    WeightTransitions,
    chain_transitions,
    host_transitions,
    module_transitions,
)

SpanFn = Callable[[str, float, float, dict], None]


def pair_parameters(
    trainer_named: Iterable[tuple[str, torch.Tensor]], generation_model: nn.Module, mode: str
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(trainer parameter, generation-copy parameter) for every tensor a re-shard writes, matched by name
    (names relative to the transformer, as the weight sync matches them); a mismatch names the first
    differing tensor."""
    source = sorted(trainer_named, key=lambda item: item[0])
    target = generator_sync_parameters(generation_model, mode)
    names = [n for n, _ in source], [n for n, _ in target]
    if names[0] != names[1]:
        first = next((a, b) for a, b in zip(names[0] + [""], names[1] + [""], strict=False) if a != b)
        raise ValueError(
            f"colocated-engine: the generation copy's {mode} tensors differ from the trainer's "
            f"(first: trainer {first[0]!r}, generation copy {first[1]!r})"
        )
    for (name, p), (_, q) in zip(source, target, strict=True):
        if tuple(p.shape) != tuple(q.shape):  # a DTensor's shape is its full (global) shape
            raise ValueError(
                f"colocated-engine: {name} has shape {tuple(q.shape)} in the generation copy, "
                f"{tuple(p.shape)} in the trainer"
            )
    return [(p, q) for (_, p), (_, q) in zip(source, target, strict=True)]


def reshard(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
    """Copy the trainer's weights into the generation copy (cast to its dtype); returns the bytes written."""
    moved = 0
    with torch.no_grad():
        for p, q in pairs:
            q.copy_(full_tensor(p))
            moved += q.numel() * q.element_size()
    return moved


class EngineSwitch:
    """The trainer-side and generation-side transitions of one rank and the order they run in (module
    docstring). ``offload=False`` (``engine.offload=false``): both copies stay on the device, only the
    re-shard runs. ``full``: full fine-tuning (the trainer's weights move too)."""

    def __init__(
        self,
        *,
        trainer_module: nn.Module,
        trainer_named: list[tuple[str, torch.Tensor]],
        optimizer: torch.optim.Optimizer,
        generation_model: nn.Module,
        device: torch.device,
        mode: str,
        offload: bool,
        on_span: SpanFn,
    ) -> None:
        self.device = torch.device(device)
        self.offload = offload
        self.full = mode == "full"
        self._on_span = on_span
        self._pairs = pair_parameters(trainer_named, generation_model, mode)
        params = [p for _, p in trainer_named]
        if any(hasattr(p, "device_mesh") for p in params):  # FSDP2: DTensor shards, moved as veRL moves them
            self._states = sharded_state_transitions(optimizer, params, self.device)
            self._weights = sharded_module_transitions(trainer_module, self.device) if self.full else None
        else:
            # the optimizer state and the gradients (set to None by the step, so usually nothing) leave first
            self._states = chain_transitions(
                host_transitions(lambda: _optimizer_tensors(optimizer), device, "optimizer state"),
                host_transitions(lambda: [p.grad for p in params if p.grad is not None], device, "gradients"),
            )
            # full fine-tuning: the trainer's weights (the masters) too, after the re-shard has read them
            self._weights = module_transitions(trainer_module, device) if self.full else None
        self._generation = module_transitions(generation_model, device)
        self._generation_on_device = True  # built on the device; parked before the first training phase
        self._trainer_parked = False

    # ------------------------------------------------------------------ the two switches
    def to_generation(self) -> None:
        """Make the generation copy current and bring it onto the device, the trainer's states off it."""
        if self.offload and not self._trainer_parked:
            self._timed(Phase.OFFLOAD, self._states.offload, what="optimizer state and gradients")
        if not self._generation_on_device:
            self._timed(Phase.ONLOAD, self._generation.onload, what="generation copy")
            self._generation_on_device = True
        self._timed(Phase.RESHARD, lambda: reshard(self._pairs), what="trainer weights into generation copy")
        if self.offload and not self._trainer_parked:
            if self._weights is not None:
                self._timed(Phase.OFFLOAD, self._weights.offload, what="trainer weights")
            self._trainer_parked = True

    def to_training(self) -> None:
        """Park the generation copy and bring the trainer's weights and states back."""
        if not self.offload:
            return
        if self._generation_on_device:
            self._timed(Phase.OFFLOAD, self._generation.offload, what="generation copy")
            self._generation_on_device = False
        if self._trainer_parked:
            if self._weights is not None:
                self._timed(Phase.ONLOAD, self._weights.onload, what="trainer weights")
            self._timed(Phase.ONLOAD, self._states.onload, what="optimizer state and gradients")
            self._trainer_parked = False

    def _timed(self, phase: str, fn: Callable[[], int | None], *, what: str) -> None:
        self._sync()
        start = time.perf_counter()
        moved = fn()
        self._sync()
        self._on_span(phase, start, time.perf_counter(), {"what": what, "bytes": moved})

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _local_bytes(t: torch.Tensor) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def sharded_module_transitions(module: nn.Module, device: torch.device) -> WeightTransitions:
    """(onload, offload) of an FSDP2 module's shards: ``module.to`` (FSDP2's ``_apply`` re-registers the
    sharded parameters afterwards, keeping the optimizer's references valid), as veRL's
    ``offload_fsdp2_model_to_cpu`` / ``load_fsdp2_model_to_gpu`` do. Returns this rank's bytes."""

    def move(where: torch.device) -> int:
        module.to(where)
        return sum(_local_bytes(p) for p in module.parameters())

    return WeightTransitions(lambda: move(device), lambda: move(torch.device("cpu")))


def sharded_state_transitions(
    optimizer: torch.optim.Optimizer, params: list[torch.Tensor], device: torch.device
) -> WeightTransitions:
    """(onload, offload) of an optimizer's DTensor state and any gradients: every state entry replaced by
    its copy on the other side (veRL's ``offload_fsdp_optimizer`` / ``load_fsdp_optimizer``). Returns this
    rank's bytes."""

    def move(where: torch.device) -> int:
        moved = 0
        for state in optimizer.state.values():
            for key, value in list(state.items()):
                if isinstance(value, torch.Tensor) and value.dim() > 0:  # the step count stays put
                    state[key] = value.to(where, non_blocking=True)
                    moved += _local_bytes(value)
        for p in params:
            if p.grad is not None:
                p.grad = p.grad.to(where, non_blocking=True)
                moved += _local_bytes(p.grad)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return moved

    return WeightTransitions(lambda: move(device), lambda: move(torch.device("cpu")))


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    inner = getattr(optimizer, "optimizer", None)  # DeepSpeed wraps the torch optimizer
    opt = inner if not isinstance(optimizer, torch.optim.Optimizer) and inner is not None else optimizer
    return [v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
