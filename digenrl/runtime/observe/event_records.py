"""The on-disk format of profile event logs, and reading them back (docs/design.md §5).

Each rank writes ``<out_dir>/events/rank<r>.jsonl``, one JSON object per line, with a ``type``:

- ``meta``    — starts the records of one process: ``rank, role, clock_origin`` (unix seconds all ranks
  agreed on), ``host, pid``, ``run_id`` and ``start_iteration`` (the iteration it started at).
- ``span``    — ``rank, role, phase, iteration, fragment, policy_version, t_start, t_end`` (seconds since
  ``clock_origin``), optional ``samples``, ``category`` and ``extra`` (a dict).
- ``counter`` — ``rank, role, name, t, values`` (a dict of numbers), e.g. NVML utilisation samples.
- ``note``    — ``rank, role, t, message`` and optional fields (e.g. "GPU telemetry disabled: …").

Phase names are declared once, in :class:`digenrl.runtime.observe.span_phases.Phase` (``span_record`` refuses
others), with the conventions the summaries rely on: ``wait_*`` phases are idle time (a bubble), and
``iteration`` marks the extent of one iteration on a rank (it is not work either).

Resumed runs (docs/operations.md, "Runs: resume, overwrite and the lock"). A resumed process appends to its
rank's log, starting with a new ``meta`` record: one file then holds several *segments*, each timed against
its own clock origin. ``load_events`` puts every record on one clock — seconds since the earliest origin of
the run — and gives each ``meta`` record ``t``, the time its segment starts on that clock. A span of a segment
whose iteration a later segment ran again (it started at or before that iteration, from a checkpoint) was lost
with the crash: it is *superseded*, left out by default and marked ``superseded: true`` when asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from digenrl.runtime.observe.json_lines import read_json_lines
from digenrl.runtime.observe.span_phases import declared_phase

EVENTS_SUBDIR = "events"
RECORD_TYPES = ("meta", "span", "counter", "note")


def span_record(
    rank: int,
    role: str,
    phase: str,
    t_start: float,
    t_end: float,
    *,
    iteration: int | None = None,
    fragment: int | None = None,
    policy_version: int | None = None,
    samples: int | None = None,
    category: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One span in the shared event format, written by real runs and the simulator alike; ``phase`` must be
    a declared :class:`~digenrl.runtime.observe.span_phases.Phase` (its value is what the log holds)."""
    if not isinstance(phase, str):
        raise ValueError(f"phase must be a string, got {phase!r}")
    phase = declared_phase(phase).value
    if t_end < t_start:
        raise ValueError(
            f"span '{phase}' on rank {rank}: t_end ({t_end}) must not be before t_start ({t_start})"
        )
    record: dict[str, Any] = {
        "type": "span",
        "rank": rank,
        "role": role,
        "phase": phase,
        "iteration": iteration,
        "fragment": fragment,
        "policy_version": policy_version,
        "t_start": t_start,
        "t_end": t_end,
    }
    if samples is not None:
        record["samples"] = int(samples)
    if category is not None:
        record["category"] = category
    if extra:
        record["extra"] = dict(extra)
    return record


def rank_log_path(out_dir: str | Path, rank: int) -> Path:
    return Path(out_dir) / EVENTS_SUBDIR / f"rank{rank}.jsonl"


def load_events(out_dir: str | Path, *, superseded: bool = False) -> list[dict[str, Any]]:
    """All records of all ranks under ``out_dir/events``, ordered by (rank, file order), on one clock.

    Times are seconds since the run's first clock origin (see the module docstring); spans superseded by
    a resume are left out unless ``superseded`` (then they carry ``superseded: true``). A damaged line
    (torn by a kill, not JSON, not an event record) is skipped with a warning naming its line number.
    """
    events_dir = Path(out_dir) / EVENTS_SUBDIR
    paths = sorted(events_dir.glob("rank*.jsonl"), key=_rank_of_path)
    if not paths:
        raise ValueError(f"out_dir '{out_dir}' holds no event logs ({events_dir}/rank<r>.jsonl)")
    segments_by_file = [_read_segments(path) for path in paths]
    origins = [seg[0]["clock_origin"] for segs in segments_by_file for seg in segs if seg[0] is not None]
    run_origin = min(origins) if origins else 0.0
    records: list[dict[str, Any]] = []
    for segments in segments_by_file:
        restarts = [int(meta.get("start_iteration") or 0) for meta, _ in segments[1:] if meta is not None]
        for index, (meta, body) in enumerate(segments):
            shift = float(meta["clock_origin"]) - run_origin if meta is not None else 0.0
            redone = min(restarts[index:], default=None)  # earliest iteration a later segment started at
            if meta is not None:
                records.append({**meta, "t": shift})
            for record in body:
                lost = redone is not None and record["type"] == "span" and _at_or_after(record, redone)
                if lost and not superseded:
                    continue
                record = _shifted(record, shift)
                if lost:
                    record["superseded"] = True
                records.append(record)
    return records


def _read_segments(path: Path) -> list[tuple[dict[str, Any] | None, list[dict[str, Any]]]]:
    """The file's records split at each ``meta`` record: [(meta or None before the first, records)]. A
    damaged line is skipped with a warning naming its number (:mod:`digenrl.runtime.observe.json_lines`)."""
    segments: list[tuple[dict[str, Any] | None, list[dict[str, Any]]]] = [(None, [])]
    for record in read_json_lines(path, event_problem):
        if record["type"] == "meta":
            segments.append((record, []))
        else:
            segments[-1][1].append(record)
    return segments if segments[0][1] else segments[1:]


#: The fields each record type must carry as numbers (readers do arithmetic on them).
_NUMBER_FIELDS = {"meta": ("clock_origin",), "span": ("t_start", "t_end"), "counter": ("t",), "note": ("t",)}


def event_problem(record: Any) -> str:
    """Why ``record`` is not an event record ("" if it is one): a mapping with a known ``type`` and that
    type's numeric fields (``span`` also a phase name)."""
    if not isinstance(record, dict):
        return f"a {type(record).__name__}, not a record"
    kind = record.get("type")
    if kind not in RECORD_TYPES:
        return f"type {kind!r} is not one of {list(RECORD_TYPES)}"
    for key in _NUMBER_FIELDS[kind]:
        value = record.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{kind} record with {key}={value!r}, not a number"
    if kind == "span" and not (isinstance(record.get("phase"), str) and record["phase"]):
        return f"span record with phase={record.get('phase')!r}"
    return ""


def _at_or_after(span: dict[str, Any], iteration: int) -> bool:
    return span.get("iteration") is not None and int(span["iteration"]) >= iteration


def _shifted(record: dict[str, Any], shift: float) -> dict[str, Any]:
    if not shift:
        return record
    out = dict(record)
    for key in ("t_start", "t_end", "t"):
        if key in out:
            out[key] = float(out[key]) + shift
    return out


def _rank_of_path(path: Path) -> int:
    digits = path.stem.removeprefix("rank")
    return int(digits) if digits.isdigit() else 1 << 62
