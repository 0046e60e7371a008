"""Role residency for colocated layouts: which weights sit on the shared device, and when they move.

In a colocated run (docs/design.md §2) the roles ``train``, ``rollout`` (generate) and ``reward`` (score)
share one device and take turns. Each role declares once whether its weights stay on the device while it is
idle (``ResidencyPolicy``); only weights ever move (an ``(onload, offload)`` pair per role), never a process.
``ResidencyPlanner`` turns each phase's needs into the minimal list of transitions and issues only those
that change something; its state table is the single source of truth for what is resident.

Design and the exact transition sequences follow the seed PR "refactor(diffusion): make role residency one
choice per role, not per phase" (UniRL, fixes #429; summary: docs/references.md [001]), whose measured
sequences the tests mirror. The rules that produce them:

* ``enter(role)`` parks every *other* tracked, non-resident role that is on the device — unconditionally,
  even when ``role`` itself is untracked, because an untracked role still runs and still displaces
  whatever shares its device — then onloads ``role`` if it is tracked and parked.
* ``rollout`` and ``reward`` are left eagerly: a non-resident one is parked as its phase ends (the engine
  sleeps after generating, the scorer after scoring), so the slab is free before the next phase asks.
* The trainer is parked lazily (only when another role enters) and returns only where its weights are
  read: immediately before the optimizer step, a weight read, or a checkpoint save that is actually due.
  So it stays parked across a whole accumulate window and a reward phase inherits an already-parked
  trainer instead of round-tripping it.
* A role is *tracked* only if it shares the device with the others; untracked roles (a scorer on its own
  GPUs, a trainer behind a separate layout) are never moved.

Every transition is timed and its byte count recorded (``TransitionRecord``) so the simulator can model
residency cost (pinned host↔device copy ≈ 51 GB/s on H200, docs/design.md §1). The colocated schedules
(:mod:`digenrl.systems.colocated_sync`) are its only users, so it lives beside them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, Literal, NamedTuple

import torch
from torch import nn

__all__ = [
    "ROLES",
    "EvaluationPhases",
    "ResidencyPlanner",
    "ResidencyPolicy",
    "TransitionRecord",
    "WeightTransitions",
    "chain_transitions",
    "host_transitions",
    "module_transitions",
    "optimizer_transitions",
]

ROLES: tuple[str, ...] = ("train", "rollout", "reward")  # also the order in which enter() parks roles
TransitionKind = Literal["onload", "offload"]
TransitionFn = Callable[[], int | None]  # returns the bytes it moved, or None when it cannot tell


class WeightTransitions(NamedTuple):
    """The two callables through which the planner reaches a role's weights (and nothing else)."""

    onload: TransitionFn
    offload: TransitionFn


@dataclass(frozen=True)
class TransitionRecord:
    """One issued transition: which role, which direction, bytes moved (None = unknown), wall seconds."""

    role: str
    kind: TransitionKind
    bytes: int | None
    seconds: float


def _check_role(role: Any, what: str = "role") -> str:
    if role not in ROLES:
        raise ValueError(f"{what}={role!r} is not a role; choose one of: {', '.join(ROLES)}")
    return role


@dataclass(frozen=True)
class ResidencyPolicy:
    """Whether each role keeps its weights on the device while idle.

    Defaults reproduce the synchronous behaviour of the seed PR: the trainer and the scorer stay, the
    rollout engine sleeps after every generation.
    """

    train_resident: bool = True
    rollout_resident: bool = False
    reward_resident: bool = True

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, bool):
                raise ValueError(f"residency.{f.name} must be a bool (true/false), got {value!r}")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> ResidencyPolicy:
        """Build from a ``residency:`` config mapping; unknown keys are rejected by name, not ignored."""
        if cfg is None:
            return cls()
        if not isinstance(cfg, Mapping):
            raise ValueError(
                f"residency must be a mapping of <role>_resident: bool, got {type(cfg).__name__}"
            )
        allowed = [f.name for f in fields(cls)]
        unknown = sorted(str(k) for k in cfg if k not in allowed)
        if unknown:
            raise ValueError(
                f"unknown residency key(s) {', '.join('residency.' + k for k in unknown)}; "
                f"allowed: {', '.join(allowed)}"
            )
        return cls(**dict(cfg))

    def is_resident(self, role: str) -> bool:
        return getattr(self, f"{_check_role(role)}_resident")

    def require_resident(self, *roles: str, system: str, reason: str) -> None:
        """Reject a policy that parks a role ``system`` cannot park (e.g. scoring overlapped with generation).

        The seed PR's async trainer rejects ``reward_resident: false`` because it scores outside a reward
        phase; a schedule with the same shape calls this at startup so the misconfiguration fails there.
        """
        for role in roles:
            if not self.is_resident(role):
                raise ValueError(f"residency.{role}_resident=false is not supported by {system}: {reason}")


class ResidencyPlanner:
    """The residency state table of one device and the only path through which weights move.

    Args:
        policy: which roles stay on the device while idle.
        tracked: roles that share this device. Untracked roles are never moved (and need no transitions).
        transitions: ``role -> (onload, offload)`` for every tracked role; None = bookkeeping only (the
            simulator, or a schedule whose weights do not really move).
        log: receives one line per issued transition, e.g. ``"residency: train offload"``.
        initial: where each tracked role starts (True = on device). Default: the trainer on the device
            (it is built there), the rollout engine asleep (engines wake on first generate, so even a
            resident rollout is onloaded once), the scorer on the device iff it is resident. With these
            defaults every iteration of the loop emits the same sequence from the first one on. It must
            say where the weights physically are (park a sleeping engine before handing it over); the
            torch transitions below refuse a second offload or onload instead of silently repeating it.
        clock: time source for ``TransitionRecord.seconds``.
        on_transition: called with every issued transition's record (the systems log it as a ``residency``
            span, so what a swap costs shows on the timeline and in the per-phase seconds).
    """

    def __init__(
        self,
        policy: ResidencyPolicy | None = None,
        *,
        tracked: Collection[str] = ROLES,
        transitions: Mapping[str, tuple[TransitionFn, TransitionFn]] | None = None,
        log: Callable[[str], None] | None = None,
        initial: Mapping[str, bool] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        on_transition: Callable[[TransitionRecord], None] | None = None,
    ) -> None:
        self.policy = ResidencyPolicy() if policy is None else policy
        if not isinstance(self.policy, ResidencyPolicy):
            raise ValueError(f"policy must be a ResidencyPolicy, got {type(policy).__name__}")
        if isinstance(tracked, str):
            raise ValueError(f"tracked must be a collection of roles, not the string {tracked!r}")
        for role in tracked:
            _check_role(role, "tracked role")
        self.tracked: frozenset[str] = frozenset(tracked)
        if not self.policy.train_resident and "train" not in self.tracked:
            raise ValueError(
                "residency.train_resident=false cannot be honoured: the train role is not tracked (it does "
                "not share this device, e.g. a separate layout, or generation reads the trainer's own "
                "weights), so there is nothing to park; set residency.train_resident=true"
            )
        self._transitions = self._check_transitions(transitions)
        self._state = self._initial_state(initial)
        self._log = log
        self._on_transition = on_transition
        self._clock = clock
        self._active: str | None = None
        self._history: list[tuple[str, str]] = []
        self._records: list[TransitionRecord] = []

    # ------------------------------------------------------------------ construction checks

    def _check_transitions(
        self, transitions: Mapping[str, tuple[TransitionFn, TransitionFn]] | None
    ) -> dict[str, WeightTransitions] | None:
        if transitions is None:
            return None
        for role in transitions:
            _check_role(role, "transitions role")
        missing = sorted(self.tracked - set(transitions))
        extra = sorted(set(transitions) - self.tracked)
        if missing:
            raise ValueError(f"transitions missing for tracked role(s): {', '.join(missing)}")
        if extra:
            raise ValueError(
                f"transitions given for untracked role(s) {', '.join(extra)}: the planner never moves an "
                f"untracked role; track it or drop its transitions"
            )
        checked: dict[str, WeightTransitions] = {}
        for role, pair in transitions.items():
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(callable(fn) for fn in pair)):
                raise ValueError(f"transitions[{role!r}] must be an (onload, offload) pair of callables")
            checked[role] = WeightTransitions(*pair)
        return checked

    def _initial_state(self, initial: Mapping[str, bool] | None) -> dict[str, bool]:
        default = {"train": True, "rollout": False, "reward": self.policy.reward_resident}
        state = {role: default[role] for role in ROLES if role in self.tracked}
        for role, on in (initial or {}).items():
            if role not in self.tracked:
                raise ValueError(f"initial[{role!r}]: not a tracked role; tracked: {sorted(self.tracked)}")
            if not isinstance(on, bool):
                raise ValueError(f"initial[{role!r}] must be a bool, got {on!r}")
            state[role] = on
        return state

    # ------------------------------------------------------------------ state

    @property
    def history(self) -> list[tuple[str, str]]:
        """Every issued transition, in order, as ``(role, "onload" | "offload")``."""
        return list(self._history)

    @property
    def records(self) -> list[TransitionRecord]:
        return list(self._records)

    @property
    def active(self) -> str | None:
        """The role last entered and not yet left (the trainer stays active until another role enters)."""
        return self._active

    def state(self) -> dict[str, bool]:
        """Tracked role -> whether its weights are on the device now."""
        return dict(self._state)

    def on_device(self, role: str) -> bool:
        _check_role(role)
        if role not in self.tracked:
            raise ValueError(f"role {role!r} is not tracked by this planner (it lives on its own device)")
        return self._state[role]

    # ------------------------------------------------------------------ primitives

    def _issue(self, role: str, kind: TransitionKind) -> None:
        start = self._clock()
        moved = None
        if self._transitions is not None:
            pair = self._transitions[role]
            moved = pair.onload() if kind == "onload" else pair.offload()
        seconds = self._clock() - start
        # Only a transition that returned is recorded: a failed one leaves the table as it was.
        self._state[role] = kind == "onload"
        self._history.append((role, kind))
        record = TransitionRecord(role, kind, None if moved is None else int(moved), seconds)
        self._records.append(record)
        if self._log is not None:
            self._log(f"residency: {role} {kind}")
        if self._on_transition is not None:
            self._on_transition(record)

    def enter(self, role: str, *, keep: Iterable[str] = ()) -> None:
        """Make ``role`` active: park every other tracked non-resident role on the device, then onload it.

        ``keep`` names tracked roles to leave on the device although non-resident (an evaluation that does
        not re-push weights keeps the rollout awake across scoring, or the engine would drop the adapter).
        """
        _check_role(role)
        keep = frozenset(keep)
        for kept in keep:
            if kept not in self.tracked or kept == role:
                raise ValueError(f"keep={sorted(keep)}: only other tracked roles can be kept, not {kept!r}")
        for other in ROLES:
            if (
                other != role
                and other in self.tracked
                and other not in keep
                and not self.policy.is_resident(other)
                and self._state[other]
            ):
                self._issue(other, "offload")
        if role in self.tracked and not self._state[role]:
            self._issue(role, "onload")
        self._active = role

    def leave(self, role: str, *, park: bool = True) -> None:
        """End ``role``'s phase; a tracked non-resident role is parked now unless ``park`` is False."""
        _check_role(role)
        if self._active != role:
            raise ValueError(f"leave({role!r}) but the active role is {self._active!r}")
        self._active = None
        if park and role in self.tracked and not self.policy.is_resident(role) and self._state[role]:
            self._issue(role, "offload")

    # ------------------------------------------------------------------ phase driver

    @contextmanager
    def generation(self) -> Iterator[None]:
        """Around one rollout: wake the engine (parking the trainer / scorer if they are non-resident)."""
        self.enter("rollout")
        try:
            yield
        finally:
            self.leave("rollout")

    @contextmanager
    def scoring(self) -> Iterator[None]:
        """Around decode + reward of one rollout."""
        self.enter("reward")
        try:
            yield
        finally:
            self.leave("reward")

    def before_optimizer_step(self) -> None:
        """The trainer returns here, once per optimizer step (once per accumulate window, not per rollout).

        The schedule runs the window's backward passes and the step after this call; the trainer then stays
        on the device until another role enters, so a weight read or a due save right after costs nothing.
        """
        self.enter("train")

    def before_weight_read(self) -> None:
        """Before reading the trainer's weights (LoRA adapter extract) when no cached copy is valid.

        Goes through ``enter`` (never a bare onload), so a non-resident scorer is parked first and the
        trainer never lands beside it.
        """
        self.enter("train")

    def before_save(self, due: bool) -> bool:
        """Call after the checkpoint's own due-or-not predicate: onloads the trainer only if a save is due.

        An evaluation parks the trainer; saving from parked (host) shards would gather the wrong thing, and
        a window that evaluates without saving must not pay a round trip. Returns ``due``.
        """
        if not isinstance(due, bool):
            raise ValueError(f"due must be a bool, got {due!r}")
        if due:
            self.enter("train")
        return due

    @contextmanager
    def evaluation(
        self, *, keep_rollout_awake: bool = False, sleep_after: bool = True
    ) -> Iterator[EvaluationPhases]:
        """Around an evaluation pass; drive each chunk with the yielded ``generation()`` / ``scoring()``.

        ``keep_rollout_awake``: the evaluation does not re-push weights between chunks, so the engine must
        not sleep (an unpinned engine would discard the adapter); it stays on the device through scoring.
        ``sleep_after``: park a non-resident rollout when the evaluation ends (False when generation
        resumes right after). The trainer is not brought back: the next step or a due save does that.
        """
        try:
            yield EvaluationPhases(self, keep_rollout_awake=keep_rollout_awake)
        finally:
            if (
                sleep_after
                and "rollout" in self.tracked
                and not self.policy.rollout_resident
                and self._state["rollout"]
            ):
                self._issue("rollout", "offload")


class EvaluationPhases:
    """Per-chunk phases of one evaluation (see ``ResidencyPlanner.evaluation``)."""

    def __init__(self, planner: ResidencyPlanner, *, keep_rollout_awake: bool) -> None:
        self._planner = planner
        self._keep_awake = keep_rollout_awake
        self._keep = frozenset({"rollout"} & planner.tracked) if keep_rollout_awake else frozenset()

    @contextmanager
    def generation(self) -> Iterator[None]:
        self._planner.enter("rollout")
        try:
            yield
        finally:
            self._planner.leave("rollout", park=not self._keep_awake)

    @contextmanager
    def scoring(self) -> Iterator[None]:
        self._planner.enter("reward", keep=self._keep)
        try:
            yield
        finally:
            self._planner.leave("reward")


# ---------------------------------------------------------------------- real transitions for torch objects


def _resolve_device(device: torch.device | str) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device={device!r} is not a torch device: {exc}") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} but CUDA is not available")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _HostParking:
    """Moves a changing set of tensors between ``device`` and host buffers by swapping their ``.data``.

    Swapping ``.data`` keeps every tensor object (a module's ``Parameter``, the optimizer's references to
    it, its state tensors) the same, so nothing outside needs re-binding. Host buffers are pinned when CUDA
    exists (fast, asynchronous copies) and kept across cycles, because pinning tens of GB is itself slow.
    Tensors sharing storage are copied separately, so views lose their aliasing while parked.
    """

    def __init__(self, collect: Callable[[], list[torch.Tensor]], device: torch.device | str, what: str):
        self._collect = collect
        self._device = _resolve_device(device)
        self._what = what
        self._pin = torch.cuda.is_available()
        self._host: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(tensor) -> (tensor, host buffer)
        self._parked: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def _sync(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)

    def _on_device(self, t: torch.Tensor) -> bool:
        return t.device == self._device

    def offload(self) -> int:
        if self._parked is not None:
            raise RuntimeError(
                f"{self._what}: offload while already parked (transitions bypassed the planner)"
            )
        tensors = [t for t in self._collect() if self._on_device(t)]
        non_blocking = self._pin and self._device.type == "cuda"
        parked, cache = [], {}
        for t in tensors:
            hit = self._host.get(id(t))
            buf = hit[1] if hit is not None and hit[0] is t else None
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=self._pin)
            buf.copy_(t.detach(), non_blocking=non_blocking)
            parked.append((t, buf))
            cache[id(t)] = (t, buf)
        self._sync()  # the host copies must be complete before the device memory is released
        for t, buf in parked:
            t.data = buf
        self._host = cache
        self._parked = parked
        return sum(_nbytes(buf) for _, buf in parked)

    def onload(self) -> int:
        if self._parked is None:
            raise RuntimeError(f"{self._what}: onload while not parked (transitions bypassed the planner)")
        non_blocking = self._pin and self._device.type == "cuda"
        for t, buf in self._parked:
            dev = torch.empty(buf.shape, dtype=buf.dtype, device=self._device)
            dev.copy_(buf, non_blocking=non_blocking)
            t.data = dev
        self._sync()
        moved = sum(_nbytes(buf) for _, buf in self._parked)
        self._parked = None
        return moved


def _unique(tensors: Iterable[torch.Tensor | None]) -> list[torch.Tensor]:
    seen: set[int] = set()
    out = []
    for t in tensors:
        if isinstance(t, torch.Tensor) and id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def host_transitions(
    collect: Callable[[], list[torch.Tensor]], device: torch.device | str, what: str
) -> WeightTransitions:
    """(onload, offload) moving the tensors ``collect`` returns at offload time (those on ``device``) to host
    buffers and back; ``what`` names them in errors. Each callable returns the bytes it moved."""
    parking = _HostParking(lambda: _unique(collect()), device, what)
    return WeightTransitions(parking.onload, parking.offload)


def module_transitions(module: nn.Module, device: torch.device | str) -> WeightTransitions:
    """(onload, offload) moving ``module``'s parameters, their gradients and its buffers off ``device``.

    Gradients are included so a pending accumulation survives a park losslessly (docs/design.md §3 (TAG)).
    Each callable returns the bytes it moved. Not for FSDP2/DTensor-sharded modules: give those their
    framework's own offload pair.
    """
    if not isinstance(module, nn.Module):
        raise ValueError(f"module must be a torch.nn.Module, got {type(module).__name__}")

    def collect() -> list[torch.Tensor]:
        params = list(module.parameters())
        return _unique([*params, *(p.grad for p in params), *module.buffers()])

    parking = _HostParking(collect, device, type(module).__name__)
    return WeightTransitions(parking.onload, parking.offload)


def optimizer_transitions(optimizer: torch.optim.Optimizer, device: torch.device | str) -> WeightTransitions:
    """(onload, offload) moving an optimizer's state tensors (e.g. Adam moments) off ``device``.

    The parameters themselves belong to the module (``module_transitions``); state created lazily by the
    first step is picked up by the next offload. DeepSpeed's ZeRO optimizers wrap a torch optimizer that
    holds the (partitioned) moments: that one is moved.
    """
    inner = getattr(optimizer, "optimizer", None)
    if not isinstance(optimizer, torch.optim.Optimizer) and isinstance(inner, torch.optim.Optimizer):
        optimizer = inner
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")

    def collect() -> list[torch.Tensor]:
        return _unique(v for state in optimizer.state.values() for v in state.values())

    parking = _HostParking(collect, device, type(optimizer).__name__)
    return WeightTransitions(parking.onload, parking.offload)


def chain_transitions(*pairs: tuple[TransitionFn, TransitionFn]) -> WeightTransitions:
    """One role's pair from several (e.g. policy + optimizer + reference): onload in order, offload reversed.

    Bytes add up; if any part cannot tell its bytes the chain reports None.
    """
    if not pairs:
        raise ValueError("chain_transitions needs at least one (onload, offload) pair")
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(callable(fn) for fn in pair)):
            raise ValueError(f"pairs[{i}] must be an (onload, offload) pair of callables")
    checked = [WeightTransitions(*p) for p in pairs]

    def _run(fns: list[TransitionFn]) -> int | None:
        moved = [fn() for fn in fns]
        return None if any(m is None for m in moved) else sum(int(m) for m in moved)  # type: ignore[arg-type]

    return WeightTransitions(
        lambda: _run([p.onload for p in checked]), lambda: _run([p.offload for p in reversed(checked)])
    )
