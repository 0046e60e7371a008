"""The command line shared by the results-table figures (``ablation``, ``scaling``, ``split``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path


def table_figure_main(doc: str | None, plot: Callable[..., Path], argv: Sequence[str] | None = None) -> int:
    """``python paper_figures/<figure>.py TABLE --out PNG [--metric M]``; bad input is a usage error."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("table", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="output PNG path")
    parser.add_argument(
        "--metric", default=None, help="samples_per_s | images_per_gpu_s (default: first present)"
    )
    args = parser.parse_args(argv)
    try:
        print(plot(args.table, args.out, metric=args.metric))
    except ValueError as error:  # bad input: a usage error, not a traceback
        parser.error(str(error))
    return 0
