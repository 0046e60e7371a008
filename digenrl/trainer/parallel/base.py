"""The single-process backend (``none``) and what every backend shares: the trainable parameters, the
cross-rank reductions, and the layout-free full state (tensors keyed by parameter name) that checkpoints and
weight sync read and write. Gradient semantics: :mod:`digenrl.trainer.parallel`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from digenrl.config import TRAINER_BACKENDS, TRAINER_MODES

BACKENDS = TRAINER_BACKENDS  # trainer.backend (digenrl/config.py)


def resolve_backend(backend: str, *, world_size: int, mode: str, exact: bool = False) -> str:
    """``auto``: several processes → fsdp2 for full fine-tune (shards weights, grads and Adam state), ddp for
    LoRA (adapter gradients are small; replicas avoid a gather per block per forward). A single trainer
    process runs ``none`` whatever data-parallel backend was asked for (deepspeed excepted), unless
    ``exact`` (benchmarks that compare backends on one GPU: :mod:`digenrl.perf.bench_backends`)."""
    if backend not in BACKENDS:
        raise ValueError(f"trainer.backend={backend!r} is not allowed; choose one of: {', '.join(BACKENDS)}")
    if mode not in TRAINER_MODES:
        raise ValueError(f"trainer.mode={mode!r} is not allowed; choose one of: lora, full")
    if world_size == 1 and backend in ("auto", "ddp", "fsdp2") and not (exact and backend != "auto"):
        return "none"  # one trainer process: nothing to replicate or shard
    if backend == "auto":
        return "fsdp2" if mode == "full" else "ddp"
    if backend == "none" and world_size > 1:
        raise ValueError(
            f"trainer.backend=none is single-process but the trainer group has {world_size} ranks; "
            "use ddp, fsdp2, deepspeed or auto"
        )
    return backend


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank stores (a DTensor's shard, or the tensor itself)."""
    return t.to_local() if hasattr(t, "to_local") else t


class ParallelBackend:
    """A transformer prepared for data-parallel training; single-process behaviour (backend ``none``)."""

    name = "none"
    lockstep = False  # True: every micro-batch forward/backward is a collective over the group
    # True: generating with the trainer's weights (TAG) needs all trainer ranks to gather them together
    joint_generation = False

    @contextlib.contextmanager
    def generation_weights(self) -> Iterator[int]:
        """The full weights for a forward on this rank alone (TAG); yields the bytes gathered for it.
        Replicated backends already hold them: nothing moves."""
        yield 0

    def full_parameter_bytes(self) -> int:
        """Bytes of the unsharded trainable model as a forward sees it (memory accounting for TAG)."""
        return sum(p.numel() * p.element_size() for p in self.module.parameters())

    def __init__(self, flow_model: nn.Module, *, group: Any, world_size: int, device: torch.device) -> None:
        self.flow_model = flow_model
        self.group = group
        self.world_size = world_size
        self.rank = dist.get_rank(group) if world_size > 1 else 0
        self.device = device

    # ---------------------------------------------------------------- parameters
    @property
    def module(self) -> nn.Module:
        return self.flow_model.transformer

    def named_trainable(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for _, p in self.named_trainable()]

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return optimizer

    def local_view(self, p: torch.Tensor) -> torch.Tensor:
        """The part of trainable parameter ``p`` this rank stores (a DTensor's shard, or ``p``)."""
        return _local(p)

    # ---------------------------------------------------------------- collectives
    def _sum_over_ranks(self, value: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            dist.all_reduce(value, op=dist.ReduceOp.SUM, group=self.group)
        return value

    def max_over_ranks(self, value: int) -> int:
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self._comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return int(t.item())

    def _comm_device(self) -> torch.device:
        backend = dist.get_backend(self.group) if self.world_size > 1 else "gloo"
        return self.device if backend == "nccl" else torch.device("cpu")

    # ---------------------------------------------------------------- gradients
    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def finish_gradients(self) -> None:
        """Called once per optimizer step, before clipping: complete the cross-rank reduction."""

    def clip_grad_norm(self, max_norm: float) -> float:
        """Clip to ``max_norm`` (global over ranks and shards); returns the norm before clipping."""
        params = [p for p in self.trainable_parameters() if p.grad is not None]
        if not params:
            return 0.0
        total = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(total, "full_tensor"):
            total = total.full_tensor()
        return float(total)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def global_sq_norm(self, tensors: Iterable[torch.Tensor]) -> float:
        """Σ‖t‖² over the given tensors (local shards), summed over ranks where tensors are sharded."""
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for t in tensors:
            total += self.local_view(t).detach().double().pow(2).sum()
        return float(self._reduce_sharded(total.to(self._comm_device())))

    def _reduce_sharded(self, value: torch.Tensor) -> torch.Tensor:
        return value  # replicated parameters: every rank already holds the full value

    # ---------------------------------------------------------------- state
    def gather_full_state(self, *, all_ranks: bool = False) -> dict[str, torch.Tensor]:
        """Full trainable tensors on CPU keyed by parameter name. With sharding this is a collective;
        ``all_ranks=False`` keeps the result on the group's first rank only (others get ``{}``)."""
        keep = all_ranks or self.rank == 0
        out = {}
        for name, p in self.named_trainable():
            full = p.detach().full_tensor() if hasattr(p, "full_tensor") else p.detach()
            if keep:
                out[name] = full.to("cpu", copy=True)
        return out

    def to_param_layout(self, full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        """A full tensor laid out like ``param`` (sliced to this rank's shard for a DTensor)."""
        full = full.to(device=_local(param).device)
        if hasattr(param, "device_mesh"):
            from torch.distributed.tensor import distribute_tensor

            # every rank holds the full tensor: slice locally, no communication (src_data_rank=None)
            return distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
        return full

    def load_full_state(self, state: dict[str, torch.Tensor]) -> None:
        """Write full tensors keyed by parameter name (:meth:`gather_full_state`'s format, any layout)
        into the trainable parameters; the names must match exactly and each shape its parameter's."""
        named = self.named_trainable()
        expected = {n for n, _ in named}
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        if missing or unexpected:
            raise ValueError(
                "trainable state does not match the model: "
                f"missing {missing[:8]}, unexpected {unexpected[:8]}"
            )
        with torch.no_grad():
            for name, p in named:
                value = state[name]
                if tuple(value.shape) != self.full_shape(p):
                    raise ValueError(
                        f"trainable state {name!r} has shape {tuple(value.shape)}, model {self.full_shape(p)}"
                    )
                self._write_full(p, value)

    def full_shape(self, p: torch.Tensor) -> tuple[int, ...]:
        """The unsharded shape of trainable parameter ``p`` (a DTensor reports its global shape)."""
        return tuple(p.shape)

    def _write_full(self, p: nn.Parameter, value: torch.Tensor) -> None:
        """Copy the full tensor ``value`` into ``p``: this rank's slice of it where ``p`` is sharded."""
        src = self.to_param_layout(value.to(p.dtype), p)
        _local(p).copy_(_local(src))

    def gather_optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Optimizer state with full tensors, keyed by parameter name instead of position (collective when
        sharded); a resume may then use another process layout or another parameter order."""
        names = {id(p): n for n, p in self.named_trainable()}
        sd = optimizer.state_dict()
        ordered = [p for group in optimizer.param_groups for p in group["params"]]
        keep = self.rank == 0
        state: dict[str, dict[str, Any]] = {}
        for index, p in enumerate(ordered):
            entry = {}
            for key, value in sd["state"].get(index, {}).items():
                if isinstance(value, torch.Tensor):
                    value = value.full_tensor() if hasattr(value, "full_tensor") else value
                    value = value.to("cpu", copy=True)
                entry[key] = value
            if keep and entry:
                state[names[id(p)]] = entry
        groups = []
        for group, group_sd in zip(optimizer.param_groups, sd["param_groups"], strict=True):
            hyper = {k: v for k, v in group_sd.items() if k != "params"}
            groups.append({**hyper, "params": [names[id(p)] for p in group["params"]]})
        return {"state": state, "param_groups": groups} if keep else {}

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        named = dict(self.named_trainable())
        ordered = [p for group in optimizer.param_groups for p in group["params"]]
        index_of = {id(p): i for i, p in enumerate(ordered)}
        if len(state["param_groups"]) != len(optimizer.param_groups):
            raise ValueError(
                f"optimizer state has {len(state['param_groups'])} param groups, optimizer "
                f"{len(optimizer.param_groups)}"
            )
        name_of = {id(p): n for n, p in named.items()}
        groups = []
        for saved, group in zip(state["param_groups"], optimizer.param_groups, strict=True):
            if sorted(saved["params"]) != sorted(name_of[id(p)] for p in group["params"]):
                raise ValueError("optimizer state names other parameters than this trainer trains")
            groups.append({**saved, "params": [index_of[id(named[n])] for n in saved["params"]]})
        per_index: dict[int, dict[str, Any]] = {}
        for name, entry in state["state"].items():
            p = named[name]
            per_index[index_of[id(p)]] = {
                k: self.to_param_layout(v, p) if isinstance(v, torch.Tensor) and v.shape == p.shape else v
                for k, v in entry.items()
            }
        optimizer.load_state_dict({"state": per_index, "param_groups": groups})


def broadcast_module(module: nn.Module, group: Any) -> None:
    """Make every rank start from the first rank's weights (what DDP does at construction)."""
    src = dist.get_global_rank(group, 0)
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src=src, group=group)
