"""Simulate: everything that predicts from cost files (nothing here measures or plots).

    python experiments/simulate.py plan --profile h200-8 --model sd3.5-medium --device h200 --baselines
    python experiments/simulate.py throughput [--regenerate]     # every system per scenario x profile
    python experiments/simulate.py scaling [--regenerate]        # strong scaling, 8..32 GPUs
    python experiments/simulate.py split [--regenerate]          # generator : trainer split
    python experiments/simulate.py validate RUN_DIR [RUN_DIR ...]  # predicted vs measured, per phase
    python experiments/simulate.py memory RUN_DIR [RUN_DIR ...]    # estimated vs measured peak memory

``python experiments/simulate.py COMMAND --help`` describes each (digenrl/reports/cli.py). Tables go to
``runs/simulate/<name>`` unless ``--out`` says otherwise; ``--regenerate`` rewrites the committed one in
``experiments/results/<name>``.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
try:
    import digenrl  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO))

from digenrl.reports import cli  # noqa: E402
from digenrl.reports.folders import Folders  # noqa: E402

#: The checkout's folders: committed results, and runs/ for everything else.
FOLDERS = Folders(root=REPO, results=REPO / "experiments" / "results", runs=REPO / "runs")
COMMANDS = {name: partial(command, folders=FOLDERS) for name, command in cli.COMMANDS.items()}


def main(argv: list[str] | None = None) -> int:
    return cli.dispatch(__doc__, COMMANDS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
