"""Checks shared by the paper-figure tests: where the sample inputs are, and which texts of a drawn figure
overlap."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.path import Path as MplPath
from matplotlib.text import Text
from matplotlib.transforms import Affine2D

DATA_DIR = Path(__file__).parent / "data"


def text_outlines(figure: Figure) -> list[tuple[str, np.ndarray]]:
    """(text, 4 corners in pixels) of every visible, non-empty text of the drawn figure. A label rotated
    about its anchor (``rotation_mode="anchor"``, as paper_figures/bars.py sets) is outlined by its rotated
    rectangle, not by the axis-aligned box around it, which would make neighbours look overlapping."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    outlines, seen = [], set()
    for text in figure.findobj(Text):
        if id(text) in seen or not text.get_visible() or not text.get_text().strip():
            continue
        seen.add(id(text))
        angle = text.get_rotation()
        rotated = angle and text.get_rotation_mode() == "anchor"
        if rotated:
            text.set_rotation(0)
        box = text.get_window_extent(renderer)
        corners = np.array([[box.x0, box.y0], [box.x1, box.y0], [box.x1, box.y1], [box.x0, box.y1]])
        if rotated:
            text.set_rotation(angle)
            anchor = text.get_transform().transform(text.get_unitless_position())
            corners = Affine2D().rotate_deg_around(*anchor, angle).transform(corners)
        outlines.append((text.get_text(), corners))
    return outlines


def overlapping_texts(figure: Figure) -> list[tuple[str, str]]:
    """Pairs of texts whose outlines intersect, plus (text, "outside the figure") for clipped ones."""
    outlines = text_outlines(figure)
    width, height = figure.canvas.get_width_height()
    paths = [(t, MplPath(np.vstack([c, c[:1]]), closed=True)) for t, c in outlines]
    clashes = [(a, b) for (a, pa), (b, pb) in itertools.combinations(paths, 2) if pa.intersects_path(pb)]
    clashes += [
        (t, "outside the figure")
        for t, c in outlines
        if c[:, 0].min() < 0 or c[:, 1].min() < 0 or c[:, 0].max() > width or c[:, 1].max() > height
    ]
    return clashes
