"""Ship a :class:`~digenrl.rollout.trajectory.TrajectoryBatch` point-to-point (generator → trainer).

Control plane / data plane split (DESIGN.md §2): the sender publishes the batch's metadata — field names,
shapes, dtypes, the prompt strings, the iteration, the text-condition layout — as JSON under a store key;
the receiver waits for that key with :meth:`ControlPlane.wait_for` (so a dead or late sender is reported
with the waiting rank, the key and the peer after ``timeout_s``, never as a hang), allocates every tensor,
and the tensors themselves move with ``dist.batch_isend_irecv`` in one fixed field order. Each tensor
travels as its raw bytes (a ``uint8`` view), so every dtype — bool masks, bf16 — crosses any backend;
empty tensors are not sent at all.

Backends: gloo moves CPU tensors, NCCL CUDA tensors only. :func:`send_trajectories` moves the batch to the
group's device (CPU for gloo, the current CUDA device for NCCL; a no-op if it is already there) and
:func:`recv_trajectories` allocates on ``device``, which must be CUDA with NCCL. Once the metadata has
arrived, the tensor receives are bounded by the process group's timeout (gloo raises; NCCL aborts unless
``TORCH_NCCL_BLOCKING_WAIT=1``).

Ordering: P2P messages between two ranks match in issue order (NCCL has no tags), so receives from one
sender must follow that sender's send order. Each transfer draws a per-(sender, receiver) ticket on both
sides and the receiver fails with a clear error if the orders differ, instead of silently reading one
fragment's bytes as another's. Keys must be unique per transfer (e.g. a ``ControlPlane.scoped`` view per
iteration and the fragment index in the key); both sides must use the same plane scope.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.distributed as dist

from digenrl.models.text_condition import TextCondition
from digenrl.rollout.trajectory import TrajectoryBatch
from digenrl.runtime.control_plane import ControlPlane

#: Version of the metadata layout; a receiver refuses metadata of another format.
TRANSFER_FORMAT = 1
_COND_PREFIX = "cond."
_SCALAR_FIELDS = ("prompts", "iteration", "steps_done")
_DTYPE_BY_NAME: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}


@dataclass(frozen=True)
class TransferStats:
    """One transfer as this rank saw it: payload ``bytes`` and ``tensors``, ``seconds`` moving tensors
    (after the metadata was known), and on the receiver ``wait_seconds`` spent waiting for the metadata."""

    bytes: int
    seconds: float
    tensors: int
    wait_seconds: float = 0.0


# ----------------------------------------------------------------------------- (de)serialisation


def batch_to_tensors(batch: TrajectoryBatch) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """Split a batch into JSON-able metadata and its tensors (contiguous, in the order of ``meta["fields"]``).

    Field order = the dataclass field order, with the text condition expanded at its place into
    ``cond.embeds`` / ``cond.pooled`` / ``cond.mask`` (those present). Optional fields that are None
    (``final_latents``, ``rewards``, ``advantages``, ``cond.pooled``, ``cond.mask``) are simply absent.
    """
    entries: list[dict[str, Any]] = []
    tensors: list[torch.Tensor] = []

    def add(name: str, t: torch.Tensor) -> None:
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in _DTYPE_BY_NAME:
            raise ValueError(f"field {name!r} has dtype {t.dtype}; transferable: {sorted(_DTYPE_BY_NAME)}")
        entries.append({"name": name, "shape": list(t.shape), "dtype": dtype})
        tensors.append(t.detach().contiguous())

    for f in fields(batch):
        value = getattr(batch, f.name)
        if f.name in _SCALAR_FIELDS or value is None:
            continue
        if isinstance(value, TextCondition):
            for key, t in value.to_dict().items():
                add(_COND_PREFIX + key, t)
        elif isinstance(value, torch.Tensor):
            add(f.name, value)
        else:
            raise TypeError(
                f"TrajectoryBatch.{f.name} of type {type(value).__name__} has no transfer encoding"
            )
    meta = {
        "format": TRANSFER_FORMAT,
        "iteration": int(batch.iteration),
        "steps_done": int(batch.steps_done),
        "prompts": list(batch.prompts),
        "fields": entries,
    }
    return meta, tensors


def batch_from_tensors(meta: dict[str, Any], tensors: list[torch.Tensor]) -> TrajectoryBatch:
    """Inverse of :func:`batch_to_tensors`; checks every tensor against the metadata."""
    if meta.get("format") != TRANSFER_FORMAT:
        raise ValueError(
            f"trajectory metadata format {meta.get('format')!r}; this reader needs {TRANSFER_FORMAT}"
        )
    entries = meta["fields"]
    if len(entries) != len(tensors):
        raise ValueError(f"metadata lists {len(entries)} tensors but {len(tensors)} were given")
    values: dict[str, Any] = {}
    cond: dict[str, torch.Tensor] = {}
    for entry, t in zip(entries, tensors, strict=True):
        name = entry["name"]
        if list(t.shape) != list(entry["shape"]) or t.dtype != _dtype(entry["dtype"], name):
            raise ValueError(
                f"tensor {name!r} is {t.dtype} {list(t.shape)}, "
                f"metadata says {entry['dtype']} {entry['shape']}"
            )
        if name.startswith(_COND_PREFIX):
            cond[name.removeprefix(_COND_PREFIX)] = t
        else:
            values[name] = t
    known = {f.name for f in fields(TrajectoryBatch)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"metadata names fields {unknown} that TrajectoryBatch does not have")
    return TrajectoryBatch(
        prompts=list(meta["prompts"]),
        iteration=int(meta["iteration"]),
        steps_done=int(meta["steps_done"]),
        cond=TextCondition.from_dict(cond),
        **values,
    )


def _dtype(name: str, field: str) -> torch.dtype:
    if name not in _DTYPE_BY_NAME:
        raise ValueError(f"field {field!r} has dtype {name!r}; transferable: {sorted(_DTYPE_BY_NAME)}")
    return _DTYPE_BY_NAME[name]


# ----------------------------------------------------------------------------- point-to-point


def send_trajectories(
    batch: TrajectoryBatch, dst: int, *, plane: ControlPlane, key: str, group: Any = None
) -> TransferStats:
    """Publish ``batch``'s metadata under ``key`` and send its tensors to global rank ``dst``.

    Returns when every send has completed (the receiver has posted matching receives).
    """
    _check_rank("dst", dst)
    device = _comm_device(group)
    meta, tensors = batch_to_tensors(batch)
    tensors = [t.to(device) for t in tensors]
    meta["sequence"] = plane.ticket(f"p2p-send/{plane.rank}->{dst}")
    plane.publish(key, json.dumps(meta))
    start = _now(device)
    ops = [dist.P2POp(dist.isend, _as_bytes(t), dst, group) for t in tensors if t.numel() > 0]
    _wait(ops)
    seconds = _now(device) - start
    return TransferStats(sum(_nbytes(t) for t in tensors), seconds, len(ops))


def recv_trajectories(
    src: int,
    *,
    plane: ControlPlane,
    key: str,
    device: torch.device | str,
    group: Any = None,
    timeout_s: float | None = None,
) -> tuple[TrajectoryBatch, TransferStats]:
    """Wait for the metadata ``src`` publishes under ``key``, then receive the batch onto ``device``.

    Raises ``DistributedTimeoutError`` (naming this rank, ``key`` and ``src``) if the metadata does not
    appear within ``timeout_s`` (None: the plane's default), or ``PeerFailureError`` if a rank reported a
    failure meanwhile.
    """
    _check_rank("src", src)
    device = torch.device(device)
    if _backend(group) == "nccl" and device.type != "cuda":
        raise ValueError(f"NCCL receives into CUDA tensors only; device={device} is not CUDA")
    begin = time.perf_counter()
    raw = plane.wait_for(key, peer=src, what=f"trajectory fragment '{key}'", timeout_s=timeout_s)
    wait_seconds = time.perf_counter() - begin
    meta = json.loads(raw)
    expected = plane.ticket(f"p2p-recv/{src}->{plane.rank}")
    if meta.get("sequence") != expected:
        raise RuntimeError(
            f"rank {plane.rank}: trajectory fragment '{key}' was transfer #{meta.get('sequence')} from "
            f"rank {src} but is received as #{expected}; receives from one sender must follow its send order"
        )
    tensors = [
        torch.empty(entry["shape"], dtype=_dtype(entry["dtype"], entry["name"]), device=device)
        for entry in meta["fields"]
    ]
    start = _now(device)
    ops = [dist.P2POp(dist.irecv, _as_bytes(t), src, group) for t in tensors if t.numel() > 0]
    _wait(ops)
    seconds = _now(device) - start
    batch = batch_from_tensors(meta, tensors)
    return batch, TransferStats(sum(_nbytes(t) for t in tensors), seconds, len(ops), wait_seconds)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's storage as a flat uint8 view (shares memory; receives write through it)."""
    return t.reshape(-1).view(torch.uint8)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _wait(ops: list[dist.P2POp]) -> None:
    if not ops:
        return
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def _backend(group: Any) -> str:
    return str(dist.get_backend(group))


def _comm_device(group: Any) -> torch.device:
    if _backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_rank(name: str, rank: int) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"{name} must be a non-negative global rank, got {rank!r}")


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
