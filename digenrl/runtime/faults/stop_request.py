"""SIGTERM — the usual way a cluster ends a job (SLURM ``scancel``, a Kubernetes pod's deletion, a job
scheduler's time limit) — ends a run with a checkpoint instead of losing the iterations since the last one
(issue 35, item 6).

The handler only records the signal. At the end of every iteration each rank asks :meth:`StopRequest.
last_iteration`: the first rank that got the signal publishes, on the run's store (torchrun's TCPStore,
no collective), the iteration the run now ends after — ``lead`` iterations ahead, where ``lead`` covers how
far one rank may run ahead of another (the system's asynchrony), so every rank reads it before it starts
that iteration. Each rank then runs as a run of that many iterations runs: the systems finish their
pipelines as at any last iteration (a generator joins the trainer's final weight push, …), the last
iteration's checkpoint is written, logs and trace are closed, and ``launch.main`` exits with 128 + SIGTERM
on the ranks that got it. A single process stops after the iteration it is in.

Nothing may hang on it: once the checkpoint is written, the end of the run gets :data:`FINISH_GRACE_S`
(under torchrun the agent that got the same signal is going away), then the process exits with
128 + SIGTERM. A repeated SIGTERM changes nothing (a launcher and torchrun both forward the one
cancellation); SIGINT (Ctrl-C) and SIGKILL still end a run at once. Schedulers give about 30 s between
SIGTERM and SIGKILL (SLURM ``KillWait``, Kubernetes ``terminationGracePeriodSeconds``, torchrun's
shutdown, this project's launcher), so a run whose remaining iterations plus checkpoint take longer loses
what it loses without the handler, no more.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from digenrl.runtime.comm.control_plane import ControlPlane
    from digenrl.runtime.comm.distributed import DistContext

#: Seconds the end of the run (logs, trace) gets once the stop's checkpoint is written.
FINISH_GRACE_S = 5.0


class StopRequest:
    """Whether this process was asked to stop (SIGTERM), and the iteration the run ends after."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: object = None
        self._installed = False
        self._timer: threading.Timer | None = None
        self._proposed = False
        self._plane: ControlPlane | None = None

    def install(self) -> None:
        """Handle SIGTERM from now on (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is not threading.main_thread() or self._installed:
            return
        self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        self._installed = True

    def uninstall(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:  # the same request forwarded again (launcher and torchrun both do)
            return
        self.signum = signum
        print(
            f"[digenrl] pid {os.getpid()} received {signal.Signals(signum).name}: the run ends with a "
            "checkpoint after the next iteration it can end on, then exits",
            file=sys.stderr,
            flush=True,
        )

    def last_iteration(self, ctx: DistContext, iteration: int, lead: int) -> int | None:
        """Called by every rank at the end of ``iteration``: the iteration the run ends after, once any rank
        was asked to stop (None until then). ``lead`` (≥ 1): how many iterations after this one the end
        may be, so that no rank has started it yet."""
        if not ctx.is_distributed:
            return iteration if self.signum is not None else None
        plane = self._control_plane()
        key = f"at/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        raw = plane.try_get(key)
        if raw is None and self.signum is not None and not self._proposed:
            self._proposed = True
            if plane.ticket(key) == 0:  # the first rank to ask decides, so every rank reads one value
                plane.publish(key, iteration + lead)
            raw = plane.try_get(key)
        return int(raw) if raw is not None else None

    def _control_plane(self) -> ControlPlane:
        if self._plane is None:
            from digenrl.runtime.comm.control_plane import ControlPlane

            self._plane = ControlPlane.from_default_group("stop", namespace="digenrl-stop")
        return self._plane

    def finishing(self, grace_s: float = FINISH_GRACE_S) -> None:
        """The checkpoint is written: give the end of the run (logs, trace) ``grace_s`` more, no longer.
        Under torchrun the agent that got the signal is going away with the store the ranks' teardown
        meets in, so a teardown that waits on it must not hold the job hostage."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = threading.Timer(grace_s, _exit_now, args=(self.signum or signal.SIGTERM,))
        self._timer.daemon = True
        self._timer.start()


def _exit_now(signum: int) -> None:
    """End this process now with the status a ``signum`` death reports to a shell (128 + signum); called
    from the grace timer's thread, where no signal handler can be changed."""
    print(
        f"[digenrl] pid {os.getpid()}: the end of the run took too long; exiting", file=sys.stderr, flush=True
    )
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os._exit(128 + signum)


#: The process's one stop request (``launch.main`` installs it; the training loop asks it).
STOP = StopRequest()
