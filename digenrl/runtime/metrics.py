"""Per-iteration metrics: ``out_dir/metrics.jsonl`` (rank 0) and one progress line per iteration."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, TextIO

REQUIRED_KEYS = (
    "iteration",
    "policy_version",
    "reward_mean",
    "reward_std",
    "loss",
    "ratio_mean",
    "update_norm",
    "samples_per_s",
    "wall_s",
)


class MetricsWriter:
    """Appends one JSON object per iteration; only the writer rank touches the file."""

    def __init__(
        self, out_dir: str | Path, *, is_writer: bool, stream: TextIO | None = None, resume: bool = False
    ):
        self.path = Path(out_dir) / "metrics.jsonl"
        self.is_writer = is_writer
        self.stream = stream if stream is not None else sys.stdout
        if is_writer:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not resume:
                self.path.write_text("")

    def log(self, record: dict[str, Any]) -> None:
        if not self.is_writer:
            return
        missing = [k for k in REQUIRED_KEYS if k not in record]
        if missing:
            raise KeyError(f"metrics record lacks {missing}")
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(clean) + "\n")
        self.stream.write(progress_line(record) + "\n")
        self.stream.flush()


def progress_line(r: dict[str, Any]) -> str:
    total = r.get("iterations")
    it = f"iter {r['iteration'] + 1}/{total}" if total else f"iter {r['iteration'] + 1}"
    return (
        f"[digenrl] {it} v{r['policy_version']} reward {r['reward_mean']:+.4f}±{r['reward_std']:.4f} "
        f"loss {r['loss']:+.3e} ratio {r['ratio_mean']:.6f} |Δθ| {r['update_norm']:.3e} "
        f"{r['samples_per_s']:.2f} samples/s {r['wall_s']:.2f}s"
    )


def read_metrics(out_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(out_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def add_event_summary(out_dir: str | Path) -> None:
    """Fold the merged event logs into ``metrics.jsonl``: per iteration, the busy fraction of each
    pool (role) and the seconds each role spent per phase (from ``summarize_events``). Runs once, on
    rank 0, after every rank has flushed its events; the file is replaced atomically."""
    from digenrl.runtime.event_summary import summarize_events

    path = Path(out_dir) / "metrics.jsonl"
    if not path.is_file():
        return
    summary = summarize_events(out_dir)
    records = read_metrics(out_dir)
    for record in records:
        per_iteration = summary.get(record["iteration"]) or summary.get(str(record["iteration"]))
        if per_iteration:
            record["busy_fraction"] = per_iteration["busy_fraction"]
            record["phase_seconds"] = per_iteration["phase_seconds"]
            record["bubble_free_bound_s"] = per_iteration["bubble_free_bound_s"]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(path)
