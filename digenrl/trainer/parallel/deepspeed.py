"""``deepspeed``: a ZeRO stage 0-3 engine (DeepSpeed is imported lazily: an optional extra)."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from digenrl.config import DEEPSPEED_STAGES
from digenrl.trainer.parallel.base import ParallelBackend


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

    def full_shape(self, p: torch.Tensor) -> tuple[int, ...]:
        """The unpartitioned shape (ZeRO-3 keeps it in ``ds_shape``; the parameter itself is empty)."""
        return tuple(p.ds_shape) if hasattr(p, "ds_shape") else tuple(p.shape)

    def _write_full(self, p: nn.Parameter, value: torch.Tensor) -> None:
        """Write the (gathered, under stage 3) parameter and the ZeRO optimizer's fp32 master copy."""
        from deepspeed.utils import safe_set_full_fp32_param

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
