"""Merge every rank's event log into one Chrome trace-event JSON file that Perfetto and chrome://tracing open.

Format: Google's "Trace Event Format"
(https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU): a JSON object
with a ``traceEvents`` list; complete events ``ph: "X"`` carry ``ts`` and ``dur`` in microseconds,
counter events ``ph: "C"`` carry numeric ``args``, metadata events ``ph: "M"`` name processes
(``process_name``) and threads (``thread_name``).

Mapping: one process per rank (``pid = rank``, named "rank r (role)"), one thread per phase *category*
(iteration markers, compute, communication, wait) so nested or concurrent spans of different kinds sit on
separate tracks; span args carry iteration / fragment / policy version / samples / extra.

A resumed run's logs hold several processes per rank, one after the other; the trace shows them all on
the run's one clock (``event_records.load_events``), including the spans a crash made the resumed run
redo, with ``superseded: true`` in their args.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from digenrl.runtime.observe.event_records import EVENTS_SUBDIR, load_events
from digenrl.runtime.observe.span_phases import Phase, is_idle_phase
from digenrl.runtime.run_folder.run_files import write_atomic

#: Track order inside each rank. Categories a span names explicitly get the next free track ids.
CATEGORY_TRACKS = {"iteration": 0, "compute": 1, "communication": 2, "wait": 3}
_COMMUNICATION_WORDS = (
    "send",
    "recv",
    "sync",
    "broadcast",
    "all_reduce",
    "allreduce",
    "gather",
    "scatter",
    "transfer",
    "comm",
)


def phase_category(phase: str) -> str:
    """Default track of a phase: iteration marker, wait (idle), communication, or compute."""
    if phase == Phase.ITERATION:
        return "iteration"
    if is_idle_phase(phase):
        return "wait"
    lowered = phase.lower()
    if any(word in lowered for word in _COMMUNICATION_WORDS):
        return "communication"
    return "compute"


def merge_chrome_trace(out_dir: str | Path, path: str | Path | None = None) -> Path:
    """Write ``out_dir/trace.json`` (or ``path``) from ``out_dir/events/rank*.jsonl`` and return its path.

    Rank 0 calls it at the end of a run, after every rank closed its ``EventLogger``; for a run that
    crashed, ``python -m digenrl.runtime.observe.run_report OUT_DIR`` calls it on the logs the ranks left
    (every record up to a rank's death is in its log: ``digenrl/runtime/observe/events.py``).
    """
    records = load_events(out_dir, superseded=True)
    events: list[dict[str, Any]] = []
    roles: dict[int, str] = {}
    origins: list[float] = []
    tracks: dict[str, int] = dict(CATEGORY_TRACKS)
    used_tracks: set[tuple[int, int]] = set()

    for record in records:
        rank = int(record["rank"])
        roles.setdefault(rank, str(record.get("role", "?")))
        kind = record["type"]
        if kind == "meta":
            origins.append(float(record["clock_origin"]))
        elif kind == "span":
            category = record.get("category") or phase_category(record["phase"])
            tid = tracks.setdefault(category, len(tracks))
            used_tracks.add((rank, tid))
            args = {
                key: record[key]
                for key in ("iteration", "fragment", "policy_version", "samples")
                if record.get(key) is not None
            }
            args.update(record.get("extra") or {})
            if record.get("superseded"):
                args["superseded"] = True
            events.append(
                {
                    "name": record["phase"],
                    "cat": category,
                    "ph": "X",
                    "ts": _us(record["t_start"]),
                    "dur": max(0.0, _us(record["t_end"]) - _us(record["t_start"])),
                    "pid": rank,
                    "tid": tid,
                    "args": args,
                }
            )
        elif kind == "counter":
            for series, value in record["values"].items():
                events.append(
                    {
                        "name": f"{record['name']}.{series}",
                        "ph": "C",
                        "ts": _us(record["t"]),
                        "pid": rank,
                        "args": {series: value},
                    }
                )
        elif kind == "note":
            events.append(
                {
                    "name": record["message"],
                    "ph": "i",
                    "s": "p",
                    "ts": _us(record["t"]),
                    "pid": rank,
                    "tid": 0,
                }
            )

    names_by_tid = {tid: category for category, tid in tracks.items()}
    metadata: list[dict[str, Any]] = []
    for rank in sorted(roles):
        metadata.append(
            {"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank} ({roles[rank]})"}}
        )
        metadata.append({"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}})
    for rank, tid in sorted(used_tracks):
        metadata.append(
            {"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": names_by_tid[tid]}}
        )

    target = Path(path) if path is not None else Path(out_dir) / "trace.json"
    trace = {
        "traceEvents": metadata + sorted(events, key=lambda event: (event["pid"], event["ts"])),
        "displayTimeUnit": "ms",
        "otherData": {
            "clock_origin_unix_s": min(origins) if origins else None,
            "time_unit_note": "ts/dur are microseconds since the shared clock origin",
        },
    }
    write_atomic(target, json.dumps(trace))  # atomic: a reader never sees half a trace
    return target


def trace_is_stale(out_dir: str | Path) -> bool:
    """Whether ``out_dir/trace.json`` is missing or older than one of the event logs (a run that crashed
    before it merged them, or was resumed and crashed again)."""
    trace = Path(out_dir) / "trace.json"
    logs = list((Path(out_dir) / EVENTS_SUBDIR).glob("rank*.jsonl"))
    if not trace.is_file():
        return bool(logs)
    return any(log.stat().st_mtime > trace.stat().st_mtime for log in logs)


def _us(seconds: float) -> float:
    return round(float(seconds) * 1e6, 3)
