"""Shared look of the paper figures: fixed colours per phase and per system, and PNG output via Agg.

Figures are built with the object-oriented ``matplotlib.figure.Figure`` on an explicit ``FigureCanvasAgg``
(matplotlib's "embedding in a web server" recipe), never through ``pyplot``: no global state, no GUI
backend, identical output on a headless node. The PNG is exactly ``figsize × dpi`` pixels (no tight bbox),
so callers and tests can rely on its size.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from digenrl.config import SYSTEMS
from digenrl.runtime.observe.span_phases import Phase

DEFAULT_DPI = 150
SIMULATED_HATCH = "///"
BUBBLE_COLOR = "#d9d9d9"
BUBBLE_HATCH = "xx"

#: legend entry of a trainer rank's TAG generation (a ``generate`` span with ``extra.helper``)
HELPER_GENERATE = "generate (TAG helper)"

# Colours of the work phases runs and the simulator write (digenrl.runtime.observe.span_phases.Phase); others
# get a stable palette slot, idle phases are grey.
PHASE_COLORS = {
    Phase.GENERATE: "#1f77b4",
    HELPER_GENERATE: "#6baed6",
    Phase.SCORE: "#ff7f0e",
    Phase.TRAIN: "#2ca02c",
    Phase.OPTIMIZER: "#145a32",
    Phase.SYNC: "#9467bd",
    Phase.TRANSFER: "#8c564b",
    Phase.RESIDENCY: "#e377c2",
    Phase.OFFLOAD: "#e377c2",
    Phase.ONLOAD: "#f7b6d2",
    Phase.RESHARD: "#c49c94",
    Phase.TAG_SWITCH: "#7f7f7f",
    Phase.EVAL: "#bcbd22",  # held-out evaluation (eval.every; digenrl/rollout/evaluate.py)
}
IDLE_COLOR = "#bdbdbd"

# Baselines first, DigenRL last (the config's order, docs/design.md §4), so every bar chart reads left to
# right the same way.
SYSTEM_ORDER = SYSTEMS
SYSTEM_COLORS = {
    "colocated-sync": "#8c8c8c",
    "colocated-overlap": "#b07aa1",
    "colocated-engine": "#d37295",
    "separate-sync": "#f28e2b",
    "separate-async": "#edc948",
    "digenrl": "#4e79a7",
}
_EXTRA_PALETTE = ("#59a14f", "#e15759", "#76b7b2", "#ff9da7", "#9c755f", "#bab0ac", "#17becf", "#bcbd22")


def new_figure(figsize: tuple[float, float], dpi: int = DEFAULT_DPI) -> Figure:
    """A pyplot-free figure on an Agg canvas, laid out by matplotlib's constrained layout."""
    if len(figsize) != 2 or min(figsize) <= 0:
        raise ValueError(f"figsize must be two positive inches (width, height), got {figsize!r}")
    if dpi <= 0:
        raise ValueError(f"dpi must be positive, got {dpi!r}")
    figure = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def save_png(figure: Figure, path: str | Path) -> Path:
    """Write ``figure`` as PNG (parents created) at its own dpi, so the size is figsize × dpi pixels."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"output path must end in .png, got '{path}'")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=figure.dpi)
    return path


def ordered_systems(systems: Iterable[str]) -> list[str]:
    """Known systems in ``SYSTEM_ORDER``, then any others alphabetically."""
    unique = set(systems)
    known = [s for s in SYSTEM_ORDER if s in unique]
    return known + sorted(unique - set(SYSTEM_ORDER))


def color_map(
    names: Iterable[str], fixed: dict[str, str], palette: Iterable[str] = _EXTRA_PALETTE
) -> dict[str, str]:
    """Fixed colours where known; the rest take palette slots in sorted-name order (stable across runs)."""
    names = list(dict.fromkeys(names))
    spare = [c for c in palette if c not in fixed.values()] or list(palette)
    unknown = sorted(n for n in names if n not in fixed)
    colors = {n: fixed[n] for n in names if n in fixed}
    colors.update({n: spare[i % len(spare)] for i, n in enumerate(unknown)})
    return {n: to_hex(colors[n]) for n in names}


def label_axes(axes, *, xlabel: str, ylabel: str, title: str) -> None:
    """The house labels of a line panel: axis labels at 9 pt, the title at 10 pt, a light grid."""
    axes.set_xlabel(xlabel, fontsize=9)
    axes.set_ylabel(ylabel, fontsize=9)
    axes.set_title(title, fontsize=10)
    axes.grid(color="#eeeeee", linewidth=0.6)


def bottom_legend(figure: Figure, handles: list, *, inches_per_entry: float = 1.5) -> None:
    """Legend below the axes, wrapped to as many columns as the figure width holds (never clipped)."""
    columns = max(1, min(len(handles), int(figure.get_figwidth() / inches_per_entry)))
    figure.legend(handles=handles, loc="outside lower center", ncols=columns, fontsize=8, frameon=False)


def source_legend_handles() -> list[Patch]:
    """Legend entries explaining solid (measured) vs hatched (simulated) bars."""
    return [
        Patch(facecolor="white", edgecolor="black", label="measured"),
        Patch(facecolor="white", edgecolor="black", hatch=SIMULATED_HATCH, label="simulated"),
    ]
