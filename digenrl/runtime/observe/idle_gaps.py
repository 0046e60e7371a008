"""Where the device waits for the host, and what the host was doing then: the idle gaps of a profiled
iteration and the host calls that synchronise with the device (``runtime.profile_iteration``).

The per-phase table of :mod:`~digenrl.runtime.observe.iteration_profile` gives idle = wall − busy per phase;
issue 37 asks which host work leaves the device idle (a ``.item()``, a device-to-host copy, Python between
kernels, a compiled region's guards). A Kineto trace has what answers it:

* the device's busy intervals (kernels, copies, memsets of every stream, merged): a **gap** is the time
  between the end of one busy interval and the start of the next. It belongs to the phase that launched the
  kernel after it (the phase the device waited for), clipped to that phase's host range, so score's host
  work between generation's last kernel and training's first is not training's idle;
* its **cause**, in this order: a synchronising runtime call (:data:`SYNC_CALLS`) that returned during the
  gap or just before it (the host waited for the queue to drain, then spent the gap catching up), named by
  the host operator that made it (``aten::_local_scalar_dense`` is an ``.item()``); else the outermost host
  operator of the launching thread that overlaps the gap most (the host was busy in it, e.g. an
  ``autograd::engine::evaluate_function`` or a compiled region), with the CUDA runtime or driver call the
  host spent at least half of the gap in, if one did (``host in aten::contiguous (cudaMalloc)``: an
  allocation, not the operator's own work); else ``python (between operators)``;
* the **host syncs** per phase: how many synchronising calls and how long the host blocked in them.

Kineto's event categories (``cpu_op``, ``user_annotation``, ``cuda_runtime`` / ``cuda_driver``, ``kernel``,
``gpu_memcpy``, ``gpu_memset``) and the ``correlation`` that ties a launch to its kernel are PyTorch's
profiler trace format (PyTorch docs, "PyTorch Profiler"; ``export_chrome_trace``).
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from digenrl.runtime.observe.trace_ranges import Range, ThreadIndex, by_thread, innermost_at

#: CUDA runtime / driver calls that block the host until the device (a stream, an event, or everything)
#: has finished: ``.item()``, ``.cpu()``, ``.tolist()``, ``torch.cuda.synchronize`` and blocking copies end
#: in one of these (CUDA Runtime API, "API synchronization behavior")
SYNC_CALLS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
        "cuMemcpyDtoH_v2",
    }
)
#: gaps shorter than this are launch spacing, counted in the total but not attributed one by one
MIN_GAP_US = 20.0
#: a sync that returned up to this long before a gap opened still caused it (the host's return path)
SYNC_SLACK_US = 20.0
#: host-side event categories that name what the host was doing
HOST_OP_CATEGORIES = ("cpu_op", "user_annotation")
PYTHON_BETWEEN_OPS = "python (between operators)"
#: a gap is also named by the CUDA runtime / driver call the host spent at least this share of it in
RUNTIME_CALL_SHARE = 0.5

Interval = tuple[float, float]


def busy_intervals(device_events: list[dict]) -> list[Interval]:
    """The device's busy time as disjoint intervals (µs): every device event of every stream, merged."""
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in device_events)
    merged: list[list[float]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def _range(e: dict) -> Range:
    return (str(e.get("name", "")), float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), e.get("tid"))


class _OutermostOps:
    """One thread's outermost host operators by start, to find the one that overlaps a gap most."""

    def __init__(self, events: list[dict]) -> None:
        ops = sorted(
            (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), str(e.get("name", "")))
            for e in events
        )
        outer: list[tuple[float, float, str]] = []
        for op in ops:
            if outer and op[1] <= outer[-1][1]:
                continue  # nested in the previous outermost operator
            outer.append(op)
        self.ops = outer
        self.starts = [op[0] for op in outer]

    def dominant(self, lo: float, hi: float) -> tuple[str | None, float]:
        """The operator that overlaps [lo, hi] most and by how many µs (None, 0 when none does)."""
        i = max(bisect.bisect_right(self.starts, lo) - 1, 0)
        best, best_overlap = None, 0.0
        while i < len(self.ops) and self.ops[i][0] < hi:
            start, end, name = self.ops[i]
            overlap = min(end, hi) - max(start, lo)
            if overlap > best_overlap:
                best, best_overlap = name, overlap
            i += 1
        return best, best_overlap


def analyse_idle(
    events: list[dict],
    device_events: list[dict],
    device_phase: Callable[[dict], tuple[str, Interval | None]],
    host_phase: Callable[[float, Any], str],
    *,
    min_gap_us: float = MIN_GAP_US,
    top: int = 6,
) -> dict[str, dict[str, Any]]:
    """Per phase: ``idle_gaps`` (the gaps between busy intervals, their causes) and ``host_syncs``.

    ``events``: the trace's complete events; ``device_events``: its kernels / copies / memsets;
    ``device_phase(e)``: the phase of a device event and the host range (start, end µs) of that phase that
    launched it (None when unknown), which clips a gap to the phase's own time; ``host_phase(t, tid)``: the
    phase open on a host thread at ``t`` (where a sync was made).
    """
    host_ops: dict[Any, list[dict]] = defaultdict(list)
    runtime_calls: dict[Any, list[dict]] = defaultdict(list)
    syncs: list[dict] = []
    launches: dict[Any, dict] = {}
    for e in events:
        cat = e.get("cat")
        if cat in HOST_OP_CATEGORIES and not str(e.get("name", "")).startswith("digenrl/"):
            host_ops[e.get("tid")].append(e)
        elif cat in ("cuda_runtime", "cuda_driver"):
            runtime_calls[e.get("tid")].append(e)
            if e.get("name") in SYNC_CALLS:
                syncs.append(e)
            correlation = e.get("args", {}).get("correlation")
            if correlation is not None:
                launches[correlation] = e
    # per thread, built on demand: the outermost host operators and the outermost CUDA runtime / driver calls
    outermost: dict[Any, _OutermostOps] = {}
    outermost_calls: dict[Any, _OutermostOps] = {}

    def dominant_on(
        index: dict[Any, _OutermostOps], events: dict[Any, list[dict]], tid: Any, lo: float, hi: float
    ) -> tuple[str | None, float]:
        if tid not in events:
            return None, 0.0
        if tid not in index:
            index[tid] = _OutermostOps(events[tid])
        return index[tid].dominant(lo, hi)

    innermost: dict[Any, ThreadIndex] = {}  # built for the threads that synchronised only

    def sync_name(s: dict) -> str:
        tid = s.get("tid")
        if tid in host_ops and tid not in innermost:
            innermost[tid] = by_thread([_range(e) for e in host_ops[tid]])[tid]
        holder = innermost_at(float(s["ts"]), innermost[tid]) if tid in innermost else None
        return f"{s['name']} in {holder[0]}" if holder else str(s["name"])

    sync_ends = sorted((float(s["ts"]) + float(s.get("dur", 0.0)), i) for i, s in enumerate(syncs))
    sync_end_times = [t for t, _ in sync_ends]
    gap_totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])  # count, seconds, short gaps s
    gap_causes: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    sync_totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])  # count, seconds blocked
    sync_where: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    for s in syncs:
        phase, seconds = host_phase(float(s["ts"]), s.get("tid")), float(s.get("dur", 0.0)) / 1e6
        sync_totals[phase][0] += 1
        sync_totals[phase][1] += seconds
        where = sync_where[phase][sync_name(s)]
        where[0] += seconds
        where[1] += 1

    ordered = sorted(device_events, key=lambda e: float(e["ts"]))
    starts = [float(e["ts"]) for e in ordered]
    for (_, prev_end), (next_start, _) in itertools.pairwise(busy_intervals(ordered)):
        nxt = ordered[bisect.bisect_left(starts, next_start)]
        phase, span = device_phase(nxt)
        lo, hi = (prev_end if span is None else max(prev_end, span[0])), next_start
        if hi <= lo:
            continue
        totals = gap_totals[phase]
        if hi - lo < min_gap_us:
            totals[2] += (hi - lo) / 1e6
            continue
        totals[0] += 1
        totals[1] += (hi - lo) / 1e6
        cause = None
        i = bisect.bisect_left(sync_end_times, lo - SYNC_SLACK_US)
        if i < len(sync_ends) and sync_ends[i][0] <= hi:
            cause = "after " + sync_name(syncs[sync_ends[i][1]])
        if cause is None:
            launch = launches.get(nxt.get("args", {}).get("correlation"))
            tid = None if launch is None else launch.get("tid")
            name, _ = dominant_on(outermost, host_ops, tid, lo, hi)
            cause = f"host in {name}" if name else PYTHON_BETWEEN_OPS
            call, overlap = dominant_on(outermost_calls, runtime_calls, tid, lo, hi)
            if call is not None and overlap >= RUNTIME_CALL_SHARE * (hi - lo):
                cause += (
                    f" ({call})"  # the host spent the gap in one CUDA call: a cudaMalloc, a cudaHostAlloc
                )
        slot = gap_causes[phase][cause]
        slot[0] += (hi - lo) / 1e6
        slot[1] += 1

    return {
        phase: {
            "idle_gaps": {
                "count": int(gap_totals[phase][0]),
                "seconds": gap_totals[phase][1],
                "min_gap_us": min_gap_us,
                "short_gaps_seconds": gap_totals[phase][2],
                "causes": _ranked(gap_causes[phase], top),
            },
            "host_syncs": {
                "count": int(sync_totals[phase][0]),
                "seconds": sync_totals[phase][1],
                "where": _ranked(sync_where[phase], top),
            },
        }
        for phase in set(gap_totals) | set(sync_totals)
    }


def _ranked(table: dict[str, list[float]], top: int) -> list[dict[str, Any]]:
    rows = sorted(table.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"name": name, "seconds": s, "count": int(n)} for name, (s, n) in rows]


def format_idle(phases: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown lines: per phase the idle in gaps, its largest causes, and the host syncs."""
    min_gap_us = next(iter(phases.values()))["idle_gaps"]["min_gap_us"] if phases else MIN_GAP_US
    lines = [
        "",
        f"Where the device waited: gaps of at least {min_gap_us:.0f} µs between busy intervals, by the "
        'host work during them (docs/operations.md, "Profiling an iteration").',
        "",
        "| phase | idle in gaps s (gaps) | shorter gaps s | largest causes: s (gaps) "
        "| host syncs (s blocked) | syncs by caller (count) |",
        "|---|---:|---:|---|---:|---|",
    ]
    for phase, row in phases.items():
        gaps, host = row["idle_gaps"], row["host_syncs"]
        if gaps["count"] == 0 and host["count"] == 0 and gaps["short_gaps_seconds"] == 0:
            continue
        causes = "; ".join(f"{_cell(c['name'])} {c['seconds']:.3f} ({c['count']})" for c in gaps["causes"])
        where = "; ".join(f"{_cell(w['name'])} ({w['count']})" for w in host["where"])
        lines.append(
            f"| {phase} | {gaps['seconds']:.3f} ({gaps['count']}) | {gaps['short_gaps_seconds']:.3f} "
            f"| {causes or '-'} | {host['count']} ({host['seconds']:.3f}) | {where or '-'} |"
        )
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "/")[:90]
