"""Command-line and report plumbing shared by the benchmarks (``experiments/measure.py generator``,
``trainer``, ``costs``): comma-separated list flags, where ``--out`` writes, and the cells of the
eager-vs-optimised markdown tables."""

from __future__ import annotations

import argparse
from pathlib import Path

#: the code paths the generator and trainer benchmarks time side by side (``--paths``)
PATHS = ("eager", "optimized")
#: ``--compile-dynamic`` -> torch.compile's ``dynamic``
DYNAMIC = {"auto": None, "true": True, "false": False}


def int_list(text: str, flag: str, parser: argparse.ArgumentParser) -> list[int]:
    """``"1,4,16"`` → ``[1, 4, 16]``; anything but positive integers is a usage error naming ``flag``."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        parser.error(f"{flag} must be comma-separated integers, got {text!r}")
    if not values or min(values) < 1:
        parser.error(f"{flag} needs positive integers, got {text!r}")
    return values


def name_list(text: str, flag: str, allowed: tuple[str, ...], parser: argparse.ArgumentParser) -> list[str]:
    """``"optimized,eager"`` → ``["optimized", "eager"]`` (order kept); names outside ``allowed`` are a
    usage error naming ``flag``."""
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values or any(v not in allowed for v in values):
        parser.error(f"{flag} must be a comma-separated subset of {','.join(allowed)}, got {text!r}")
    return values


def output_paths(out: str, kind: str, model: str) -> tuple[Path, Path]:
    """(json, markdown) for ``--out``: a directory gets ``<kind>-<model>.json/.md``; a .json path its .md."""
    path = Path(out)
    if path.suffix == ".json":
        return path, path.with_suffix(".md")
    return path / f"{kind}-{model}.json", path / f"{kind}-{model}.md"


def fmt(value: float | None, spec: str) -> str:
    """``format(value, spec)``, or ``-`` for a value that was not measured."""
    return "-" if value is None else format(value, spec)


def cell(row: dict, key: str, spec: str, *, primary: str) -> str:
    """One table cell of a result row. A row without the ``primary`` time (skipped or failed) shows
    why in that column and ``-`` elsewhere."""
    if row.get(key) is not None:
        return format(row[key], spec)
    return row.get("skipped", row.get("error", "-"))[:40] if key == primary else "-"


def speedup(eager: dict, optimized: dict, key: str) -> str:
    """``eager[key] / optimized[key]`` as ``1.23x``, or ``-`` unless both paths measured ``key``."""
    if key in eager and key in optimized:
        return f"{eager[key] / optimized[key]:.2f}x"
    return "-"
