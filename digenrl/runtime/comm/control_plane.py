"""Control plane on the c10d key-value store that torchrun already runs (docs/design.md §2).

Ranks coordinate small facts — "fragment 3 is ready", "θ_5 is published", "I am at barrier X", "I died
because …" — through ``torch.distributed.Store`` (``TCPStore`` under torchrun; ``FileStore`` /
``HashStore`` in tests). No home-made RPC server: ``add`` gives atomic tickets, ``set``/``check``/``get``
give ready flags and values, ``compare_set`` keeps versions monotonic.

Every wait has a timeout and fails with a ``DistributedTimeoutError`` naming the waiting rank, its role,
what it waited for, the peer and the store key. Waits poll ``store.check`` with short, growing sleeps
rather than ``store.wait(keys, timeout)``: a timed-out ``wait`` takes at least 1 s on ``FileStore`` and
logs socket warnings on ``TCPStore`` (seen on torch 2.13), and polling lets every wait also watch the
run's failure key, so a rank that reports why it died wakes all its waiting peers with that reason
(``PeerFailureError``) instead of leaving them to time out.

Keys are namespaced: ``<namespace>/<scope>/.../<key>``; ``scoped("iter7")`` gives a view for one
iteration whose keys cannot collide with the next one's. Failure reports live at the namespace root so
every scope sees them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch.distributed as dist

from digenrl.runtime.comm.errors import DistributedTimeoutError, PeerFailureError

_T = TypeVar("_T")

#: Sleep between polls starts here and doubles up to ``poll_interval_s``: short waits answer fast,
#: long waits cost at most one store round trip per ``poll_interval_s`` per key.
_FIRST_POLL_S = 0.0005


@dataclass(frozen=True)
class FailureReport:
    """What a failing rank published about itself."""

    rank: int
    role: str
    message: str
    wall_time: float


class ControlPlane:
    """Tickets, flags, values, versions, barriers and failure reports on a c10d store.

    Args:
        store: any ``torch.distributed.Store`` (torchrun's default store, ``TCPStore``, ``FileStore``,
            ``HashStore``).
        rank: this process's global rank (used in error messages and barriers).
        role: this process's role, e.g. "generator" / "trainer" (used in error messages).
        default_timeout_s: timeout of waits that do not pass their own.
        namespace: key prefix of this run; two runs sharing a store must use different namespaces.
        poll_interval_s: longest sleep between two polls of a waited-for key.
    """

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        role: str,
        default_timeout_s: float = 300.0,
        *,
        namespace: str = "digenrl",
        poll_interval_s: float = 0.01,
    ) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank must be a non-negative int, got {rank!r}")
        if not isinstance(role, str) or not role:
            raise ValueError(f"role must be a non-empty string, got {role!r}")
        _check_positive("default_timeout_s", default_timeout_s)
        _check_positive("poll_interval_s", poll_interval_s)
        _check_key_part("namespace", namespace)
        self.store = store
        self.rank = rank
        self.role = role
        self.default_timeout_s = float(default_timeout_s)
        self.poll_interval_s = float(poll_interval_s)
        self.namespace = namespace
        self._prefix = f"{namespace}/"
        self._barrier_generation: dict[str, int] = {}

    @classmethod
    def from_default_group(
        cls, role: str, default_timeout_s: float = 300.0, *, namespace: str = "digenrl"
    ) -> ControlPlane:
        """A control plane on the store of the initialised default process group (torchrun's TCPStore)."""
        if not dist.is_initialized():
            raise ValueError("ControlPlane.from_default_group needs an initialised default process group")
        store = dist.distributed_c10d._get_default_store()
        return cls(store, dist.get_rank(), role, default_timeout_s, namespace=namespace)

    def scoped(self, scope: str) -> ControlPlane:
        """A view whose keys live under ``<this prefix>/<scope>/`` (e.g. one per iteration).

        Failure reports stay shared with the parent: they are run-wide.
        """
        _check_key_part("scope", scope)
        child = ControlPlane(
            self.store,
            self.rank,
            self.role,
            self.default_timeout_s,
            namespace=self.namespace,
            poll_interval_s=self.poll_interval_s,
        )
        child._prefix = f"{self._prefix}{scope}/"
        return child

    def full_key(self, key: str) -> str:
        """The store key ``key`` maps to (what error messages show)."""
        _check_key_part("key", key)
        return self._prefix + key

    # ------------------------------------------------------------------------------ tickets and values

    def ticket(self, counter: str) -> int:
        """Atomically draw the next ticket of ``counter``: 0, 1, 2, … across all ranks (``store.add``)."""
        return int(self.store.add(self.full_key(f"ticket/{counter}"), 1)) - 1

    def peek_ticket(self, counter: str) -> int:
        """The ticket :meth:`ticket` would hand out next, without drawing it."""
        return int(self.store.add(self.full_key(f"ticket/{counter}"), 0))

    def publish(self, key: str, value: bytes | str | int) -> None:
        """Set ``key`` to ``value`` (ints are stored as decimal text)."""
        self.store.set(self.full_key(key), _encode(value, "value"))

    def exists(self, key: str) -> bool:
        """Whether ``key`` is published (one ``check``, never blocks)."""
        return bool(self.store.check([self.full_key(key)]))

    def try_get(self, key: str) -> bytes | None:
        """The value of ``key``, or None if nobody published it yet (never blocks). Only for keys no
        other rank deletes: ``check`` then ``get`` is not atomic, and ``get`` of a key deleted in between
        blocks until the store's timeout."""
        full = self.full_key(key)
        return self.store.get(full) if self.store.check([full]) else None

    def delete(self, key: str) -> None:
        """Remove ``key`` (a consumed one-shot value, so the store does not grow with the run)."""
        self.store.delete_key(self.full_key(key))

    def wait_for(
        self,
        key: str,
        *,
        peer: int | str,
        what: str,
        timeout_s: float | None = None,
        idle: Callable[[], bool] | None = None,
    ) -> bytes:
        """Block until ``key`` is published and return its value.

        ``peer`` (a rank, or a description like "trainer pool") and ``what`` only feed the error
        message, which is what an operator reads when a run hangs. ``idle`` is called between polls; it
        lets a waiting rank do work that must not wait behind this key (a generator joins a pending
        weight sync while it waits for a fragment) and returns True when it did some, which restarts the
        timeout (the time was spent working, not waiting).
        """
        full = self.full_key(key)

        def probe() -> bytes | None:
            return self.store.get(full) if self.store.check([full]) else None

        return self.wait_until(probe, key=full, peer=peer, what=what, timeout_s=timeout_s, idle=idle)

    # ------------------------------------------------------------------------------------------ flags

    def set_flag(self, name: str) -> None:
        self.store.set(self.full_key(f"flag/{name}"), b"1")

    def flag_is_set(self, name: str) -> bool:
        return bool(self.store.check([self.full_key(f"flag/{name}")]))

    def wait_flag(self, name: str, *, peer: int | str, what: str, timeout_s: float | None = None) -> None:
        self.wait_for(f"flag/{name}", peer=peer, what=what, timeout_s=timeout_s)

    # --------------------------------------------------------------------------------------- versions

    def publish_version(self, name: str, version: int) -> None:
        """Announce that ``name`` (e.g. "policy") is now at ``version``; versions never go backwards.

        ``compare_set`` makes the monotonicity check atomic even with several publishers.
        """
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"version must be a non-negative int, got {version!r}")
        full = self.full_key(f"version/{name}")
        desired = str(version).encode()
        while True:
            current = self.store.get(full) if self.store.check([full]) else b""
            if current and int(current) > version:
                raise ValueError(
                    f"version of '{name}' must not go backwards: {int(current)} is published, got {version}"
                )
            if self.store.compare_set(full, current, desired) == desired:
                return

    def read_version(self, name: str) -> int | None:
        value = self.try_get(f"version/{name}")
        return None if value is None else int(value)

    def wait_version(
        self, name: str, at_least: int, *, peer: int | str, timeout_s: float | None = None
    ) -> int:
        """Block until ``name`` reaches version ``at_least``; return the version seen (may be newer)."""
        full = self.full_key(f"version/{name}")

        def probe() -> int | None:
            if not self.store.check([full]):
                return None
            seen = int(self.store.get(full))
            return seen if seen >= at_least else None

        return self.wait_until(
            probe, key=full, peer=peer, what=f"version >= {at_least} of '{name}'", timeout_s=timeout_s
        )

    # --------------------------------------------------------------------------------------- barriers

    def barrier(self, name: str, ranks: Sequence[int], *, timeout_s: float | None = None) -> None:
        """Store-based barrier among ``ranks`` (which must include this rank).

        Each call with the same ``name`` is a new generation, so the barrier is reusable as long as every
        member calls it the same number of times. On timeout the error names the ranks that never arrived.
        """
        members = sorted(set(ranks))
        if self.rank not in members:
            raise ValueError(f"barrier '{name}': ranks {members} must include this rank {self.rank}")
        generation = self._barrier_generation.get(name, 0)
        self._barrier_generation[name] = generation + 1
        base = f"barrier/{name}/{generation}"
        self.store.set(self.full_key(f"{base}/rank{self.rank}"), b"1")
        count_key = self.full_key(f"{base}/count")
        self.store.add(count_key, 1)

        def probe() -> bool | None:
            return True if int(self.store.add(count_key, 0)) >= len(members) else None

        try:
            self.wait_until(
                probe,
                key=count_key,
                peer="all barrier members",
                what=f"barrier '{name}'",
                timeout_s=timeout_s,
            )
        except DistributedTimeoutError as error:
            missing = [r for r in members if not self.store.check([self.full_key(f"{base}/rank{r}")])]
            raise DistributedTimeoutError(f"{error}; ranks that never arrived: {missing}") from None

    # --------------------------------------------------------------------------------------- failures

    def report_failure(self, rank: int, message: str, role: str | None = None) -> None:
        """Publish why ``rank`` is failing, so peers waiting on this store raise with that reason."""
        report = {"rank": rank, "role": role or self.role, "message": message, "wall_time": time.time()}
        index = int(self.store.add(self._failure_key("count"), 1))
        self.store.set(self._failure_key(str(index)), json.dumps(report).encode())

    def failure(self) -> FailureReport | None:
        """The first failure reported in this run, or None."""
        first = self._failure_key("1")
        if not self.store.check([first]):
            return None
        return FailureReport(**json.loads(self.store.get(first)))

    def failures(self) -> list[FailureReport]:
        """Every failure reported in this run, in report order."""
        count = int(self.store.add(self._failure_key("count"), 0))
        reports = []
        for index in range(1, count + 1):
            key = self._failure_key(str(index))
            if self.store.check([key]):  # a reporter may have drawn its index but not written yet
                reports.append(FailureReport(**json.loads(self.store.get(key))))
        return reports

    def _failure_key(self, suffix: str) -> str:
        return f"{self.namespace}/failure/{suffix}"

    # ------------------------------------------------------------------------------------------ polling

    def wait_until(
        self,
        probe: Callable[[], _T | None],
        *,
        key: str,
        peer: int | str,
        what: str,
        timeout_s: float | None = None,
        idle: Callable[[], bool] | None = None,
    ) -> _T:
        """Poll ``probe`` until it returns something other than None, watching the run's failure reports.

        ``key`` (the store key or resource being waited on), ``peer`` and ``what`` name the wait in the
        ``DistributedTimeoutError`` / ``PeerFailureError`` message; ``idle`` as in :meth:`wait_for`.
        """
        full_key = key
        timeout = self.default_timeout_s if timeout_s is None else float(timeout_s)
        _check_positive("timeout_s", timeout)
        deadline = time.monotonic() + timeout
        sleep_s = _FIRST_POLL_S
        while True:
            result = probe()
            if result is not None:
                return result
            if idle is not None and idle():
                deadline, sleep_s = time.monotonic() + timeout, _FIRST_POLL_S
                continue
            report = self.failure()
            if report is not None:
                raise PeerFailureError(
                    f"rank {self.rank} ({self.role}) stopped waiting for {what} from {_describe(peer)} "
                    f"(store key '{full_key}'): rank {report.rank} ({report.role}) reported failure: "
                    f"{report.message}",
                    failed_rank=report.rank,
                    failed_role=report.role,
                    reason=report.message,
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DistributedTimeoutError(
                    f"rank {self.rank} ({self.role}) timed out after {timeout:g} s waiting for {what} "
                    f"from {_describe(peer)} (store key '{full_key}')"
                )
            time.sleep(min(sleep_s, remaining))
            sleep_s = min(sleep_s * 2, self.poll_interval_s)


def _describe(peer: int | str) -> str:
    return f"rank {peer}" if isinstance(peer, int) else str(peer)


def _encode(value: bytes | str | int, name: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode()
    raise ValueError(f"{name} must be bytes, str or int, got {type(value).__name__}")


def _check_key_part(name: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")


def _check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
