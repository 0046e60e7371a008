"""Reading a run's JSON-lines logs (``metrics.jsonl``, ``events/rank<r>.jsonl``) so that damage costs a
line, never the run.

A log line can be torn (a process killed mid-write), hit by a disk error, or edited by hand. One bad
line must not stop a resume, an ``overwrite``, or the trace and summary at the end of a run (issue 35,
item 4): every line that is not valid UTF-8 JSON, or not a record of the expected shape (``valid``
returns why not), is skipped, and one warning per file names each skipped line by its number (the first
few) and the count. The reader never raises for a line's content; an unreadable file is still an OSError.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: Skipped lines named one by one in the warning; the rest are counted.
NAMED_LINES = 5


def read_json_lines(path: str | Path, valid: Callable[[Any], str]) -> list[dict[str, Any]]:
    """The records of ``path`` in file order; ``valid(record)`` returns "" for a good record, else why it
    is not one. Bad lines are skipped with one warning (module docstring)."""
    path = Path(path)
    records: list[dict[str, Any]] = []
    skipped: list[str] = []
    for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            skipped.append(f"line {number}: not valid JSON ({error})")
            continue
        problem = valid(record)
        if problem:
            skipped.append(f"line {number}: {problem}")
            continue
        records.append(record)
    if skipped:
        more = f"; and {len(skipped) - NAMED_LINES} more" if len(skipped) > NAMED_LINES else ""
        log.warning(
            "%s: skipped %d damaged line(s), kept %d records (%s%s)",
            path,
            len(skipped),
            len(records),
            "; ".join(skipped[:NAMED_LINES]),
            more,
        )
    return records
