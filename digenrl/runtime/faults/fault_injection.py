"""Faults and delays on purpose, for the robustness tests (environment variables, read at the call site).

``DIGENRL_INJECT_FAULT="rank=R,iteration=I[,kind=raise|kill|stop][,phase=P][,seconds=S][,after=PATH]"``
makes rank R fail at a point of iteration I named by ``phase``:

* ``start`` (the default): the start of the iteration, in the outer loop;
* ``tag``: right after a TAG helper on rank R claimed a fragment (a helper dying mid-generation);
* any span phase (``generate``, ``train``, ``sync``, …): on entering that span
  (``EventLogger.span``), so the rank is *in* that phase when it fails.

``kind=raise`` raises, ``kind=kill`` SIGKILLs the process, ``kind=stop`` SIGSTOPs it — a hung rank, for
the heartbeat watchdog (``digenrl/runtime/faults/watchdog.py``). A stopped rank first stays alive in the phase
for ``seconds`` (default 0), so a heartbeat can carry the phase before it freezes; it prints one line
with its pid and the unix time at which it stops. ``after=PATH`` makes the rank first wait until PATH
exists (at most ``AFTER_TIMEOUT_S``): a generator rank runs ahead of the trainer ranks that publish a
checkpoint, so a test that asserts which checkpoint survives a fault names the file the fault must follow
(e.g. ``<out_dir>/checkpoints/latest``) instead of racing the writer.

``DIGENRL_INJECT_DELAY="rank=R,phase=P,seconds=S[;rank=R2,phase=P2,seconds=S2…]"`` makes rank R sleep S
seconds each time it enters phase P (``train``: before each fragment it trains; ``generate``: before each
fragment a generator rank runs its steps of; ``exit``: after the run, before the watchdog stops) — a
deliberately slow rank. Several delays, separated by ``;``, force an interleaving of several ranks (a slow
trainer and a slower generator).

Neither variable is meant for users; unset, both cost one environment lookup.
"""

from __future__ import annotations

import os
import signal
import sys
import time

FAULT_VAR = "DIGENRL_INJECT_FAULT"
DELAY_VAR = "DIGENRL_INJECT_DELAY"
FAULT_KINDS = ("raise", "kill", "stop")
AFTER_TIMEOUT_S = 120.0


def _spec(name: str) -> dict[str, str] | None:
    raw = os.environ.get(name)
    if not raw:
        return None
    return dict(item.split("=", 1) for item in raw.split(","))


def inject_fault(rank: int, iteration: int | None, phase: str = "start") -> None:
    fields = _spec(FAULT_VAR)
    if fields is None or int(fields["rank"]) != rank or int(fields["iteration"]) != iteration:
        return
    if fields.get("phase", "start") != phase:
        return
    kind = fields.get("kind", "raise")
    if kind not in FAULT_KINDS:
        raise ValueError(f"{FAULT_VAR}: kind={kind!r}; allowed: {', '.join(FAULT_KINDS)}")
    if "after" in fields:
        _wait_for(fields["after"], rank)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "stop":
        time.sleep(float(fields.get("seconds", 0)))
        print(
            f"[rank {rank}] injected stop: SIGSTOP of pid {os.getpid()} in phase '{phase}' of iteration "
            f"{iteration} at unix time {time.time():.3f}",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGSTOP)
        return  # continued by a SIGCONT
    raise RuntimeError(f"injected fault on rank {rank} at iteration {iteration} ({phase})")


def _wait_for(path: str, rank: int) -> None:
    deadline = time.monotonic() + AFTER_TIMEOUT_S
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"[rank {rank}] {FAULT_VAR}: after={path} did not appear in {AFTER_TIMEOUT_S:.0f} s"
            )
        time.sleep(0.02)


def inject_delay(rank: int, phase: str) -> None:
    raw = os.environ.get(DELAY_VAR)
    if not raw:
        return
    for spec in raw.split(";"):
        fields = dict(item.split("=", 1) for item in spec.split(","))
        if int(fields["rank"]) == rank and fields["phase"] == phase:
            time.sleep(float(fields["seconds"]))
