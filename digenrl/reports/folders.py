"""Where the reports read and write. The entry points that know the checkout (``experiments/simulate.py``,
``experiments/measure.py``) give these folders; nothing under ``digenrl/`` builds a path into a checkout, so
an installed package runs the same reports on folders of the caller's choosing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Folders:
    """``root``: the checkout (tables name their cost files relative to it); ``results``: the committed
    results (one folder per table, ``costs/``, ``validation/``); ``runs``: where an output goes unless
    ``--out`` or ``--regenerate`` says otherwise."""

    root: Path
    results: Path
    runs: Path

    @property
    def costs(self) -> Path:
        """The committed cost files (``<device>-<model>.json``)."""
        return self.results / "costs"

    @property
    def validation(self) -> Path:
        """The committed comparisons of real runs with the simulator (``simulate.py validate`` reports)."""
        return self.results / "validation"

    def relative(self, path: Path) -> str:
        """``path`` relative to the checkout where it lies inside it (as the tables' ``cost_file`` column
        names a file), else as given."""
        try:
            return str(Path(path).resolve().relative_to(self.root.resolve()))
        except ValueError:
            return str(path)
