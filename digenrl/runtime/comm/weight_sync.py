"""Trainer → generator weight sync over ``torch.distributed`` (docs/design.md §1 step 5, §2 data plane).

After each optimizer step the trainer pool publishes θ_{k+1} to every generator: the LoRA adapter
(``lora_A`` / ``lora_B`` tensors) in ``lora`` mode, every transformer parameter in ``full`` mode. The
first rank of the trainer pool is the *source*; it broadcasts over ``ProcessGroups.sync_group`` (source +
all generators). Every sync runs, on every member of the sync group, the same sequence of collectives:

1. **Handshake** — one ``all_gather`` of ``[version, digest(names, shapes), digest(dtypes), is_source]``.
   The tensor list is never sent: both sides build it locally from their own module, sorted by name, so
   it is identical by construction; the digest check catches a mismatch (different LoRA rank or targets,
   a generator that was not prepared with :func:`digenrl.trainer.lora.prepare_generator_model`) and then one
   ``all_gather_object`` of the name lists finds the first differing name for the error. The policy
   version travels here too: a generator that expected another version fails hard, and so does every
   other member (they all evaluate the same gathered data, so nobody is left hanging in a broadcast).
   The first handshake also broadcasts the generators' dtypes, which become the *wire* dtypes: the source
   casts to them (e.g. FSDP2's fp32 master weights → the bf16 weights a generator runs with).
2. **Data plane** — tensors, in sorted-name order, are packed into flat buffers of one dtype and at most
   ``sync.bucket_mb`` MB (a larger tensor travels alone), ``dist.broadcast`` from the source, and unpacked
   with ``copy_`` into the generator's parameters. Under gloo the buckets live in host memory (pinned when
   the ranks compute on a GPU, as in shared-device mode, docs/operations.md "Shared-device mode"): the
   source copies its GPU tensors in, the generators copy the staged tensors onto their GPU when the policy
   is applied.
3. **Checksum** (``sync.verify_checksum``) — every generator checksums its parameters *after* the copy, the
   source checksums the buffers it sent, one ``all_gather`` of the per-tensor checksums compares them; a
   mismatch raises :class:`WeightSyncError` on every member, naming the generator rank, the version and
   the first differing tensor.

With a multi-rank trainer pool every trainer rank must call :meth:`WeightSync.push`: FSDP2 shards are
gathered with ``full_tensor()`` (collective over the trainer pool), one parameter at a time in sorted-name
order — the semantics of ``PolicyTrainer.trainable_state_dict(all_ranks=False)`` (complete on the pool's
first rank), streamed bucket by bucket instead of materialising a CPU copy of the whole model. Two
one-int broadcasts over the trainer group tell the other trainer ranks whether the source's handshake and
verification succeeded, so an error surfaces on the whole pool.

Timeouts: every wait here is a collective on the sync or trainer group, bounded by that group's timeout
(``build_process_groups(..., timeout_s)``, default: the default group's ``runtime.timeout_s``). gloo
raises when it expires, and :meth:`WeightSync.push` / :meth:`WeightSync.receive` re-raise its terse error
as a :class:`~digenrl.runtime.comm.errors.DistributedTimeoutError` naming this rank, its role, the version and
the sync group's ranks (a member that never joined, blocked in another wait, is then found from the
others' errors); NCCL's watchdog aborts the process (set ``TORCH_NCCL_BLOCKING_WAIT=1`` to get an
exception instead). Generators must call :meth:`WeightSync.pull` while the source pushes, so the timeout
must exceed the longest fragment a generator finishes before it joins; a generator learns that a push is
pending from the store (:meth:`WeightSync.pending_version`, published by the source before the handshake).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from digenrl.config import TRAINER_MODES
from digenrl.data.dtypes import WIRE_DTYPES
from digenrl.runtime.comm.control_plane import ControlPlane
from digenrl.runtime.comm.distributed import named_collective
from digenrl.runtime.launch.layout import Layout, ProcessGroups

if TYPE_CHECKING:
    from digenrl.config import Config, SyncConfig

SYNC_MODES = TRAINER_MODES  # what a sync publishes: what the trainer trains (sync.mode=auto resolves to it)


class TrainableParameters(Protocol):
    """The trainable parameters of a trainer's parallel backend, by name (FSDP2 shards are DTensors, which
    :meth:`WeightSync.push` gathers)."""

    def named_trainable(self) -> list[tuple[str, nn.Parameter]]: ...


class SyncSource(Protocol):
    """What a sync reads from the trainer (:class:`digenrl.trainer.trainer.PolicyTrainer` is one): no more
    than its backend's trainable parameters, so the runtime does not depend on the trainer's code."""

    @property
    def backend(self) -> TrainableParameters: ...


#: Store name under which the source announces the version it is about to push (``ControlPlane`` versions).
POLICY_VERSION_NAME = "policy"
#: Checksum position weights cycle through 1..251 (251 is prime; a chunk holds a whole number of cycles).
_WEIGHT_PERIOD = 251
_CHECKSUM_CHUNK = _WEIGHT_PERIOD * (1 << 14)  # 16-bit words per chunk: bounds the int64 temporaries (~33 MB)


class WeightSyncError(RuntimeError):
    """A weight sync found inconsistent metadata, versions or checksums; raised on every member."""


@dataclass(frozen=True)
class SyncStats:
    """One sync as this rank saw it. ``bytes``/``buckets`` are 0 on trainer ranks other than the source.

    ``seconds`` covers the whole call (handshake, gather, broadcasts, checksum), measured with
    ``perf_counter`` after a CUDA synchronise; ``verify_seconds`` is the verification part (generators:
    checksum + comparison; source: comparison only, its checksums are computed bucket by bucket).
    ``checksum`` is a 63-bit digest of the per-tensor checksums (None when verification is off or nothing
    was sent).
    """

    version: int
    bytes: int
    seconds: float
    buckets: int
    checksum: int | None
    verify_seconds: float = 0.0


class StagedPolicy:
    """Weights of one policy version received into a staging buffer, not yet applied to a model.

    ``tensors`` are (name, tensor) in the synced order, names relative to ``flow_model.transformer``
    (as :func:`generator_sync_parameters`); ``stats`` describe the receive.
    """

    def __init__(
        self, version: int, mode: str, tensors: list[tuple[str, torch.Tensor]], stats: SyncStats
    ) -> None:
        self.version = version
        self.mode = mode
        self.tensors = tensors
        self.stats = stats

    @torch.no_grad()
    def apply(self, flow_model: nn.Module) -> None:
        """Copy the staged tensors into ``flow_model``'s parameters (exact: same dtypes as the wire)."""
        params = dict(generator_sync_parameters(flow_model, self.mode))
        for name, tensor in self.tensors:
            params[name].copy_(tensor)


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and wire dtype of one synced tensor."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * _element_size(self.dtype)


# ----------------------------------------------------------------------------- model side


def resolve_sync_mode(cfg: Config) -> str:
    """``sync.mode`` with ``auto`` resolved: the adapter when the trainer trains LoRA, else all weights.

    The trainer's trainable state *is* what can be synced, so the mode must match ``trainer.mode``.
    """
    mode = cfg.sync.mode
    if mode == "auto":
        return cfg.trainer.mode
    if mode not in SYNC_MODES:
        raise ValueError(f"sync.mode={mode!r} is not allowed; choose one of: auto, {', '.join(SYNC_MODES)}")
    if mode != cfg.trainer.mode:
        raise ValueError(
            f"sync.mode={mode!r} does not fit trainer.mode={cfg.trainer.mode!r}: the trainer can only "
            "publish what it trains; use sync.mode=auto"
        )
    return mode


def generator_sync_parameters(flow_model: nn.Module, mode: str) -> list[tuple[str, torch.Tensor]]:
    """The generator tensors a sync overwrites, sorted by name (names relative to ``flow_model.transformer``,
    as the trainer's ``backend.named_trainable()``)."""
    _check_mode(mode)
    named = list(flow_model.transformer.named_parameters())
    if mode == "lora":
        named = [(n, p) for n, p in named if "lora_" in n]
        if not named:
            raise ValueError(
                "sync mode 'lora' but the generator's transformer has no LoRA adapter; "
                "call digenrl.trainer.lora.prepare_generator_model(flow_model, cfg) once after building it"
            )
    return sorted(named, key=lambda item: item[0])


# ----------------------------------------------------------------------------- pure helpers


def plan_buckets(specs: Sequence[TensorSpec], bucket_bytes: int) -> list[list[int]]:
    """Consecutive same-dtype runs of ``specs`` of at most ``bucket_bytes`` bytes (indices into ``specs``).

    Order is preserved, so the source gathers sharded tensors in the same order as the other trainer ranks.
    A tensor larger than ``bucket_bytes`` forms a bucket of its own.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    buckets: list[list[int]] = []
    size = 0
    for index, spec in enumerate(specs):
        fresh = (
            not buckets
            or specs[buckets[-1][0]].dtype != spec.dtype
            or (size + spec.nbytes > bucket_bytes and size > 0)
        )
        if fresh:
            buckets.append([])
            size = 0
        buckets[-1].append(index)
        size += spec.nbytes
    return buckets


def tensor_checksum(t: torch.Tensor) -> torch.Tensor:
    """Exact integer checksum ``[S0, S1]`` (int64, on ``t``'s device) of the bytes of ``t``.

    The bytes are read as 16-bit words u_i ∈ [0, 65535]; ``S0 = Σ u_i`` and ``S1 = Σ w_i u_i`` with position
    weights ``w_i = (i mod 251) + 1``. Every term is < 2^24, so the int64 sums are exact (no overflow below
    2^39 words) and independent of reduction order. Any change confined to one word changes S0; a change
    to two adjacent words (any single fp32/int32 value, or one bf16/fp16 value = one word) would need
    Δ_i + Δ_{i+1} = 0 and w_i Δ_i + w_{i+1} Δ_{i+1} = 0, impossible for w_i ≠ w_{i+1} unless both Δ are 0:
    a single changed value of at most 4 bytes is always detected; swapped values are detected unless
    their weights coincide.
    """
    flat = t.detach().contiguous().reshape(-1)
    raw = flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)
    if raw.numel() % 2:
        raw = torch.cat([raw, raw.new_zeros(1)])
    words = raw.view(torch.int16)
    weights = _checksum_weights(words.device)
    s0 = torch.zeros((), dtype=torch.int64, device=words.device)
    s1 = torch.zeros((), dtype=torch.int64, device=words.device)
    for start in range(0, words.numel(), _CHECKSUM_CHUNK):
        chunk = words[start : start + _CHECKSUM_CHUNK].to(torch.int64).bitwise_and_(0xFFFF)
        s0 += chunk.sum()
        s1 += (chunk * weights[: chunk.numel()]).sum()
    return torch.stack([s0, s1])


def checksum_digest(rows: torch.Tensor) -> int:
    """A 63-bit digest of per-tensor checksums ``[n, 2]`` (what :class:`SyncStats` reports)."""
    return _digest_bytes(rows.detach().to("cpu", torch.int64).contiguous().numpy().tobytes())


def manifest_digests(specs: Sequence[TensorSpec]) -> tuple[int, int]:
    """(digest of names and shapes, digest of dtypes): what the handshake compares."""
    shapes = json.dumps([[s.name, list(s.shape)] for s in specs]).encode()
    dtypes = json.dumps([str(s.dtype) for s in specs]).encode()
    return _digest_bytes(shapes), _digest_bytes(dtypes)


def _digest_bytes(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


_WEIGHTS_CACHE: dict[torch.device, torch.Tensor] = {}


def _checksum_weights(device: torch.device) -> torch.Tensor:
    if device not in _WEIGHTS_CACHE:
        _WEIGHTS_CACHE[device] = torch.arange(_CHECKSUM_CHUNK, device=device) % _WEIGHT_PERIOD + 1
    return _WEIGHTS_CACHE[device]


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _check_mode(mode: str) -> None:
    if mode not in SYNC_MODES:
        raise ValueError(f"mode={mode!r} is not allowed; choose one of: {', '.join(SYNC_MODES)}")


def full_tensor(p: torch.Tensor) -> torch.Tensor:
    """The full tensor of a (possibly FSDP2-sharded) parameter; a collective over the trainer pool."""
    return p.detach().full_tensor() if hasattr(p, "full_tensor") else p.detach()


# ----------------------------------------------------------------------------- the sync


class WeightSync:
    """Publishes the trainer's trainable weights to every generator (see the module docstring).

    Args:
        sync_cfg: ``cfg.sync`` (``bucket_mb``, ``verify_checksum``).
        layout, groups: the run's separate layout and this rank's process groups.
        device: this rank's device; with NCCL the flat buffers live there (NCCL moves CUDA tensors only).
        mode: "full" | "lora" (see :func:`resolve_sync_mode`).
        plane: optional control plane; the source announces every push there (``pending_version``).

    ``after_receive_hook`` is a test hook: called on generators with the synced name → tensor list right
    after unpacking, before the checksum (tests corrupt a value there).
    """

    def __init__(
        self,
        sync_cfg: SyncConfig,
        *,
        layout: Layout,
        groups: ProcessGroups,
        device: torch.device | str,
        mode: str,
        plane: ControlPlane | None = None,
    ) -> None:
        _check_mode(mode)
        if layout.is_colocated:
            raise ValueError(
                "a colocated layout needs no weight sync (trainer and generator share the weights); "
                "WeightSync is for separate pools (pools.trainers / pools.generators > 0)"
            )
        if not sync_cfg.bucket_mb > 0:
            raise ValueError(f"sync.bucket_mb must be > 0, got {sync_cfg.bucket_mb}")
        self.cfg = sync_cfg
        self.layout = layout
        self.groups = groups
        self.device = torch.device(device)
        self.mode = mode
        self.plane = plane
        self.rank = groups.rank
        self.role = layout.role_of(self.rank)
        self.source = layout.sync_source
        self.bucket_bytes = max(1, int(sync_cfg.bucket_mb * (1 << 20)))
        self.after_receive_hook: Callable[[list[tuple[str, torch.Tensor]]], None] | None = None
        self._wire_dtypes: list[torch.dtype] | None = None
        self._sync_ranks: list[int] = []
        self._pin = False
        if self.rank in layout.sync_ranks:
            if groups.sync_group is None:
                raise ValueError(f"rank {self.rank} is in the sync group but groups.sync_group is None")
            self._sync_ranks = list(dist.get_process_group_ranks(groups.sync_group))
            self._comm_device = self._device_for(groups.sync_group)
            # gloo on a GPU rank (shared-device mode): the buckets stage through pinned host memory
            self._pin = self.device.type == "cuda" and self._comm_device.type == "cpu"

    # ------------------------------------------------------------------ control plane
    def pending_version(self) -> int | None:
        """The latest version a source announced on the store (None: no plane, or nothing announced yet).

        Generators poll this at fragment boundaries to know when to enter :meth:`pull`.
        """
        return None if self.plane is None else self.plane.read_version(POLICY_VERSION_NAME)

    # ------------------------------------------------------------------ trainer side
    def push(self, trainer: SyncSource, version: int) -> SyncStats:
        """Broadcast ``trainer``'s trainable weights as policy ``version``; every trainer rank calls this."""
        if self.role != "trainer":
            raise ValueError(f"push is for trainer ranks; rank {self.rank} is a {self.role}")
        _check_version(version)
        with self._named_waits("pushing", version):
            return self._push(trainer, version)

    def _push(self, trainer: SyncSource, version: int) -> SyncStats:
        start = self._now()
        named = sorted(trainer.backend.named_trainable(), key=lambda item: item[0])
        if self.rank != self.source:
            self._trainer_status(ok=True)  # handshake outcome from the source
            for _, p in named:
                if hasattr(p, "full_tensor"):
                    p.detach().full_tensor()  # the source gathers this parameter now
            self._trainer_status(ok=True)  # verification outcome from the source
            return SyncStats(version, 0, self._now() - start, 0, None)

        if self.plane is not None:
            self.plane.publish_version(POLICY_VERSION_NAME, version)
        local = [TensorSpec(n, tuple(p.shape), p.dtype) for n, p in named]
        try:
            self._handshake(version, local, is_source=True)
        except WeightSyncError:
            self._trainer_status(ok=False)
            raise
        self._trainer_status(ok=True)
        assert self._wire_dtypes is not None
        specs = [TensorSpec(s.name, s.shape, d) for s, d in zip(local, self._wire_dtypes, strict=True)]
        rows: list[torch.Tensor] = []
        buckets = plan_buckets(specs, self.bucket_bytes)
        for bucket in buckets:
            flat = torch.empty(
                sum(specs[i].numel for i in bucket),
                dtype=specs[bucket[0]].dtype,
                device=self._comm_device,
                pin_memory=self._pin,
            )
            views = self._views(flat, [specs[i] for i in bucket])
            for i, view in zip(bucket, views, strict=True):
                view.copy_(full_tensor(named[i][1]).reshape(specs[i].shape))
            dist.broadcast(flat, src=self.source, group=self.groups.sync_group)
            if self.cfg.verify_checksum:
                rows.extend(tensor_checksum(v) for v in views)
        stats_checksum, verify_s = None, 0.0
        try:
            if self.cfg.verify_checksum:
                begin = self._now()
                stats_checksum = self._verify(version, specs, rows)
                verify_s = self._now() - begin
        except WeightSyncError:
            self._trainer_status(ok=False)
            raise
        self._trainer_status(ok=True)
        total = sum(s.nbytes for s in specs)
        return SyncStats(version, total, self._now() - start, len(buckets), stats_checksum, verify_s)

    # ------------------------------------------------------------------ generator side
    def receive(self, flow_model: nn.Module, version: int) -> StagedPolicy:
        """Receive policy ``version`` into a staging buffer (``flow_model`` is read for names, shapes and
        dtypes but not changed); every generator rank calls this while the trainer pushes. The checksum
        is verified on the staged copy; :meth:`StagedPolicy.apply` later copies it into the model at a
        fragment boundary (:class:`digenrl.runtime.comm.policy_version.PolicyVersion`)."""
        if self.role != "generator":
            raise ValueError(f"receive is for generator ranks; rank {self.rank} is a {self.role}")
        _check_version(version)
        with self._named_waits("receiving", version):
            return self._receive(flow_model, version)

    def _receive(self, flow_model: nn.Module, version: int) -> StagedPolicy:
        start = self._now()
        named = generator_sync_parameters(flow_model, self.mode)
        specs = [TensorSpec(n, tuple(p.shape), p.dtype) for n, p in named]
        self._handshake(version, specs, is_source=False)
        buckets = plan_buckets(specs, self.bucket_bytes)
        staged: list[tuple[str, torch.Tensor]] = []
        for bucket in buckets:
            flat = torch.empty(
                sum(specs[i].numel for i in bucket),
                dtype=specs[bucket[0]].dtype,
                device=self._comm_device,
                pin_memory=self._pin,
            )
            dist.broadcast(flat, src=self.source, group=self.groups.sync_group)
            views = self._views(flat, [specs[i] for i in bucket])
            staged.extend((specs[i].name, view) for i, view in zip(bucket, views, strict=True))
        if self.after_receive_hook is not None:
            self.after_receive_hook(staged)
        stats_checksum, verify_s = None, 0.0
        if self.cfg.verify_checksum:
            begin = self._now()
            stats_checksum = self._verify(version, specs, [tensor_checksum(t) for _, t in staged])
            verify_s = self._now() - begin
        total = sum(s.nbytes for s in specs)
        stats = SyncStats(version, total, self._now() - start, len(buckets), stats_checksum, verify_s)
        return StagedPolicy(version, self.mode, staged, stats)

    def pull(self, flow_model: nn.Module, version: int) -> SyncStats:
        """:meth:`receive` and apply at once (a generator that holds no fragment in flight)."""
        staged = self.receive(flow_model, version)
        staged.apply(flow_model)
        return staged.stats

    # ------------------------------------------------------------------ collectives
    def _named_waits(self, doing: str, version: int) -> AbstractContextManager[None]:
        """A failed collective of this sync names the rank, the version and the members (module docstring)."""
        generators = [r for r in self._sync_ranks if r != self.source]
        return named_collective(
            f"rank {self.rank} ({self.role}) failed {doing} policy version {version} in the weight sync from "
            f"trainer rank {self.source} to generator ranks {generators} (every member must join each push; "
            "one that never did is blocked elsewhere)",
            passthrough=(WeightSyncError, ValueError),
        )

    def _handshake(self, version: int, specs: list[TensorSpec], *, is_source: bool) -> None:
        shape_digest, dtype_digest = manifest_digests(specs)
        mine = torch.tensor(
            [version, shape_digest, dtype_digest, int(is_source)], dtype=torch.int64, device=self._comm_device
        )
        gathered = [torch.empty_like(mine) for _ in self._sync_ranks]
        dist.all_gather(gathered, mine, group=self.groups.sync_group)
        table = {r: [int(v) for v in t.cpu()] for r, t in zip(self._sync_ranks, gathered, strict=True)}
        source_row = table[self.source]
        generators = [r for r in self._sync_ranks if r != self.source]

        if any(table[r][1] != source_row[1] for r in generators):
            lists: list[Any] = [None] * len(self._sync_ranks)
            dist.all_gather_object(lists, [(s.name, s.shape) for s in specs], group=self.groups.sync_group)
            by_rank = dict(zip(self._sync_ranks, lists, strict=True))
            bad = next(r for r in generators if table[r][1] != source_row[1])
            raise WeightSyncError(
                f"rank {self.rank}: weight sync ({self.mode} mode) tensor lists differ between trainer rank "
                f"{self.source} and generator rank {bad}: "
                f"{_first_difference(by_rank[self.source], by_rank[bad])}"
                "; the generator must carry the trainer's structure (prepare_generator_model with the same "
                "trainer.lora_* settings and model)"
            )
        wrong = [r for r in generators if table[r][0] != source_row[0]]
        if wrong:
            expected = ", ".join(f"generator rank {r} expected {table[r][0]}" for r in wrong)
            raise WeightSyncError(
                f"rank {self.rank}: weight sync version mismatch: trainer rank {self.source} pushes policy "
                f"version {source_row[0]} but {expected}"
            )
        first = generators[0]
        odd = [r for r in generators if table[r][2] != table[first][2]]
        if odd:
            raise WeightSyncError(
                f"rank {self.rank}: generator ranks {odd} hold the synced tensors in other dtypes than "
                f"generator rank {first}; build every generator with the same model.dtype"
            )
        if self._wire_dtypes is None:
            # the first generator's dtypes become the wire dtypes (unknown ones travel as -1, and then
            # every member fails together instead of leaving the others in a broadcast)
            codes = torch.tensor(
                [WIRE_DTYPES.index(s.dtype) if s.dtype in WIRE_DTYPES else -1 for s in specs],
                dtype=torch.int64,
                device=self._comm_device,
            )
            dist.broadcast(codes, src=first, group=self.groups.sync_group)
            received = [int(c) for c in codes.cpu()]
            if any(c < 0 for c in received):
                bad = specs[received.index(-1)].name
                raise WeightSyncError(
                    f"rank {self.rank}: generator rank {first} holds {bad!r} in a dtype weight sync cannot "
                    f"carry; supported: {[str(d) for d in WIRE_DTYPES]}"
                )
            self._wire_dtypes = [WIRE_DTYPES[c] for c in received]

    def _verify(self, version: int, specs: list[TensorSpec], rows: list[torch.Tensor]) -> int:
        """All-gather per-tensor checksums over the sync group; every member raises on a mismatch.
        Returns the digest of this rank's checksums."""
        mine = (
            torch.stack(rows).to(self._comm_device)
            if rows
            else torch.zeros(0, 2, dtype=torch.int64, device=self._comm_device)
        )
        gathered = [torch.empty_like(mine) for _ in self._sync_ranks]
        dist.all_gather(gathered, mine, group=self.groups.sync_group)
        by_rank = {r: t.cpu() for r, t in zip(self._sync_ranks, gathered, strict=True)}
        reference = by_rank[self.source]
        problems = []
        for r in self._sync_ranks:
            if r == self.source or torch.equal(by_rank[r], reference):
                continue
            differs = (by_rank[r] != reference).any(dim=1).nonzero().flatten().tolist()
            problems.append(f"generator rank {r} (first differing tensor {specs[differs[0]].name!r})")
        if problems:
            raise WeightSyncError(
                f"rank {self.rank}: weight sync checksum mismatch at policy version {version}: "
                f"{'; '.join(problems)} differ from what trainer rank {self.source} sent"
            )
        return checksum_digest(by_rank[self.rank])

    def _trainer_status(self, *, ok: bool) -> None:
        """Source → other trainer ranks: did the last step succeed? (no-op with a single trainer rank)"""
        group = self.groups.trainer_group
        if len(self.layout.trainer_ranks) < 2 or group is None:
            return
        flag = torch.tensor([int(ok)], dtype=torch.int64, device=self._device_for(group))
        dist.broadcast(flag, src=self.source, group=group)
        if self.rank != self.source and not int(flag.item()):
            raise WeightSyncError(
                f"rank {self.rank}: weight sync failed on the source trainer rank {self.source}; "
                "see its error for the reason"
            )

    # ------------------------------------------------------------------ small helpers
    def _device_for(self, group: Any) -> torch.device:
        if dist.get_backend(group) == "nccl":
            if self.device.type != "cuda":
                raise ValueError(f"NCCL moves CUDA tensors only; WeightSync device={self.device} is not CUDA")
            return self.device
        return torch.device("cpu")

    @staticmethod
    def _views(flat: torch.Tensor, specs: Iterable[TensorSpec]) -> list[torch.Tensor]:
        views, offset = [], 0
        for spec in specs:
            views.append(flat[offset : offset + spec.numel].view(spec.shape))
            offset += spec.numel
        return views

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


def _check_version(version: int) -> None:
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"version must be a non-negative int, got {version!r}")


def _first_difference(a: list[tuple[str, tuple[int, ...]]], b: list[tuple[str, tuple[int, ...]]]) -> str:
    for (name_a, shape_a), (name_b, shape_b) in zip(a, b, strict=False):
        if name_a != name_b:
            return f"first differing name: trainer has {name_a!r} where the generator has {name_b!r}"
        if tuple(shape_a) != tuple(shape_b):
            return (
                f"first differing tensor {name_a!r}: trainer shape {tuple(shape_a)}, "
                f"generator shape {tuple(shape_b)}"
            )
    if len(a) != len(b):
        longer, who = (a, "trainer") if len(a) > len(b) else (b, "generator")
        return f"only the {who} has {longer[min(len(a), len(b))][0]!r} ({len(a)} vs {len(b)} tensors)"
    return "lists are equal but digests differ"  # pragma: no cover - hash collision
