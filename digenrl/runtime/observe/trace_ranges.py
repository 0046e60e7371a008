"""Nested host ranges of a profiler trace, indexed per thread: which range holds a moment.

A Kineto trace's host-side ranges (the project's phase ranges, operators) nest on each thread; the
innermost one holding a moment is the latest-starting one at or before it that has not ended. Shared by
the per-phase kernel attribution (:mod:`~digenrl.runtime.observe.iteration_profile`) and the idle-gap
causes (:mod:`~digenrl.runtime.observe.idle_gaps`).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any

Range = tuple[str, float, float, Any]
"""(name, start µs, end µs, thread id) of one profiler range."""

ThreadIndex = tuple[list[float], list[Range], list[int]]
"""One thread's ranges by start, their starts, and each range's enclosing range (its position, -1: none)."""


def by_thread(ranges: list[Range]) -> dict[Any, ThreadIndex]:
    """Each thread's ranges by start (an enclosing range before a nested one that starts with it), their
    starts and enclosing ranges, for :func:`innermost_at`: a moment is looked up in O(log n + depth)."""
    threads: dict[Any, list[Range]] = defaultdict(list)
    for r in ranges:
        threads[r[3]].append(r)
    index = {}
    for tid, rs in threads.items():
        rs.sort(key=lambda r: (r[1], r[1] - r[2]))
        parents, open_ = [], []  # open_: positions of the ranges enclosing the current one
        for i, r in enumerate(rs):
            while open_ and rs[open_[-1]][2] <= r[1]:
                open_.pop()
            parents.append(open_[-1] if open_ else -1)
            open_.append(i)
        index[tid] = ([r[1] for r in rs], rs, parents)
    return index


def innermost_at(t_us: float, index: ThreadIndex) -> Range | None:
    """The innermost range of one thread holding ``t_us``: ranges of one thread nest, so it is the latest
    starting one at or before ``t_us`` if it has not ended, else the nearest of its enclosing ranges that
    has not (a range holding ``t_us`` that started earlier encloses it)."""
    starts, ranges, parents = index
    i = bisect.bisect_right(starts, t_us) - 1
    while i >= 0:
        if ranges[i][2] > t_us:
            return ranges[i]
        i = parents[i]
    return None
