"""Faults and delays on purpose, for the robustness tests (environment variables, read at the call site).

``DIGENRL_INJECT_FAULT="rank=R,iteration=I[,kind=raise|kill][,phase=start|tag]"`` makes rank R raise (or
SIGKILL itself) at the start of iteration I (``phase=start``, the default) or right after a TAG helper on
rank R claimed a fragment of iteration I (``phase=tag``: a helper dying mid-generation).

``DIGENRL_INJECT_DELAY="rank=R,phase=P,seconds=S"`` makes rank R sleep S seconds each time it enters
phase P (``train``: before each fragment it trains) — a deliberately slow trainer forces TCSS to start
iterations with the previous policy.

Neither variable is meant for users; unset, both cost one environment lookup.
"""

from __future__ import annotations

import os
import signal
import time

FAULT_VAR = "DIGENRL_INJECT_FAULT"
DELAY_VAR = "DIGENRL_INJECT_DELAY"


def _spec(name: str) -> dict[str, str] | None:
    raw = os.environ.get(name)
    if not raw:
        return None
    return dict(item.split("=", 1) for item in raw.split(","))


def inject_fault(rank: int, iteration: int, phase: str = "start") -> None:
    fields = _spec(FAULT_VAR)
    if fields is None or int(fields["rank"]) != rank or int(fields["iteration"]) != iteration:
        return
    if fields.get("phase", "start") != phase:
        return
    if fields.get("kind", "raise") == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"injected fault on rank {rank} at iteration {iteration} ({phase})")


def inject_delay(rank: int, phase: str) -> None:
    fields = _spec(DELAY_VAR)
    if fields is not None and int(fields["rank"]) == rank and fields["phase"] == phase:
        time.sleep(float(fields["seconds"]))
