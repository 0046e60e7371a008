"""Ship a :class:`~digenrl.data.trajectory.TrajectoryBatch` point-to-point (generator → trainer).

Control plane / data plane split (docs/design.md §2): the sender publishes the batch's metadata — field names,
shapes, dtypes, the prompt strings, the iteration, the text-condition layout — as JSON under a store key;
the receiver waits for that key with :meth:`ControlPlane.wait_for` (so a dead or late sender is reported
with the waiting rank, the key and the peer after ``timeout_s``, never as a hang), allocates every tensor,
and the tensors themselves move with ``dist.batch_isend_irecv`` in one fixed field order. Each tensor
travels as its raw bytes (a ``uint8`` view), so every dtype — bool masks, bf16 — crosses any backend;
empty tensors are not sent at all.

Backends: gloo moves CPU tensors, NCCL CUDA tensors only. :func:`send_trajectories` moves the batch to the
group's device (CPU for gloo, the current CUDA device for NCCL; a no-op if it is already there) and
:func:`recv_trajectories` delivers on ``device``, which must be CUDA with NCCL. Under gloo both sides stage
through host memory (:func:`stage_to_host`, :func:`host_buffers`), pinned when the batch lives on a GPU:
gloo's send/recv of a CUDA tensor fails ("writev ... Bad address"), so in shared-device mode
(docs/operations.md, "Shared-device mode") a GPU fragment crosses as GPU → pinned host → gloo → pinned host
→ GPU. CPU runs take the same path with ordinary host memory. Once the metadata has arrived, the tensor
receives are bounded by the process group's timeout (gloo raises; NCCL aborts unless
``TORCH_NCCL_BLOCKING_WAIT=1``).

Blocking and buffered sends: :func:`send_trajectories` returns when the receiver has taken every tensor
(a rendezvous). :func:`start_send` returns at once with a :class:`PendingSend` whose tensors stay referenced
until :meth:`PendingSend.done` — the sender goes on working while the receiver is busy (a TSP stage hands a
fragment on and starts the next; a generator keeps generating while the trainer is in a weight sync). The
metadata also carries the sender's rank and free-form ``tags`` (fragment index, policy version, …), so a
receiver that does not know who produced a fragment (``src=None``, dynamic claiming) learns it there.

Ordering: P2P messages between two ranks match in issue order (NCCL has no tags), so receives from one
sender must follow that sender's send order. Each transfer draws a per-(sender, receiver) ticket on both
sides and the receiver fails with a clear error if the orders differ, instead of silently reading one
fragment's bytes as another's. Keys must be unique per transfer (e.g. a ``ControlPlane.scoped`` view per
iteration and the fragment index in the key); both sides must use the same plane scope.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.distributed as dist

from digenrl.data.dtypes import DTYPES_BY_NAME, dtype_name
from digenrl.data.text_condition import TextCondition
from digenrl.data.trajectory import TrajectoryBatch
from digenrl.runtime.comm.control_plane import ControlPlane

#: Version of the metadata layout; a receiver refuses metadata of another format.
TRANSFER_FORMAT = 1
_COND_PREFIX = "cond."
_SCALAR_FIELDS = ("prompts", "iteration", "steps_done")


@dataclass(frozen=True)
class TransferStats:
    """One transfer as this rank saw it: payload ``bytes`` and ``tensors``, ``seconds`` moving tensors
    (after the metadata was known), on the receiver ``wait_seconds`` spent waiting for the metadata, the
    sender's rank ``src`` and the ``tags`` it attached."""

    bytes: int
    seconds: float
    tensors: int
    wait_seconds: float = 0.0
    src: int = -1
    tags: dict[str, Any] = field(default_factory=dict)


class PendingSend:
    """A buffered send in flight: its tensors stay alive until the receiver has taken them.

    Completion is read from the store, not from the send's ``Work``: gloo marks a send complete only once
    the sender calls ``wait()``, so polling ``is_completed()`` would never see it. The receiver sets
    ``<key>/taken`` after its receives have finished (:func:`recv_trajectories`); once it exists the bytes
    are across, ``wait()`` returns at once, and the sender removes the acknowledgement.
    """

    def __init__(
        self,
        works: list[Any],
        tensors: list[torch.Tensor],
        nbytes: int,
        dst: int,
        key: str,
        plane: ControlPlane,
    ) -> None:
        self._works = works
        self._tensors = tensors
        self.messages = len(works)
        self.bytes = nbytes
        self.dst = dst
        self.key = key
        self._plane = plane
        self._start = time.perf_counter()
        self._done = False

    def done(self) -> bool:
        """Whether the receiver has taken every tensor (never blocks); frees the buffers once true."""
        if not self._done and self._plane.exists(taken_key(self.key)):
            self._finish()
        return self._done

    def wait(self, timeout_s: float | None = None) -> TransferStats:
        """Block until the receiver has taken everything (bounded by ``timeout_s``, default the plane's)."""
        if not self._done:
            self._plane.wait_until(
                lambda: True if self._plane.exists(taken_key(self.key)) else None,
                key=taken_key(self.key),
                peer=self.dst,
                what=f"rank {self.dst} to take trajectory fragment '{self.key}'",
                timeout_s=timeout_s,
            )
            self._finish()
        return TransferStats(self.bytes, time.perf_counter() - self._start, self.messages)

    def _finish(self) -> None:
        self._plane.delete(taken_key(self.key))
        for w in self._works:
            w.wait()  # the receiver has the bytes: returns at once, surfacing any transport error
        self._works, self._tensors, self._done = [], [], True


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
        dtype = dtype_name(t.dtype)
        if dtype not in DTYPES_BY_NAME:
            raise ValueError(f"field {name!r} has dtype {t.dtype}; transferable: {sorted(DTYPES_BY_NAME)}")
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
    if name not in DTYPES_BY_NAME:
        raise ValueError(f"field {field!r} has dtype {name!r}; transferable: {sorted(DTYPES_BY_NAME)}")
    return DTYPES_BY_NAME[name]


# ----------------------------------------------------------------------------- point-to-point


def start_send(
    batch: TrajectoryBatch,
    dst: int,
    *,
    plane: ControlPlane,
    key: str,
    group: Any = None,
    tags: dict[str, Any] | None = None,
) -> PendingSend:
    """Publish ``batch``'s metadata (with this rank and ``tags``) under ``key`` and post its tensors to
    global rank ``dst`` without waiting for the receiver (see the module docstring)."""
    _check_rank("dst", dst)
    device = _comm_device(group)
    meta, tensors = batch_to_tensors(batch)
    tensors = stage_to_host(tensors) if device.type == "cpu" else [t.to(device) for t in tensors]
    meta["sequence"] = plane.ticket(f"p2p-send/{plane.rank}->{dst}")
    meta["src"] = plane.rank
    meta["tags"] = dict(tags or {})
    plane.publish(key, json.dumps(meta))
    ops = [dist.P2POp(dist.isend, _as_bytes(t), dst, group) for t in tensors if t.numel() > 0]
    works = list(dist.batch_isend_irecv(ops)) if ops else []
    return PendingSend(works, tensors, sum(_nbytes(t) for t in tensors), dst, key, plane)


def taken_key(key: str) -> str:
    """The receiver's acknowledgement of the transfer under ``key``."""
    return f"{key}/taken"


def drain_sends(
    pending: list[PendingSend],
    plane: ControlPlane,
    *,
    keep: int = 0,
    what: str,
    timeout_s: float | None = None,
    idle: Callable[[], bool] | None = None,
) -> list[PendingSend]:
    """Wait until at most ``keep`` of ``pending`` are still in flight (oldest first) and return those.

    The wait polls instead of blocking in ``work.wait()``, so ``idle`` keeps running (a generator joins a
    weight sync the receiver is blocked in) and a failing peer or the timeout surfaces with a message
    naming ``what`` and the receiver.
    """
    pending = [p for p in pending if not p.done()]
    while len(pending) > keep:
        oldest = pending[0]
        plane.wait_until(
            lambda oldest=oldest: True if oldest.done() else None,
            key=oldest.key,
            peer=oldest.dst,
            what=what,
            timeout_s=timeout_s,
            idle=idle,
        )
        pending = [p for p in pending if not p.done()]
    return pending


def send_trajectories(
    batch: TrajectoryBatch,
    dst: int,
    *,
    plane: ControlPlane,
    key: str,
    group: Any = None,
    tags: dict[str, Any] | None = None,
) -> TransferStats:
    """Publish ``batch``'s metadata under ``key`` and send its tensors to global rank ``dst``.

    Returns when every send has completed (the receiver has posted matching receives).
    """
    pending = start_send(batch, dst, plane=plane, key=key, group=group, tags=tags)
    device = _comm_device(group)
    start = _now(device)
    pending.wait()
    seconds = _now(device) - start
    return TransferStats(pending.bytes, seconds, pending.messages)


def next_sequence(plane: ControlPlane, src: int) -> int:
    """The sequence number this rank's next receive from ``src`` must carry (see "Ordering")."""
    return plane.peek_ticket(f"p2p-recv/{src}->{plane.rank}")


def published_metadata(plane: ControlPlane, key: str) -> dict[str, Any] | None:
    """The metadata a sender published under ``key`` (never blocks; only the receiver deletes it)."""
    raw = plane.try_get(key)
    return None if raw is None else json.loads(raw)


def recv_trajectories(
    src: int | None,
    *,
    plane: ControlPlane,
    key: str,
    device: torch.device | str,
    group: Any = None,
    timeout_s: float | None = None,
    peer: int | str | None = None,
    idle: Callable[[], bool] | None = None,
) -> tuple[TrajectoryBatch, TransferStats]:
    """Wait for the metadata published under ``key``, then receive the batch onto ``device``.

    ``src``: the sending global rank, or None when any rank may have produced it (the metadata names the
    sender; ``peer`` then describes the expected producers in the timeout message). Raises
    ``DistributedTimeoutError`` (naming this rank, ``key`` and the peer) if the metadata does not appear
    within ``timeout_s`` (None: the plane's default), or ``PeerFailureError`` if a rank reported a
    failure meanwhile. ``idle``: see :meth:`ControlPlane.wait_for`. Once the tensors are in, the metadata
    key is deleted (the store does not grow with the run) and ``<key>/taken`` tells the sender.
    """
    if src is not None:
        _check_rank("src", src)
    device = torch.device(device)
    if _backend(group) == "nccl" and device.type != "cuda":
        raise ValueError(f"NCCL receives into CUDA tensors only; device={device} is not CUDA")
    begin = time.perf_counter()
    waited_for = src if src is not None else (peer if peer is not None else "any producer")
    raw = plane.wait_for(
        key, peer=waited_for, what=f"trajectory fragment '{key}'", timeout_s=timeout_s, idle=idle
    )
    wait_seconds = time.perf_counter() - begin
    meta = json.loads(raw)
    sender = int(meta["src"])
    if src is not None and sender != src:
        raise RuntimeError(f"rank {plane.rank}: '{key}' was sent by rank {sender}, expected rank {src}")
    expected = plane.ticket(f"p2p-recv/{sender}->{plane.rank}")
    if meta.get("sequence") != expected:
        raise RuntimeError(
            f"rank {plane.rank}: trajectory fragment '{key}' was transfer #{meta.get('sequence')} from "
            f"rank {sender} but is received as #{expected}; receives from one sender must follow its send "
            "order"
        )
    specs = [(entry["shape"], _dtype(entry["dtype"], entry["name"])) for entry in meta["fields"]]
    staged = _comm_device(group).type == "cpu"  # gloo: receive on the host, then move (module docstring)
    if staged:
        tensors = host_buffers(specs, pin=device.type == "cuda")
    else:
        tensors = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in specs]
    start = _now(device)
    ops = [dist.P2POp(dist.irecv, _as_bytes(t), sender, group) for t in tensors if t.numel() > 0]
    _wait(ops)
    if staged and device.type != "cpu":
        tensors = [t.to(device, non_blocking=True) for t in tensors]
    seconds = _now(device) - start
    plane.delete(key)
    plane.publish(taken_key(key), b"1")  # tells a buffered sender its bytes are across (PendingSend.done)
    batch = batch_from_tensors(meta, tensors)
    stats = TransferStats(
        sum(_nbytes(t) for t in tensors), seconds, len(ops), wait_seconds, sender, dict(meta.get("tags", {}))
    )
    return batch, stats


def stage_to_host(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Host copies of ``tensors`` for a backend that moves host memory only (gloo's send/recv).

    GPU tensors are copied into pinned buffers asynchronously and the copies are waited for once (pinned
    memory lets the copy engine run at full speed and is what ``non_blocking`` needs to be safe); host
    tensors are returned as they are.
    """
    out = []
    on_gpu = False
    for t in tensors:
        if t.device.type == "cpu":
            out.append(t)
            continue
        buffer = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        buffer.copy_(t, non_blocking=True)
        out.append(buffer)
        on_gpu = True
    if on_gpu:
        torch.cuda.synchronize()
    return out


def host_buffers(specs: list[tuple[list[int], torch.dtype]], *, pin: bool) -> list[torch.Tensor]:
    """Empty host tensors of the given shapes and dtypes to receive into; ``pin`` when they go on to a GPU
    (pinned buffers make the host → GPU copy asynchronous and full speed)."""
    return [torch.empty(shape, dtype=dtype, pin_memory=pin) for shape, dtype in specs]


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
