"""Regenerate every figure the inputs under a logs folder allow, and say what was skipped and why.

Usage: ``python paper_figures/make_all.py --logs DIR [DIR ...] --out DIR [--timeline-iterations A:B]``

Inputs are found recursively under each ``--logs`` folder (see paper_figures/README.md):

- run directories (``metrics.jsonl`` and/or ``events/rank<r>.jsonl``) -> ``timeline_<run>.png`` per run with
  event logs, titled with the run's system and its path below the folder, and one ``learning.png`` over every
  run with metrics of every folder, each curve named the same way (with several folders, names and file
  names start with each folder's path below their common parent, so ``--logs runs/a runs/b`` compares
  ``a/…`` with ``b/…``);
- results tables (``*.csv`` / ``*.json`` outside the run directories' own files, including the
  ``ablation.json`` of ``experiments/measure.py ablation``) -> ``<table>_throughput.png``,
  ``<table>_ablation.png``, ``<table>_scaling.png``, ``<table>_split.png`` for the experiment kinds the
  table has rows of, and ``<table>_fair_ratio.png`` (DigenRL ÷ best fair baseline per regime,
  :mod:`paper_figures.fair_ratio`) for a throughput table with that column.

A bad input never stops the others: its ValueError becomes a "skipped" line. Exit status 1 when nothing
was made (so a CI step notices an empty or wrong folder), else 0.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from paper_figures.ablation import plot_ablation
from paper_figures.fair_ratio import panel_ratios, plot_fair_ratio
from paper_figures.learning import plot_learning
from paper_figures.logs import (
    EXPERIMENTS,
    RunLog,
    find_run_dirs,
    load_run,
    read_results_table,
    rows_for,
)
from paper_figures.scaling import plot_scaling
from paper_figures.split import plot_split
from paper_figures.throughput import plot_throughput
from paper_figures.timeline import parse_iteration_window, plot_timeline

TABLE_FIGURES: dict[str, tuple[str, Callable[..., Path]]] = {
    "main": ("throughput", plot_throughput),
    "ablation": ("ablation", plot_ablation),
    "scaling": ("scaling", plot_scaling),
    "split": ("split", plot_split),
}
# Files a run directory writes itself; never results tables even though they end in .json.
_RUN_OWN_FILES = ("trace.json",)
_RUN_OWN_DIRS = ("events", "checkpoints")


@dataclass
class Report:
    made: list[Path] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (what, why)

    def make(self, what: str, render: Callable[[], Path]) -> None:
        try:
            path = render()
        except ValueError as error:
            self.skip(what, str(error))
            return
        self.made.append(path)
        print(f"made     {path}  ({what})")

    def skip(self, what: str, why: str) -> None:
        self.skipped.append((what, why))
        print(f"skipped  {what}: {why}")


def default_timeline_window(run: RunLog, span_iterations: int = 3) -> tuple[int, int] | None:
    """Steady state, not warm-up: the 2nd to 4th training iterations when the run has more than 4, else the
    whole run. Negative tags (set-up work such as the initial weight sync, tagged -1) are not iterations."""
    iterations = [k for k in run.span_iterations if k >= 0]
    if len(iterations) <= span_iterations + 1:
        return None
    return iterations[1], iterations[span_iterations]


def find_results_tables(root: Path, run_dirs: Sequence[Path]) -> list[Path]:
    """``*.csv`` / ``*.json`` under ``root`` that are not a run directory's own outputs."""
    own = set()
    for run_dir in run_dirs:
        own |= {run_dir / name for name in _RUN_OWN_FILES}
    tables = []
    for path in sorted([*root.rglob("*.csv"), *root.rglob("*.json")]):
        if path in own or any(part in _RUN_OWN_DIRS for part in path.relative_to(root).parts[:-1]):
            continue
        tables.append(path)
    return tables


def root_labels(roots: Sequence[Path]) -> list[str]:
    """What names each ``--logs`` folder in figure titles and file names: nothing for one folder, else its
    path below the folders' common parent (``runs/a runs/b`` -> ``a``, ``b``)."""
    if len(roots) == 1:
        return [""]
    resolved = [root.resolve() for root in roots]
    common = Path(os.path.commonpath(resolved))
    return [root.relative_to(common).as_posix() if root != common else root.name for root in resolved]


def display_name(path: Path, root: Path, label: str = "") -> str:
    """``path`` below ``root`` (a file without its suffix), after the root's label: ``a/b/run``. A run
    directory that is the root itself is named by the label, else by the folder's own name."""
    relative = path.relative_to(root)
    parts = [*relative.parent.parts, relative.stem] if path.is_file() else list(relative.parts)
    return "/".join([label, *parts] if label else parts) or label or root.resolve().name


def flat_name(path: Path, root: Path, label: str = "") -> str:
    """A file-name-safe ``display_name`` (``a/b/run`` -> ``a__b__run``)."""
    return display_name(path, root, label).replace("/", "__")


def make_all(
    logs: str | Path | Sequence[str | Path],
    out: str | Path,
    *,
    timeline_iterations: tuple[int, int] | None = None,
) -> Report:
    """Render every figure possible from the folder(s) ``logs`` into ``out``; see the module docstring."""
    roots = [Path(logs)] if isinstance(logs, str | Path) else list(dict.fromkeys(Path(p) for p in logs))
    if not roots:
        raise ValueError("logs must name at least one folder")
    out = Path(out)
    report = Report()
    runs_with_metrics: list[RunLog] = []
    seen: set[Path] = set()  # a run below two given folders (one inside the other) is drawn once
    for root, label in zip(roots, root_labels(roots), strict=True):
        run_dirs = find_run_dirs(root)
        if not run_dirs:
            report.skip("timelines, learning curve", f"no run directories under {root}")
        for run_dir in run_dirs:
            if run_dir.resolve() in seen:
                continue
            seen.add(run_dir.resolve())
            run = draw_run(report, run_dir, display_name(run_dir, root, label), out, timeline_iterations)
            if run is not None and run.metrics:
                runs_with_metrics.append(run)
        draw_tables(report, root, label, run_dirs, out)
    if runs_with_metrics:
        only = runs_with_metrics[0].label if len(runs_with_metrics) == 1 else None
        title = f"Reward during training: {only}" if only else None
        report.make(
            f"learning curve of {len(runs_with_metrics)} run(s)",
            lambda: plot_learning(runs_with_metrics, out / "learning.png", title=title),
        )
    print(f"{len(report.made)} figure(s) made, {len(report.skipped)} skipped -> {out}")
    return report


def draw_run(
    report: Report, run_dir: Path, name: str, out: Path, iterations: tuple[int, int] | None
) -> RunLog | None:
    """The timeline of one run directory, titled by ``name``; returns the loaded run (None if unreadable)."""
    try:
        run = load_run(run_dir, name=name)
    except ValueError as error:
        report.skip(f"run {run_dir}", str(error))
        return None
    if run.spans:
        window = iterations or default_timeline_window(run)
        report.make(
            f"timeline of {run_dir}" + (f", iterations {window[0]}-{window[1]}" if window else ""),
            lambda: plot_timeline(run, out / f"timeline_{name.replace('/', '__')}.png", iterations=window),
        )
    else:
        report.skip(f"timeline of {run_dir}", "no span records in events/rank<r>.jsonl")
    if not run.metrics:
        report.skip(f"learning curve of {run_dir}", "no metrics.jsonl records")
    return run


def draw_tables(report: Report, root: Path, label: str, run_dirs: Sequence[Path], out: Path) -> None:
    """Every figure the results tables under ``root`` have rows for."""
    tables = find_results_tables(root, run_dirs)
    if not tables:
        report.skip("throughput, ablation, scaling, split", f"no results tables (*.csv, *.json) under {root}")
    for table in tables:
        try:
            rows = read_results_table(table)
        except ValueError as error:
            report.skip(f"table {table}", f"not a results table: {error}")
            continue
        name = flat_name(table, root, label)
        for experiment in EXPERIMENTS:
            figure, render = TABLE_FIGURES[experiment]
            if not rows_for(rows, experiment):
                report.skip(f"{figure} from {table}", f"no rows with experiment={experiment}")
                continue
            report.make(
                f"{figure} from {table}",
                lambda render=render, rows=rows, path=out / f"{name}_{figure}.png": render(rows, path),
            )
        if panel_ratios(rows):  # a throughput table with the fair-baseline columns (issue 34)
            report.make(
                f"fair ratio from {table}",
                lambda rows=rows, path=out / f"{name}_fair_ratio.png": plot_fair_ratio(rows, path),
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--logs", type=Path, nargs="+", required=True, help="folder(s) searched recursively for inputs"
    )
    parser.add_argument("--out", type=Path, required=True, help="folder the PNGs are written to")
    parser.add_argument(
        "--timeline-iterations", type=parse_iteration_window, default=None,
        help="K or A:B (inclusive) for every timeline (default: iterations 1-3 of runs longer than 4)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    for folder in args.logs:
        if not folder.is_dir():
            parser.error(f"--logs {folder} is not a directory")
    report = make_all(args.logs, args.out, timeline_iterations=args.timeline_iterations)
    return 0 if report.made else 1


if __name__ == "__main__":
    raise SystemExit(main())
