"""Heartbeat watchdog on torchrun's c10d store: a hung rank is named, with its role and phase, before
gloo / NCCL time out anonymously (docs/design.md §2, "Timeouts").

Why: when one rank stops (SIGSTOP, a deadlock that holds the GIL, a frozen host), its peers sit in a
collective until the backend's timeout, and the message they print ("Timed out waiting … for recv") names
no culprit; torchrun then blames whichever rank exited first. Here every rank runs a background thread
that, every ``interval_s``:

* writes its heartbeat ``<namespace>/watchdog<attempt>/rank<r>`` = JSON ``{beat, role, phase, iteration,
  after, state, host, pid}`` (one store write): ``phase`` / ``iteration`` are those of the innermost open
  ``EventLogger.span`` (``after``: the last span closed, for a rank between spans);
* reads every other rank's heartbeat (one ``multi_get``) and the run's failure reports (one ``check``).

Between periods the thread also beats when the rank's role is known (:meth:`HeartbeatWatchdog.follow`)
and whenever a span is entered or left (``EventLogger.on_span_change``), at most every
:data:`PHASE_BEAT_GAP_S`: a rank that freezes is named with the role and phase it froze in, not with what
it did at the last period (a trainer stopped in iteration 3 was named "(unassigned)", phase 'setup', when
its 5 s period had not come round since its setup).

A rank whose ``beat`` has not changed for ``threshold_s`` (by this rank's own monotonic clock, so clock
skew between hosts does not matter) is declared hung: this rank prints one line naming it, its role and
its last phase, publishes a failure report for it (``ControlPlane.report_failure``, so ranks polling the
store raise ``PeerFailureError`` with that reason) and ends the process with ``os._exit(1)`` — the only
way out for a main thread blocked in C++ inside a collective. A failure report another rank published
(``launch.py`` reports every failing rank) ends this rank the same way, with that reason.

``heartbeat_timing`` derives both periods from ``runtime.timeout_s``: the threshold is a third of it, so
the hang is reported well before the backend's own timeout fires. ``runtime.timeout_s`` below
:data:`digenrl.config.MIN_TIMEOUT_S` is refused at startup (its declared range). A rank that finishes
marks its heartbeat ``done`` before the process group is destroyed (:meth:`HeartbeatWatchdog.stop`), so
the last rank to finish never mistakes the others for dead ones.

The thread talks to the store through its own connection (``Store.clone``): a TCPStore client serialises
its operations, and the main thread may block in a long ``get`` (process-group creation does), which
would otherwise stall the heartbeat and raise a false alarm.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import torch.distributed as dist

from digenrl.runtime.comm.control_plane import ControlPlane

if TYPE_CHECKING:
    from digenrl.runtime.comm.distributed import DistContext

#: Heartbeat period never exceeds this: "one store write every few seconds".
MAX_INTERVAL_S = 5.0
#: A silent rank is declared hung after ``runtime.timeout_s / THRESHOLD_DIVISOR`` seconds.
THRESHOLD_DIVISOR = 3.0
#: Seconds between two heartbeats that publish a phase change (store writes per rank stay <= 5/s).
PHASE_BEAT_GAP_S = 0.2

_exit_lock = threading.Lock()


class SpanSource(Protocol):
    """What the heartbeat reads of a rank's event log (``EventLogger`` is one): its role, its innermost open
    span, and a hook called on every span change. A protocol, so fault handling does not depend on the
    event-log code that depends on it (``EventLogger.span`` injects the robustness tests' faults)."""

    role: str
    on_span_change: Callable[[], None] | None

    def current_span(self) -> tuple[str | None, int | None, str | None]: ...


def heartbeat_timing(timeout_s: float) -> tuple[float, float]:
    """``(interval_s, threshold_s)`` for ``runtime.timeout_s``: a heartbeat every ``interval_s`` (at most
    ``MAX_INTERVAL_S``), a rank silent for ``threshold_s`` = timeout_s / 3 is hung. Detection takes at
    most threshold + interval < timeout_s / 2, so it wins against the backend's timeout of any collective
    the hung rank did not enter yet."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
        raise ValueError(f"runtime.timeout_s must be a positive number of seconds, got {timeout_s!r}")
    threshold = timeout_s / THRESHOLD_DIVISOR
    return min(MAX_INTERVAL_S, threshold / 5), threshold


def end_process(message: str, details: str = "", before_exit: Callable[[], None] | None = None) -> NoReturn:
    """Print ``message`` (and ``details``) once per process, run ``before_exit``, flush, ``os._exit(1)``.

    Both the watchdog thread and the main thread's failure path end here; the first caller holds the lock
    until the process is gone, so a rank never prints two failure messages. ``os._exit`` skips Python's
    teardown on purpose: peers may sit in a collective that never completes, and exiting lets torchrun's
    agent stop every worker of the job at once.
    """
    _exit_lock.acquire()  # never released: a second caller waits here until os._exit ends the process
    try:
        print(message, file=sys.stderr)
        if details:
            print(details, file=sys.stderr, end="" if details.endswith("\n") else "\n")
        sys.stderr.flush()
        sys.stdout.flush()
        if before_exit is not None:
            before_exit()
    finally:
        sys.stderr.flush()
        os._exit(1)


class HeartbeatWatchdog:
    """One rank's heartbeat thread and its watch over every other rank (see the module docstring).

    Args:
        store: the run's c10d store (torchrun's; the watchdog uses its own clone of the connection).
        rank, world_size: this rank and the number of ranks to watch.
        timeout_s: ``runtime.timeout_s``; ``interval_s`` / ``threshold_s`` default to ``heartbeat_timing``.
        namespace: the run's ``ControlPlane`` namespace (failure reports are shared with it).
        on_failure: called with the failure line instead of printing it and ending the process (tests).
    """

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        world_size: int,
        timeout_s: float,
        *,
        interval_s: float | None = None,
        threshold_s: float | None = None,
        namespace: str = "digenrl",
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        default_interval, default_threshold = heartbeat_timing(timeout_s)
        self.interval_s = default_interval if interval_s is None else float(interval_s)
        self.threshold_s = default_threshold if threshold_s is None else float(threshold_s)
        if not 0 < self.interval_s < self.threshold_s:
            raise ValueError(
                f"heartbeat interval_s={self.interval_s:g} must be > 0 and below "
                f"threshold_s={self.threshold_s:g}"
            )
        self.timeout_s = float(timeout_s)
        self.rank = rank
        self.world_size = world_size
        try:
            own = store.clone()
        except (RuntimeError, NotImplementedError):  # pragma: no cover - every torch store type clones
            own = store
        # A store that stops answering must not freeze the heartbeat thread for the whole run.
        own.set_timeout(timedelta(seconds=self.threshold_s))
        self.plane = ControlPlane(own, rank, "watchdog", self.timeout_s, namespace=namespace)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self._beats = self.plane.scoped(f"watchdog{attempt}")
        self._keys = {r: self._beats.full_key(f"rank{r}") for r in range(world_size) if r != rank}
        self._on_failure = on_failure
        self._role = "unassigned"
        self._phase = "setup"
        self._events: SpanSource | None = None
        self._beat = 0
        self._host = socket.gethostname()
        self._stop = threading.Event()
        self._changed = threading.Event()  # role or phase changed: beat before the period ends
        self._thread: threading.Thread | None = None
        # rank -> (beat, monotonic time it last changed, its record)
        self._seen: dict[int, tuple[int, float, dict[str, Any]]] = {}
        # ranks whose key exists: ``multi_get`` of a missing key would block until the store's timeout
        self._published: set[int] = set()
        self._done: set[int] = set()  # ranks that finished normally
        self._started_at = time.monotonic()
        self._store_ok_at = self._started_at
        self.failure_line: str | None = None

    # ------------------------------------------------------------------------------ what this rank does

    def follow(self, events: SpanSource) -> None:
        """From now on the heartbeat carries ``events``' role and innermost open span: one beat at once,
        and one after each span change (module docstring)."""
        self._events = events
        self._role = events.role
        events.on_span_change = self._changed.set
        self._changed.set()

    def status(self) -> dict[str, Any]:
        """This rank's heartbeat record (without the beat counter)."""
        phase, iteration, after = (self._phase, None, None)
        if self._events is not None:
            phase, iteration, after = self._events.current_span()
        return {
            "role": self._role,
            "phase": phase,
            "iteration": iteration,
            "after": after,
            "host": self._host,
            "pid": os.getpid(),
        }

    # ------------------------------------------------------------------------------ lifecycle

    def start(self) -> HeartbeatWatchdog:
        """Publish the first heartbeat and start the thread."""
        self.beat()
        self._started_at = self._store_ok_at = time.monotonic()
        self._thread = threading.Thread(
            target=self._run, name=f"digenrl-watchdog-rank{self.rank}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and mark this rank ``done``: peers stop watching it (a finished rank is not a
        hung one). Call before the process group is destroyed."""
        self._stop.set()
        self._changed.set()  # wake the thread now
        if self._events is not None:
            self._events.on_span_change = None
        if self._thread is not None:
            self._thread.join(timeout=self.threshold_s + self.interval_s)
        with contextlib.suppress(RuntimeError):  # the store is already gone: peers are finishing too
            self.beat(state="done")

    def beat(self, state: str = "alive") -> None:
        """Write one heartbeat (the thread does this every ``interval_s``)."""
        self._beat += 1
        record = {"beat": self._beat, "state": state, **self.status()}
        self._beats.publish(f"rank{self.rank}", json.dumps(record))

    # ------------------------------------------------------------------------------ the thread

    def _run(self) -> None:
        due = time.monotonic() + self.interval_s
        while not self._stop.is_set():
            self._changed.wait(max(0.0, due - time.monotonic()))
            if self._stop.is_set():
                return
            self._changed.clear()
            periodic = time.monotonic() >= due
            if periodic:
                due = time.monotonic() + self.interval_s
            problem = None
            try:
                self.beat()
                if periodic:
                    problem = self.check()
                self._store_ok_at = time.monotonic()
            except RuntimeError as error:  # the store did not answer (DistStoreError is a RuntimeError)
                silent = time.monotonic() - self._store_ok_at
                if silent <= self.threshold_s or self._stop.is_set():
                    continue
                problem = (
                    f"the c10d store {_store_address()} has not answered for {silent:.1f} s ({error}); the "
                    "process hosting it (torchrun's agent on the first node) is gone or hung",
                    None,
                )
            if problem is not None and not self._stop.is_set():
                self._fail(*problem)
                return
            if not periodic:
                self._stop.wait(min(PHASE_BEAT_GAP_S, self.interval_s))  # phase beats stay rare

    def check(self) -> tuple[str, tuple[int, str, str] | None] | None:
        """One look at the peers: None if all is well, else ``(message, (rank, role, reason) to report on
        the store, or None when the failure is already reported)``."""
        report = self.plane.failure()
        if report is not None and report.rank != self.rank:
            return f"rank {report.rank} ({report.role}) failed: {report.message}", None
        now = time.monotonic()
        self._published.update(
            r for r in self._keys if r not in self._published and self._beats.exists(f"rank{r}")
        )
        ranks = sorted(self._published - self._done)
        values = self.plane.store.multi_get([self._keys[r] for r in ranks]) if ranks else []
        for r, raw in zip(ranks, values, strict=True):
            record = json.loads(raw)
            if record["state"] == "done":
                self._done.add(r)
            elif r not in self._seen or self._seen[r][0] != record["beat"]:
                self._seen[r] = (record["beat"], now, record)
        for r in self._keys:
            if r in self._done:
                continue
            _, changed_at, record = self._seen.get(r, (0, self._started_at, None))
            if now - changed_at > self.threshold_s:
                return self._hung(r, now - changed_at, record)
        return None

    def _hung(
        self, rank: int, silent: float, record: dict[str, Any] | None
    ) -> tuple[str, tuple[int, str, str]]:
        limit = f"limit {self.threshold_s:g} s, from runtime.timeout_s={self.timeout_s:g}"
        if record is None:
            reason = f"sent no heartbeat within {silent:.1f} s of the start ({limit})"
            return (f"rank {rank} {reason}; it is stopped or hung", (rank, "unknown", reason))
        where = _describe_phase(record)
        reason = (
            f"no heartbeat for {silent:.1f} s ({limit}); last phase {where}; host {record['host']} "
            f"pid {record['pid']}"
        )
        message = (
            f"rank {rank} ({record['role']}) is stopped or hung: {reason}. "
            "A stopped process (SIGSTOP), a deadlock holding the GIL or a frozen host looks like this"
        )
        return message, (rank, record["role"], reason)

    def _fail(self, message: str, report: tuple[int, str, str] | None) -> None:
        mine = self.status()
        line = (
            f"[rank {self.rank}] FAILED: watchdog: {message} "
            f"(this rank: {mine['role']}, phase {_describe_phase(mine)}; stopping)"
        )
        self.failure_line = line

        def publish() -> None:
            if report is not None and self.plane.ticket(f"watchdog-report-rank{report[0]}") == 0:
                rank, role, reason = report
                self.plane.report_failure(rank, f"{reason} (found by rank {self.rank}'s watchdog)", role=role)

        if self._on_failure is not None:
            publish()
            self._on_failure(line)
            return
        end_process(line, before_exit=publish)

    def report_own_failure(self, message: str) -> None:
        """Publish this rank's failure on the store (``launch.py``'s failure path), so every peer's
        watchdog and every store wait ends with this reason instead of a timeout."""
        self.plane.report_failure(self.rank, message, role=self._role)


def start_watchdog(ctx: DistContext, timeout_s: float) -> HeartbeatWatchdog | None:
    """This rank's running watchdog on the default process group's store; None in a single process."""
    if not ctx.is_distributed:
        return None
    store = dist.distributed_c10d._get_default_store()
    return HeartbeatWatchdog(store, ctx.rank, ctx.world_size, timeout_s).start()


def _describe_phase(record: dict[str, Any]) -> str:
    if record.get("phase") is None:
        after = record.get("after")
        return f"none (between spans, after '{after}')" if after else "none (no span yet)"
    iteration = record.get("iteration")
    return f"'{record['phase']}'" + (f" (iteration {iteration})" if iteration is not None else "")


def _store_address() -> str:
    return f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
