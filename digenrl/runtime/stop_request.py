"""SIGTERM — the usual way a cluster ends a job (SLURM ``scancel``, a Kubernetes pod's deletion, a job
scheduler's time limit) — ends a run with a checkpoint instead of losing the iterations since the last one
(issue 35, item 6).

The handler only records the signal. At the end of every iteration all ranks agree whether any of them got
one (a MAX all-reduce of one flag, so every rank stops after the same iteration, even when the signal
reached them at different times); if so each writes the final checkpoint at that step and the run ends as
it ends normally (event logs, trace, summary), and ``launch.main`` exits with 128 + SIGTERM.

Nothing may hang on it: :data:`STOP_GRACE_S` without reaching the next iteration's end (a rank blocked in a
collective whose peer is gone), or :data:`FINISH_GRACE_S` of teardown after the checkpoint, ends the
process with status 128 + SIGTERM. A repeated
SIGTERM changes nothing (a launcher and torchrun both forward the one cancellation); SIGINT (Ctrl-C) and
SIGKILL still end a run at once. Schedulers give about 30 s between SIGTERM and SIGKILL (SLURM
``KillWait``, Kubernetes ``terminationGracePeriodSeconds``, torchrun's shutdown and this project's
launcher, digenrl/runtime/job.py), so a run whose iteration plus checkpoint takes longer loses what it loses
without the handler, no more.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from digenrl.runtime.distributed import DistContext

#: Seconds between SIGTERM and the process's end when the next iteration boundary is not reached.
STOP_GRACE_S = 25.0
#: Seconds the end of the run (logs, trace) gets once the stop's checkpoint is written.
FINISH_GRACE_S = 5.0


class StopRequest:
    """Whether this process was asked to stop (SIGTERM), and the agreement of all ranks on it."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.grace_s = STOP_GRACE_S
        self._previous: object = None
        self._installed = False
        self._timer: threading.Timer | None = None

    def install(self, grace_s: float = STOP_GRACE_S) -> None:
        """Handle SIGTERM from now on (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is not threading.main_thread() or self._installed:
            return
        self.grace_s = grace_s
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
            f"[digenrl] pid {os.getpid()} received {signal.Signals(signum).name}: writing a checkpoint at "
            f"the end of this iteration, then exiting (within {self.grace_s:g} s)",
            file=sys.stderr,
            flush=True,
        )
        self._timer = threading.Timer(self.grace_s, _die, args=(signum,))
        self._timer.daemon = True
        self._timer.start()

    def finishing(self, grace_s: float = FINISH_GRACE_S) -> None:
        """The checkpoint is written: give the end of the run (logs, trace) ``grace_s`` more, no longer.
        Under torchrun the agent that got the signal is going away with the store the ranks' teardown
        meets in, so a teardown that waits on it must not hold the job (or its checkpoint) hostage."""
        if self._timer is not None:
            self._timer.cancel()
        signum = self.signum or signal.SIGTERM
        self._timer = threading.Timer(grace_s, _die, args=(signum,))
        self._timer.daemon = True
        self._timer.start()

    def agreed(self, ctx: DistContext) -> bool:
        """Whether any rank was asked to stop; every rank must call it at the same point (a collective)."""
        flag = int(self.signum is not None)
        if not ctx.is_distributed:
            return bool(flag)
        device = ctx.device if dist.get_backend() == "nccl" else torch.device("cpu")
        tensor = torch.tensor([flag], dtype=torch.int32, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return bool(int(tensor.item()))


def _die(signum: int) -> None:
    """End this process now with the status a ``signum`` death reports to a shell (128 + signum); called
    from the grace timer's thread, where no signal handler can be changed."""
    print(f"[digenrl] pid {os.getpid()}: the stop took too long; exiting now", file=sys.stderr, flush=True)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os._exit(128 + signum)


#: The process's one stop request (``launch.main`` installs it; the training loop asks it).
STOP = StopRequest()
