"""Where the host waited for the GPU, by Python call site (part of ``runtime.profile_iteration``).

The kernel profile counts the host syncs of each phase by operator (``cudaStreamSynchronize in aten::copy_``,
:mod:`digenrl.runtime.observe.idle_gaps`) but not which line of Python asked for them: a blocking copy of a
host index, an ``.item()`` or a ``bool()`` of a device tensor, ``nonzero``. ``torch.cuda.set_sync_debug_mode
("warn")`` makes every synchronising CUDA call issue a warning ("called a synchronizing CUDA operation",
PyTorch docs, ``torch.cuda.set_sync_debug_mode``); the warning reaches Python when the operator returns, with
the caller's frames on the stack, so each one is recorded here with the innermost frame and the innermost
frame of this package (the line to change, when the sync is inside a library). Device-side synchronisation
that does not go through those calls (the caching allocator's ``cudaFree`` on a retry) is not seen here: the
metrics' ``alloc_retries`` counts that.
"""

from __future__ import annotations

import traceback
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["SYNC_WARNING", "SyncSites", "format_sync_sites", "recorded_sync_sites"]

#: The message of torch's sync debug mode (c10/cuda/CUDAFunctions.cpp, ``warn_or_error_on_sync``).
SYNC_WARNING = "called a synchronizing CUDA operation"
PACKAGE_DIR = str(Path(__file__).resolve().parents[3])  # the directory holding the digenrl package
SITES_SHOWN = 25


def _where(frame: traceback.FrameSummary) -> str:
    path = frame.filename
    for marker in ("/site-packages/", "/dist-packages/"):  # a library's file by its package path
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:
        if path.startswith(PACKAGE_DIR + "/"):
            path = path[len(PACKAGE_DIR) + 1 :]
    return f"{path}:{frame.lineno} ({frame.name})"


@dataclass
class SyncSites:
    """Counts of synchronising calls by (innermost frame, innermost frame in this package)."""

    counts: Counter = field(default_factory=Counter)

    def add(self, stack: list[traceback.FrameSummary]) -> None:
        """Record one sync made with ``stack`` on the host (outermost frame first, as traceback gives it)."""
        frames = [f for f in stack if not f.filename.endswith(("/warnings.py", __file__))]
        if not frames:
            return
        own = next((f for f in reversed(frames) if "/digenrl/" in f.filename), None)
        self.counts[(_where(frames[-1]), None if own is None else _where(own))] += 1

    def rows(self) -> list[dict[str, Any]]:
        """Most frequent first: ``site`` (innermost frame), ``caller`` (the package's), ``count``."""
        return [
            {"site": site, "caller": caller, "count": n}
            for (site, caller), n in sorted(self.counts.items(), key=lambda item: (-item[1], item[0]))
        ]


@contextmanager
def recorded_sync_sites(device: torch.device) -> Iterator[SyncSites]:
    """Record the body's synchronising CUDA calls (nothing on other devices). Other warnings pass through
    unchanged; the sync debug mode and the warning filters are restored on exit."""
    sites = SyncSites()
    if device.type != "cuda":
        yield sites
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("always", message=SYNC_WARNING)  # every occurrence, not once per line
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if SYNC_WARNING in str(message):
                sites.add(traceback.extract_stack()[:-1])
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield sites
        finally:
            torch.cuda.set_sync_debug_mode(previous)


def format_sync_sites(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: the table of call sites (the most frequent :data:`SITES_SHOWN`)."""
    if not rows:
        return []
    lines = [
        "",
        f"Host syncs by Python call site ({sum(r['count'] for r in rows)} in all; the sync debug mode):",
        "",
        "| count | call site | in this package |",
        "|---:|---|---|",
    ]
    for r in rows[:SITES_SHOWN]:
        lines.append(f"| {r['count']} | `{r['site']}` | {'`' + r['caller'] + '`' if r['caller'] else '-'} |")
    if len(rows) > SITES_SHOWN:
        lines.append(
            f"| {sum(r['count'] for r in rows[SITES_SHOWN:])} | {len(rows) - SITES_SHOWN} more sites | |"
        )
    return lines
