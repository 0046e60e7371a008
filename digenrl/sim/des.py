"""A minimal process-oriented discrete-event kernel (heapq event queue), in the style of SimPy.

A *process* is a Python generator that yields what it waits for:

- ``Delay(seconds)`` — it is busy (or asleep) for that long;
- a :class:`Signal` — it blocks until the signal fires and receives the fired value.

The kernel keeps a heap of ``(time, sequence, callback)``; ties at one instant run in scheduling order,
so a run is deterministic. Schedules in :mod:`digenrl.sim.schedules` are written as one process per
rank (plus a few helpers), so the code reads like the timeline it produces. After :meth:`Simulation.run`
every process must have finished: a process still blocked means the schedule deadlocked, and the error
names it instead of returning a silently truncated timeline. The opposite fault, a process that loops
without ever yielding (a livelock: simulated time stands still and the run never ends), is caught by a
:class:`StallGuard` in the loops that decide what to do next.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

Process = Generator[Any, Any, Any]


@dataclass(frozen=True)
class Delay:
    """Yielded by a process: resume it ``seconds`` later."""

    seconds: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.seconds) and self.seconds >= 0):
            raise ValueError(f"Delay.seconds must be finite and >= 0, got {self.seconds!r}")


class Signal:
    """A one-shot event. ``fire(value)`` wakes every waiter at the current simulated time."""

    def __init__(self, sim: Simulation, name: str = "") -> None:
        self.sim = sim
        self.name = name
        self.fired = False
        self.value: Any = None
        self._waiters: list[Callable[[Any], None]] = []

    def fire(self, value: Any = None) -> None:
        if self.fired:
            raise RuntimeError(f"signal {self.name!r} fired twice")
        self.fired, self.value = True, value
        for waiter in self._waiters:
            self.sim.call_at(self.sim.now, lambda w=waiter: w(value))
        self._waiters.clear()

    def on_fire(self, callback: Callable[[Any], None]) -> None:
        if self.fired:
            self.sim.call_at(self.sim.now, lambda: callback(self.value))
        else:
            self._waiters.append(callback)


class Condition:
    """Wake-up for "wait until a predicate over shared state holds": ``while not p(): yield cond.wait()``.

    Whoever changes the state calls :meth:`notify_all`; each wait gets a fresh signal.
    """

    def __init__(self, sim: Simulation, name: str = "") -> None:
        self.sim = sim
        self.name = name
        self._signal: Signal | None = None

    def wait(self) -> Signal:
        if self._signal is None:
            self._signal = Signal(self.sim, self.name)
        return self._signal

    def notify_all(self) -> None:
        if self._signal is not None:
            signal, self._signal = self._signal, None
            signal.fire()


class StallGuard:
    """Raises when a process's decision loop turns ``limit`` times at one simulated instant.

    A loop that waits on a predicate that already holds, or skips work it cannot do, never yields: the
    event loop never runs again and the simulation hangs with no error. Each pass of such a loop calls
    :meth:`check`; passes that do work move time on (or are bounded by the work there is), so more than
    ``limit`` passes at one instant can only be a schedule bug, reported with ``what``."""

    def __init__(self, sim: Simulation, limit: int, what: str) -> None:
        self.sim, self.limit, self.what = sim, limit, what
        self._at, self._passes = -1.0, 0

    def check(self, **state: Any) -> None:
        if self.sim.now != self._at:
            self._at, self._passes = self.sim.now, 0
        self._passes += 1
        if self._passes > self.limit:
            detail = ", ".join(f"{k}={v!r}" for k, v in state.items())
            raise RuntimeError(
                f"simulation stalled: {self.what} looped {self._passes} times at t={self.sim.now:.6g} s "
                f"without simulated time passing ({detail}); a schedule bug, not a cost"
            )


class Mailbox:
    """FIFO of items; ``get()`` returns a signal fired with the next item (getters served in order)."""

    def __init__(self, sim: Simulation, name: str = "") -> None:
        self.sim = sim
        self.name = name
        self._items: deque[Any] = deque()
        self._getters: deque[Signal] = deque()

    def put(self, item: Any) -> None:
        if self._getters:
            self._getters.popleft().fire(item)
        else:
            self._items.append(item)

    def get(self) -> Signal:
        signal = Signal(self.sim, f"get {self.name}")
        if self._items:
            signal.fire(self._items.popleft())
        else:
            self._getters.append(signal)
        return signal

    def __len__(self) -> int:
        return len(self._items)


class Simulation:
    """The event loop: simulated time ``now`` (seconds), a heap of callbacks, and the live processes."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._sequence = itertools.count()
        self._live: dict[int, str] = {}

    def call_at(self, time: float, callback: Callable[[], None]) -> None:
        if time < self.now:
            raise ValueError(f"cannot schedule at t={time} before now={self.now}")
        heapq.heappush(self._heap, (time, next(self._sequence), callback))

    def signal(self, name: str = "") -> Signal:
        return Signal(self, name)

    def spawn(self, process: Process, name: str) -> Signal:
        """Start ``process`` now; the returned signal fires with its return value when it ends."""
        done = Signal(self, f"{name} done")
        key = next(self._sequence)
        self._live[key] = name
        self.call_at(self.now, lambda: self._resume(process, key, done, None))
        return done

    def _resume(self, process: Process, key: int, done: Signal, value: Any) -> None:
        try:
            item = process.send(value)
        except StopIteration as stop:
            del self._live[key]
            done.fire(stop.value)
            return
        if isinstance(item, Delay):
            self.call_at(self.now + item.seconds, lambda: self._resume(process, key, done, None))
        elif isinstance(item, Signal):
            item.on_fire(lambda v: self._resume(process, key, done, v))
        else:
            raise TypeError(f"process {self._live[key]!r} yielded {item!r}; yield a Delay or a Signal")

    def run(self) -> float:
        """Run until no event is left; returns the final time. Raises if a process never finished."""
        while self._heap:
            time, _, callback = heapq.heappop(self._heap)
            self.now = time
            callback()
        if self._live:
            names = sorted(self._live.values())
            raise RuntimeError(
                f"simulation deadlocked at t={self.now:.6g}s: {len(names)} process(es) still blocked: "
                + ", ".join(names[:8])
                + (" …" if len(names) > 8 else "")
            )
        return self.now
