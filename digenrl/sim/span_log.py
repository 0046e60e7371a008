"""Simulated spans in the exact record format of real runs (``digenrl.runtime.observe.event_records``).

Each span is the dict :meth:`digenrl.runtime.observe.events.EventLogger.record_span` writes (``type, rank,
role, phase, iteration, fragment, policy_version, t_start, t_end`` + optional ``samples, category, extra``),
so
:func:`digenrl.runtime.observe.events.summarize_events`, :func:`merge_chrome_trace` and the figure code read a
simulated run exactly like a measured one. Simulated time starts at 0, so ``clock_origin`` is 0.0 and the
``meta`` line says ``host: "simulated"``.

Phase names are the declared ones (:class:`digenrl.runtime.observe.span_phases.Phase`), as in real runs.
Conventions shared with the real systems: ``generate`` / ``score`` / ``train`` / ``optimizer`` are work;
``wait_*`` spans are bubbles; one ``iteration`` marker per rank and iteration spans its work on that
iteration; ``samples`` is set on ``score`` spans (each trajectory scored exactly once) and on the lead
trainer's ``optimizer`` span (samples committed by the step).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from digenrl.runtime.observe.event_records import rank_log_path, span_record
from digenrl.runtime.observe.span_phases import Phase, is_work_phase


class SpanLog:
    """Append-only list of simulated span records, plus the role of every rank that appears."""

    def __init__(self, roles: Mapping[int, str]) -> None:
        self.roles = dict(roles)
        self.spans: list[dict[str, Any]] = []

    def add(
        self,
        rank: int,
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
        """Record one span and return it (schedules may re-tag it later, e.g. an evicted batch)."""
        if rank not in self.roles:
            raise ValueError(f"rank {rank} has no role in this simulation; roles: {self.roles}")
        record = span_record(
            rank,
            self.roles[rank],
            phase,
            t_start,
            t_end,
            iteration=iteration,
            fragment=fragment,
            policy_version=policy_version,
            samples=samples,
            category=category,
            extra=extra,
        )
        self.spans.append(record)
        return record

    def iteration_markers(self) -> list[dict[str, Any]]:
        """One ``iteration`` span per (rank, iteration): the extent of that rank's work tagged with it."""
        extent: dict[tuple[int, int], list[float]] = {}
        for span in self.spans:
            if span["iteration"] is None or not is_work_phase(span["phase"]):
                continue
            key = (span["rank"], span["iteration"])
            lo_hi = extent.setdefault(key, [span["t_start"], span["t_end"]])
            lo_hi[0] = min(lo_hi[0], span["t_start"])
            lo_hi[1] = max(lo_hi[1], span["t_end"])
        return [
            {
                "type": "span",
                "rank": rank,
                "role": self.roles[rank],
                "phase": Phase.ITERATION.value,
                "iteration": iteration,
                "fragment": None,
                "policy_version": None,
                "t_start": lo,
                "t_end": hi,
            }
            for (rank, iteration), (lo, hi) in sorted(extent.items())
        ]

    def records(self) -> list[dict[str, Any]]:
        """Every rank's records as the real logs hold them: a ``meta`` line, then spans by start time."""
        by_rank: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for span in [*self.spans, *self.iteration_markers()]:
            by_rank[span["rank"]].append(span)
        out: list[dict[str, Any]] = []
        for rank in sorted(self.roles):
            out.append(
                {
                    "type": "meta",
                    "rank": rank,
                    "role": self.roles[rank],
                    "clock_origin": 0.0,
                    "host": "simulated",
                    "pid": 0,
                }
            )
            out.extend(sorted(by_rank[rank], key=lambda s: (s["t_start"], s["t_end"])))
        return out

    def write(self, out_dir: str | Path) -> Path:
        """Write ``out_dir/events/rank<r>.jsonl`` for every rank; returns the events folder."""
        lines: dict[int, list[str]] = defaultdict(list)
        for record in self.records():
            lines[record["rank"]].append(json.dumps(record, separators=(",", ":")))
        folder = rank_log_path(out_dir, 0).parent
        folder.mkdir(parents=True, exist_ok=True)
        for rank, rank_lines in lines.items():
            rank_log_path(out_dir, rank).write_text("\n".join(rank_lines) + "\n")
        return folder
