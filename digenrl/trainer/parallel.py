"""Data parallelism over the trainer ranks: none | ddp | fsdp2 | deepspeed, behind one small interface.

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
* ``deepspeed``: ZeRO stage 0–3 engine (imported lazily). DeepSpeed averages over the data-parallel world,
  so the loss is multiplied by the world size. Stage ≥ 2 reduce-scatters every backward and stage 3
  all-gathers every forward: lockstep, like FSDP2. Runs on CPU with gloo (DeepSpeed's CPU accelerator) in
  the tests, on CUDA with NCCL.

``trainable state`` helpers gather full (unsharded) tensors keyed by the transformer's parameter names, so
checkpoints and weight sync do not depend on the process layout that wrote them.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from digenrl.config import DEEPSPEED_STAGES, TRAINER_BACKENDS, TRAINER_MODES

BACKENDS = TRAINER_BACKENDS  # trainer.backend (digenrl/config.py)
_BUCKET_ELEMENTS = 1 << 26  # 64 Mi elements per all-reduce bucket (256 MB in fp32)


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

    def _to_param_layout(self, full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        """A full tensor laid out like ``param`` (sliced to this rank's shard for a DTensor)."""
        full = full.to(device=_local(param).device)
        if hasattr(param, "device_mesh"):
            from torch.distributed.tensor import distribute_tensor

            # every rank holds the full tensor: slice locally, no communication (src_data_rank=None)
            return distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
        return full

    def load_full_state(self, state: dict[str, torch.Tensor]) -> None:
        named = self.named_trainable()
        _check_state_names(named, state)
        with torch.no_grad():
            for name, p in named:
                value = state[name]
                if tuple(value.shape) != tuple(p.shape):
                    raise ValueError(
                        f"trainable state {name!r} has shape {tuple(value.shape)}, model {tuple(p.shape)}"
                    )
                src = self._to_param_layout(value.to(p.dtype), p)
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
                k: self._to_param_layout(v, p) if isinstance(v, torch.Tensor) and v.shape == p.shape else v
                for k, v in entry.items()
            }
        optimizer.load_state_dict({"state": per_index, "param_groups": groups})


class DDPBackend(ParallelBackend):
    """Replicated parameters; gradients all-reduced (SUM) once per optimizer step (see module doc)."""

    name = "ddp"

    def __init__(self, flow_model: nn.Module, **kwargs: Any) -> None:
        super().__init__(flow_model, **kwargs)
        _broadcast_module(self.module, self.group if self.group is not None else dist.group.WORLD)

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


class FSDP2Backend(ParallelBackend):
    """``fully_shard`` per transformer block, then the root (FSDP2, torch.distributed.fsdp)."""

    name = "fsdp2"
    lockstep = True

    def __init__(self, flow_model: nn.Module, *, mode: str, **kwargs: Any) -> None:
        super().__init__(flow_model, **kwargs)
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

        group = self.group if self.group is not None else dist.group.WORLD
        _broadcast_module(self.module, group)
        mesh = DeviceMesh.from_group(group, self.device.type)
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

    def _reduce_sharded(self, value: torch.Tensor) -> torch.Tensor:
        return self._sum_over_ranks(value)

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


class DeepSpeedBackend(ParallelBackend):
    """DeepSpeed ZeRO stage 0–3 over the whole world (DeepSpeed's data-parallel group is the default group).

    The engine runs with ``managed_gradient_accumulation=false`` (DeepSpeed >= 0.19.8): every backward only
    accumulates (stage ≥ 2 reduce-scatter each micro-batch into the rank's partition), and ``engine.step()``
    is the accumulation boundary — it completes the reduction, clips (``gradient_clipping``) and steps. The
    trainer calls the transformer directly, not ``engine(...)``, so the deferred per-forward bookkeeping
    ``engine.forward`` would do (``clear_backward_seen_flag``) runs right after each backward instead.

    Precision: ``bf16``/``fp16`` are on when the *trainable* parameters are 16-bit (full fine-tuning of a
    bf16 model: fp32 master weights and Adam moments live in the ZeRO optimizer); LoRA adapters are fp32
    already and stay so (DeepSpeed's mixed precision would cast them to bf16).

    Stage 3 partitions the parameters: a forward all-gathers each module's parameters through the engine's
    hooks (a collective, like FSDP2: lockstep), so colocated systems generate with the training model as
    they do under FSDP2; TAG, where one trainer rank generates alone, is refused at startup
    (:func:`digenrl.tag.helper.tag_supported`). Full state and optimizer state are read and written
    through DeepSpeed's full-tensor accessors (``safe_get_full_fp32_param`` …): checkpoints keep the
    project's layout-free format (fp32 master weights, Adam moments keyed by parameter name).
    """

    name = "deepspeed"

    def __init__(self, flow_model: nn.Module, *, stage: int, grad_clip: float, **kwargs: Any) -> None:
        super().__init__(flow_model, **kwargs)
        if stage not in DEEPSPEED_STAGES:
            raise ValueError(
                f"trainer.deepspeed_stage={stage} is not supported; choose one of "
                f"{', '.join(map(str, DEEPSPEED_STAGES))}"
            )
        if self.world_size > 1 and self.world_size != dist.get_world_size():
            raise ValueError(
                "trainer.backend=deepspeed needs every rank to train (DeepSpeed's data-parallel group is the "
                "default group); use fsdp2 or ddp for separate generator/trainer pools"
            )
        self.stage = stage
        self.lockstep = stage >= 2
        self.grad_clip = grad_clip
        self.engine: Any = None
        self.last_grad_norm = float("nan")
        self._deepspeed = import_deepspeed(self.device)
        init_one_rank_group(self.device)  # a single-process run has no process group; the engine needs one

    def _engine_config(self) -> dict[str, Any]:
        trainable = self.trainable_parameters()
        dtype = trainable[0].dtype if trainable else torch.float32
        return {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "managed_gradient_accumulation": False,  # engine.step() is the boundary (class docstring)
            "zero_optimization": {"stage": self.stage},
            "zero_allow_untested_optimizer": True,
            "gradient_clipping": self.grad_clip,
            "bf16": {"enabled": dtype == torch.bfloat16},
            "fp16": {"enabled": dtype == torch.float16},
            "steps_per_print": 1 << 30,
            "wall_clock_breakdown": False,
        }

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        self.engine, ds_optimizer, _, _ = self._deepspeed.initialize(
            model=self.module, optimizer=optimizer, config=self._engine_config(), dist_init_required=False
        )
        return ds_optimizer

    def backward(self, loss: torch.Tensor) -> None:
        # DeepSpeed averages over the data-parallel world; scale so that the reduction is a sum
        self.engine.backward(loss * self.world_size, scale_wrt_gas=False)
        clear = getattr(self.engine.optimizer, "clear_backward_seen_flag", None)
        if clear is not None:
            clear()

    def clip_grad_norm(self, max_norm: float) -> float:
        return float("nan")  # clipped inside engine.step(); read back in optimizer_step

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        self.last_grad_norm = float(norm) if norm is not None else float("nan")

    # ---------------------------------------------------------------- partitioned parameters (stage 3)
    def local_view(self, p: torch.Tensor) -> torch.Tensor:
        """This rank's part of ``p``: its ZeRO-3 partition (``ds_tensor``), else ``p`` itself."""
        return p.ds_tensor if hasattr(p, "ds_tensor") else p

    def _reduce_sharded(self, value: torch.Tensor) -> torch.Tensor:
        return self._sum_over_ranks(value) if self.stage == 3 else value

    def full_parameter_bytes(self) -> int:
        return sum(_full_numel(p) * p.element_size() for p in self.module.parameters())

    @contextlib.contextmanager
    def _gathered(self, params: list[nn.Parameter], *, modify: bool = False) -> Iterator[None]:
        """Stage 3: the full tensors of ``params`` on every rank (a collective); ``modify``: writes made
        inside are kept (every rank must write the same values). Other stages hold them already."""
        if self.stage != 3:
            yield
            return
        with self._deepspeed.zero.GatheredParameters(params, modifier_rank=0 if modify else None):
            yield

    def gather_full_state(self, *, all_ranks: bool = False) -> dict[str, torch.Tensor]:
        """Full trainable tensors keyed by name: the fp32 master weights where the ZeRO optimizer keeps
        them (16-bit training), else the parameters (a collective under stage ≥ 1)."""
        from deepspeed.utils import safe_get_full_fp32_param

        keep = all_ranks or self.rank == 0
        out = {}
        for name, p in self.named_trainable():
            master = safe_get_full_fp32_param(p)
            if master is None:
                with self._gathered([p]):
                    master = p.detach().clone()
            if keep:
                out[name] = master.to("cpu", copy=True)
        return out

    def load_full_state(self, state: dict[str, torch.Tensor]) -> None:
        from deepspeed.utils import safe_set_full_fp32_param

        named = self.named_trainable()
        _check_state_names(named, state)
        with torch.no_grad():
            for name, p in named:
                value = state[name]
                if tuple(value.shape) != _full_shape(p):
                    raise ValueError(
                        f"trainable state {name!r} has shape {tuple(value.shape)}, model {_full_shape(p)}"
                    )
                with self._gathered([p], modify=True):
                    p.copy_(value.to(device=p.device, dtype=p.dtype))
                safe_set_full_fp32_param(p, value.to(device=self.device, dtype=torch.float32))

    def _create_optimizer_state(self, keys: set[str]) -> None:
        """Give every partition the torch optimizer wraps the state entries it would create at its first
        step (ZeRO-3 creates them lazily), so a checkpoint can be loaded before any step has run."""
        zero = self.engine.optimizer
        inner = getattr(zero, "optimizer", zero)
        # the flat fp32 partitions: ZeRO-3 puts them into the param groups only while it steps
        flats = [p for group in inner.param_groups for p in group["params"]]
        for attr in (
            "fp32_partitioned_groups_flat",
            "single_partition_of_fp32_groups",
            "fp32_groups_flat_partition",
        ):
            flats += list(getattr(zero, attr, None) or [])
        for flat in {id(f): f for f in flats}.values():
            st = inner.state[flat]
            for key in sorted(keys - st.keys()):  # one order on every rank
                st[key] = torch.zeros((), dtype=torch.float32) if key == "step" else torch.zeros_like(flat)
        link = getattr(zero, "_lazy_init_hp_params_optimizer_state", None)  # ZeRO-1/2, bf16: map moments
        if link is not None:
            link()

    def _inner_optimizer_states(self) -> list[dict[str, Any]]:
        inner = getattr(self.engine.optimizer, "optimizer", self.engine.optimizer)
        return list(inner.state.values())

    def gather_optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Adam moments of every trainable parameter as full fp32 tensors keyed by name, in the format of
        :meth:`ParallelBackend.gather_optimizer_state` (so a checkpoint loads under any backend)."""
        from deepspeed.utils import safe_get_full_optimizer_state

        if self.stage == 0 and not hasattr(self.engine.optimizer, "optimizer"):
            return super().gather_optimizer_state(optimizer)  # the client optimizer itself
        states = self._inner_optimizer_states()
        step = states[0].get("step") if states else None
        first = states[0] if states else {}
        # the moments, in one order on every rank: each full-tensor read below is a collective
        keys = sorted(k for k, v in first.items() if isinstance(v, torch.Tensor) and v.dim())
        keep = self.rank == 0
        state: dict[str, dict[str, Any]] = {}
        for name, p in self.named_trainable():
            entry: dict[str, Any] = {"step": step.detach().cpu().clone()} if step is not None else {}
            for key in keys:
                value = safe_get_full_optimizer_state(p, key)
                if value is not None:
                    entry[key] = value.to("cpu", copy=True)
            if keep and entry:
                state[name] = entry
        group = self.engine.optimizer.param_groups[0]
        hyper = {k: v for k, v in group.items() if k != "params"}
        names = [n for n, _ in self.named_trainable()]
        return {"state": state, "param_groups": [{**hyper, "params": names}]} if keep else {}

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        from deepspeed.utils import safe_set_full_optimizer_state

        if self.stage == 0 and not hasattr(self.engine.optimizer, "optimizer"):
            super().load_optimizer_state(optimizer, state)
            return
        named = dict(self.named_trainable())
        saved_names = sorted(n for g in state["param_groups"] for n in g["params"])
        if saved_names != sorted(named):
            raise ValueError("optimizer state names other parameters than this trainer trains")
        self._create_optimizer_state({k for entry in state["state"].values() for k in entry})
        steps = set()
        for name, entry in state["state"].items():
            for key, value in entry.items():
                if key == "step":
                    steps.add(float(value))
                elif isinstance(value, torch.Tensor):
                    safe_set_full_optimizer_state(named[name], value.to(self.device, torch.float32), key)
        if len(steps) > 1:
            raise ValueError(f"optimizer state has several step counts {sorted(steps)}; DeepSpeed keeps one")
        for st in self._inner_optimizer_states():
            if steps and isinstance(st.get("step"), torch.Tensor):
                st["step"].fill_(next(iter(steps)))
        hyper = {k: v for k, v in state["param_groups"][0].items() if k != "params"}
        for group in self.engine.optimizer.param_groups:
            group.update({k: v for k, v in hyper.items() if k in group})


def _full_shape(p: torch.Tensor) -> tuple[int, ...]:
    """The unpartitioned shape (ZeRO-3 keeps it in ``ds_shape``; the parameter itself is empty)."""
    return tuple(p.ds_shape) if hasattr(p, "ds_shape") else tuple(p.shape)


def _check_state_names(named: list[tuple[str, torch.Tensor]], state: dict[str, torch.Tensor]) -> None:
    """A loaded trainable state names exactly the model's trainable parameters (every backend's loader)."""
    expected = {n for n, _ in named}
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(
            f"trainable state does not match the model: missing {missing[:8]}, unexpected {unexpected[:8]}"
        )


def _full_numel(p: torch.Tensor) -> int:
    return p.ds_numel if hasattr(p, "ds_numel") else p.numel()


def init_one_rank_group(device: torch.device) -> None:
    """A one-rank default process group (NCCL on a GPU, gloo on CPU) with the environment DeepSpeed reads,
    for a single process that has none: DeepSpeed's engine always talks through torch.distributed."""
    if dist.is_initialized():
        return
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    for key, value in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(key, value)
    if device.type == "cuda":  # "cuda" without an index means the current device
        torch.cuda.set_device(device.index if device.index is not None else torch.cuda.current_device())
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)


def import_deepspeed(device: torch.device | None = None) -> Any:
    """``deepspeed``, with its accelerator matching the training ``device``.

    DeepSpeed picks one accelerator per process (CUDA whenever a GPU is visible, unless ``DS_ACCELERATOR``
    says otherwise) and moves the engine's model there: a CPU-device run on a GPU machine (the CPU
    profiles, the tests) would silently train on the GPU, or fail with a device mismatch. So a CPU run
    asks for DeepSpeed's CPU accelerator, and a mismatch that can no longer be changed is an error."""
    if device is not None and device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
    except ImportError as exc:
        raise ImportError(
            "trainer.backend=deepspeed needs the 'deepspeed' extra: pip install digenrl[deepspeed]"
        ) from exc
    if device is not None:
        from deepspeed.accelerator import get_accelerator

        chosen = get_accelerator().device_name()
        if chosen != device.type:
            raise RuntimeError(
                f"trainer.backend=deepspeed: DeepSpeed's accelerator is {chosen!r} but this rank trains on "
                f"{device.type!r}; set DS_ACCELERATOR={device.type} before the process starts"
            )
    return deepspeed


def _repeated_blocks(module: nn.Module) -> list[nn.Module]:
    """The transformer blocks to shard one by one, in pre-order: the classes diffusers lists in
    ``_no_split_modules`` (e.g. ``JointTransformerBlock``), else the children of top-level ModuleLists."""
    names = set(getattr(module, "_no_split_modules", None) or ())
    blocks = [m for m in module.modules() if m is not module and type(m).__name__ in names]
    if not blocks:
        blocks = [b for child in module.children() if isinstance(child, nn.ModuleList) for b in child]
    return blocks


def _broadcast_module(module: nn.Module, group: Any) -> None:
    """Make every rank start from the first rank's weights (what DDP does at construction)."""
    src = dist.get_global_rank(group, 0)
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src=src, group=group)


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
) -> ParallelBackend:
    """Prepare ``flow_model.transformer`` (already LoRA-injected or unfrozen) for the given backend.

    ``process_group``: the trainer ranks (``None`` = the default group when torch.distributed is up, else a
    single process). The transformer is modified in place (FSDP2 swaps its parameters for DTensors) and
    keeps its class, so ``flow_model.forward`` and :func:`~digenrl.trainer.lora.reference_policy` still work.
    ``exact_backend``: run ``backend`` as named even in one process (see :func:`resolve_backend`).
    """
    device = torch.device(device)
    world_size = dist.get_world_size(process_group) if dist.is_available() and dist.is_initialized() else 1
    name = resolve_backend(backend, world_size=world_size, mode=mode, exact=exact_backend)
    if activation_checkpointing:
        flow_model.transformer.enable_gradient_checkpointing()
    flow_model.to(device)
    common = {"group": process_group, "world_size": world_size, "device": device}
    if name == "none":
        return ParallelBackend(flow_model, **common)
    if name == "ddp":
        return DDPBackend(flow_model, **common)
    if name == "fsdp2":
        return FSDP2Backend(flow_model, mode=mode, **common)
    import_deepspeed(torch.device(device))  # fail at startup, not at the first step
    return DeepSpeedBackend(flow_model, stage=deepspeed_stage, grad_clip=grad_clip, **common)
