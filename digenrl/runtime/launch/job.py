"""The processes a launcher starts (torchrun agents and their workers), stopped together: nothing outlives
the launcher (``digenrl/launch.py``; docs/operations.md, "Launching").

torchrun starts every worker in its own session (``start_new_session=True`` in torch's
``SubprocessHandler``), so a signal to the agent's process group never reaches the workers, and an agent
killed with SIGKILL leaves them running. :class:`Job` therefore starts each agent in its own session and,
when the launcher gets SIGTERM, SIGINT or SIGHUP, or leaves with an error (a timeout, a failed node):

1. sends the agent's process group the signal it got (torchrun stops its workers on SIGTERM/SIGINT/SIGHUP),
   and every descendant of the agent — the workers and whatever they started — SIGTERM, whose default
   action ends a process at once, even one blocked inside a collective;
2. waits up to :data:`STOP_GRACE_S` for all of them;
3. SIGKILLs what is left.

Descendants are found in ``/proc`` (Linux) when the stop begins and identified by pid *and* start time, so
a pid the kernel reused for an unrelated process in between is never signalled. A signal becomes
:class:`LaunchInterrupted` in the launcher's main thread once the job is stopped; ``launch.main`` exits
with ``128 + signal`` as a shell would.

A SIGKILL of the launcher itself cannot be forwarded, so the job ends itself (issue 35, item 3): each agent
is started with a parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGTERM)``, Linux, prctl(2)), and each
worker watches the launcher named in :data:`LAUNCHER_ENV` (pid and start time, so a reused pid does not
count as alive) and SIGKILLs itself within :data:`LAUNCHER_POLL_S` of its end
(:func:`exit_with_launcher`). Nothing of the run outlives its launcher by more than a second or so.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

#: Signals the launcher forwards to the job it started.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: Seconds the job's processes get to exit after the forwarded signal before SIGKILL: room for a SIGTERM's
#: final checkpoint (digenrl/runtime/faults/stop_request.py ends a rank that takes longer than 25 s itself).
STOP_GRACE_S = 30.0
#: The environment variable naming the launcher (``<pid>:<start time>``) to the workers it starts.
LAUNCHER_ENV = "DIGENRL_LAUNCHER"
#: Seconds between a worker's looks at whether its launcher is still alive.
LAUNCHER_POLL_S = 0.5
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
#: Seconds ``Job.stop`` waits for SIGKILLed processes to be gone (the kernel needs a moment to tear one down).
_KILL_WAIT_S = 5.0


class LaunchInterrupted(BaseException):
    """The launcher got ``signum`` and stopped its job. A BaseException like KeyboardInterrupt, so a
    caller's ``except Exception`` does not swallow it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"received {signal.Signals(signum).name}: stopped torchrun and every worker")


class Job:
    """torchrun agents started by one launch, each in its own session. Use as a context manager: inside it,
    :data:`FORWARDED_SIGNALS` stop the job and raise :class:`LaunchInterrupted` (main thread only; other
    threads keep the handlers they have); leaving it stops whatever still runs (a no-op after a normal end).
    """

    def __init__(self, grace_s: float = STOP_GRACE_S) -> None:
        self.procs: list[subprocess.Popen] = []
        self.grace_s = grace_s
        self._stopping = False
        self._signum = signal.SIGTERM  # what the agents get when the job is stopped: the signal received
        self._saved: dict[int, Any] = {}

    def start(self, cmd: list[str], **popen_kwargs: Any) -> subprocess.Popen:
        env = dict(popen_kwargs.pop("env", None) or os.environ)
        env[LAUNCHER_ENV] = launcher_id(os.getpid())
        proc = subprocess.Popen(
            cmd, start_new_session=True, env=env, preexec_fn=_die_with_parent(), **popen_kwargs
        )
        self.procs.append(proc)
        return proc

    def __enter__(self) -> Job:
        if threading.current_thread() is threading.main_thread():
            for sig in FORWARDED_SIGNALS:
                self._saved[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop(self._signum)
        finally:
            for sig, handler in self._saved.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
            self._saved.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only raise: the stop runs in ``__exit__``, once the frame the signal interrupted has unwound. That
        # frame may be ``Popen.wait`` holding its non-reentrant waitpid lock, so waiting for the agent from
        # inside the handler would deadlock.
        if self._stopping:
            return  # a second signal while the first one's stop is under way
        self._stopping, self._signum = True, signum
        raise LaunchInterrupted(signum)

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Signal every running agent's group (``signum``) and its descendants (SIGTERM), wait up to
        ``grace_s``, SIGKILL what is left; returns once the agents are reaped and the rest is gone."""
        self._stopping = True
        running = [proc for proc in self.procs if proc.poll() is None]
        tree = [member for proc in running for member in descendants(proc.pid)]
        for proc in running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signum)
        for pid, started in tree:
            _signal(pid, started, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and (
            any(proc.poll() is None for proc in running) or any(_alive(*member) for member in tree)
        ):
            time.sleep(0.05)
        tree += [member for proc in running if proc.poll() is None for member in descendants(proc.pid)]
        for proc in running:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for pid, started in tree:
            _signal(pid, started, signal.SIGKILL)
        for proc in running:
            proc.wait()
        end = time.monotonic() + _KILL_WAIT_S  # SIGKILL is delivered asynchronously: see them go
        while any(_alive(*member) for member in tree) and time.monotonic() < end:
            time.sleep(0.01)


def descendants(root: int) -> list[tuple[int, int]]:
    """``(pid, start time)`` of every live descendant of ``root``, from ``/proc`` ([] without it)."""
    children: dict[int, list[tuple[int, int]]] = {}
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                stat = _stat(int(entry.name))
                if stat is not None and stat[2] != "Z":
                    children.setdefault(stat[0], []).append((int(entry.name), stat[1]))
    found: list[tuple[int, int]] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


def _stat(pid: int) -> tuple[int, int, str] | None:
    """``(parent pid, start time in clock ticks, state)`` of ``pid`` (proc(5)); None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # after "pid (comm)": field 3 (state) is fields[0]
    return int(fields[1]), int(fields[19]), fields[0]


def _alive(pid: int, started: int) -> bool:
    """Whether ``pid`` is still the process that started at ``started`` and has not exited (a zombie
    has)."""
    stat = _stat(pid)
    return stat is not None and stat[1] == started and stat[2] != "Z"


def _signal(pid: int, started: int, signum: int) -> None:
    if _alive(pid, started):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def launcher_id(pid: int) -> str:
    """``<pid>:<start time>`` of a live process (start time from /proc; 0 where there is none)."""
    stat = _stat(pid)
    return f"{pid}:{stat[1] if stat is not None else 0}"


def _die_with_parent() -> Any:
    """A ``preexec_fn`` that makes the child get SIGTERM when the launcher (the thread that started it)
    ends, via ``prctl(PR_SET_PDEATHSIG)``; None where there is no prctl (not Linux)."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:  # the process's own symbols hold libc's (no library search: that would start processes)
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:  # resolved before the fork: the child only makes the system call
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)

    return preexec


def exit_with_launcher() -> threading.Thread | None:
    """In a worker started by a launcher (:data:`LAUNCHER_ENV` set): a daemon thread that SIGKILLs this
    process once the launcher is gone (killed with SIGKILL, say), so no worker trains on without it and
    the run's lock is free only when no process of the run is alive. None outside such a launch."""
    value = os.environ.get(LAUNCHER_ENV, "")
    pid_text, _, started_text = value.partition(":")
    if not (pid_text.isdigit() and started_text.isdigit()):
        return None
    pid, started = int(pid_text), int(started_text)

    def watch() -> None:
        while _alive(pid, started) if started else _exists(pid):
            time.sleep(LAUNCHER_POLL_S)
        print(f"[digenrl] worker pid {os.getpid()}: launcher pid {pid} is gone; exiting with it", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="digenrl-launcher-watch", daemon=True)
    thread.start()
    return thread


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
