"""Per-iteration numbers from the event logs (docs/design.md §5): phase time, pool busy fraction, samples/s.

Definitions (per iteration k):

- window: the extent of the ``iteration`` marker spans tagged k (earliest start to latest end over all
  ranks); without markers, the extent of all spans tagged k. ``wall_s`` is its length.
- ``phase_seconds[role][phase]``: summed duration of spans tagged k, by the role of their rank. Sums over
  ranks, so 4 generators rolling out for 10 s each give 40 s.
- ``busy_fraction[role]``: for each rank of the pool, the length of the *union* of its work spans (any
  iteration tag: what matters is whether the device was busy inside the window) clipped to the window;
  summed over the pool's ranks and divided by ``ranks × wall_s``. Overlapping spans on one rank (a
  background reward thread beside generation) count once. Idle phases (``idle``, ``wait*``) and the
  ``iteration`` marker are not work. Pool size comes from every rank's log, so a rank that did nothing
  in the window counts as fully idle.
- ``busy_gpu_s``: total busy device-seconds in the window; ``bubble_free_bound_s`` = that / all ranks,
  the makespan a perfect schedule of the same work would need (docs/design.md §5).
- ``samples[phase]`` / ``samples_per_s[phase]``: summed ``samples`` of spans tagged k per phase, and that
  over ``wall_s`` (e.g. ``samples_per_s["train"]`` is trained samples per second).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from digenrl.runtime.observe.event_records import load_events
from digenrl.runtime.observe.span_phases import Phase, is_work_phase


def summarize_events(out_dir: str | Path) -> dict[int, dict[str, Any]]:
    """``summarize_records`` over every rank's log in ``out_dir/events``."""
    return summarize_records(load_events(out_dir))


def summarize_records(records: Iterable[Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """Summary per iteration (keys: iteration numbers, ascending). See the module docstring."""
    records = list(records)
    role_of_rank: dict[int, str] = {}
    for record in records:
        role_of_rank.setdefault(int(record["rank"]), str(record["role"]))
    spans = [record for record in records if record["type"] == "span"]
    ranks_by_role: dict[str, list[int]] = defaultdict(list)
    for rank, role in sorted(role_of_rank.items()):
        ranks_by_role[role].append(rank)
    work_by_rank: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for span in spans:
        if is_work_phase(span["phase"]):
            work_by_rank[int(span["rank"])].append((float(span["t_start"]), float(span["t_end"])))

    iterations = sorted({int(span["iteration"]) for span in spans if span.get("iteration") is not None})
    summary: dict[int, dict[str, Any]] = {}
    for iteration in iterations:
        tagged = [span for span in spans if span.get("iteration") == iteration]
        markers = [span for span in tagged if span["phase"] == Phase.ITERATION] or tagged
        start = min(float(span["t_start"]) for span in markers)
        end = max(float(span["t_end"]) for span in markers)
        wall = end - start

        phase_seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        samples: dict[str, int] = defaultdict(int)
        for span in tagged:
            if span["phase"] == Phase.ITERATION:
                continue
            phase_seconds[str(span["role"])][span["phase"]] += float(span["t_end"]) - float(span["t_start"])
            if span.get("samples") is not None:
                samples[span["phase"]] += int(span["samples"])

        busy_by_rank = {rank: union_length(work_by_rank.get(rank, []), start, end) for rank in role_of_rank}
        busy_fraction = {
            role: (sum(busy_by_rank[rank] for rank in ranks) / (len(ranks) * wall) if wall > 0 else 0.0)
            for role, ranks in ranks_by_role.items()
        }
        busy_gpu_s = sum(busy_by_rank.values())
        summary[iteration] = {
            "t_start": start,
            "t_end": end,
            "wall_s": wall,
            "ranks": {role: list(ranks) for role, ranks in ranks_by_role.items()},
            "phase_seconds": {role: dict(phases) for role, phases in phase_seconds.items()},
            "busy_seconds": busy_by_rank,
            "busy_fraction": busy_fraction,
            "busy_gpu_s": busy_gpu_s,
            "bubble_free_bound_s": busy_gpu_s / len(role_of_rank) if role_of_rank else 0.0,
            "samples": dict(samples),
            "samples_per_s": {phase: (count / wall if wall > 0 else 0.0) for phase, count in samples.items()},
        }
    return summary


def steady_window(out_dir: str | Path, first_iteration: int) -> dict[str, float]:
    """Busy device-seconds over the steady window of a run: from the end of iteration
    ``first_iteration − 1`` (its last ``optimizer`` span: an iteration ends when its update is committed)
    to the end of the run's last iteration. Per-iteration windows overlap when generation runs ahead
    (TCSS, the async baseline), so a run-level number needs one window: ``bubble_free_bound_s`` = busy /
    ranks, busy / (ranks · window) is the mean busy fraction, and achieved / bubble-free throughput
    equals it. After a resume the window never reaches back into the process before it: the time
    between a crash and the restart is no one's work."""
    records = load_events(out_dir)
    ranks = {int(r["rank"]) for r in records}
    spans = [r for r in records if r["type"] == "span" and r.get("iteration") is not None]
    ends: dict[int, float] = defaultdict(float)
    for span in spans:
        if span["phase"] == "optimizer":
            ends[int(span["iteration"])] = max(ends[int(span["iteration"])], float(span["t_end"]))
    later = [s for s in spans if int(s["iteration"]) >= first_iteration]
    if not later or not ranks:
        return {"window_s": 0.0, "busy_gpu_s": 0.0, "ranks": float(len(ranks)), "bubble_free_bound_s": 0.0}
    first_start = min(float(s["t_start"]) for s in later)
    segment_start = max(
        (float(r["t"]) for r in records if r["type"] == "meta" and r["t"] <= first_start), default=0.0
    )
    previous_end = ends.get(first_iteration - 1)
    start = previous_end if previous_end is not None and previous_end >= segment_start else first_start
    end = max(ends.values()) if ends else max(float(s["t_end"]) for s in later)
    work: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for span in records:
        if span["type"] == "span" and is_work_phase(span["phase"]):
            work[int(span["rank"])].append((float(span["t_start"]), float(span["t_end"])))
    busy = sum(union_length(work.get(rank, []), start, end) for rank in ranks)
    return {
        "window_s": end - start,
        "busy_gpu_s": busy,
        "ranks": float(len(ranks)),
        "bubble_free_bound_s": busy / len(ranks),
    }


def union_length(intervals: Iterable[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of ``intervals`` clipped to ``[lo, hi]`` (sweep over sorted starts)."""
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo))
    total = 0.0
    current_start: float | None = None
    current_end = 0.0
    for a, b in clipped:
        if current_start is None or a > current_end:
            if current_start is not None:
                total += current_end - current_start
            current_start, current_end = a, b
        else:
            current_end = max(current_end, b)
    if current_start is not None:
        total += current_end - current_start
    return total
