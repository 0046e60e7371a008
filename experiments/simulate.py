"""Simulate: everything that predicts from cost files (nothing here measures or plots).

    python experiments/simulate.py plan --profile h200-8 --model sd3.5-medium --device h200 --baselines
    python experiments/simulate.py throughput [--regenerate]     # every system per scenario x profile
    python experiments/simulate.py scaling [--regenerate]        # strong scaling, 8..32 GPUs
    python experiments/simulate.py split [--regenerate]          # generator : trainer split
    python experiments/simulate.py validate RUN_DIR [RUN_DIR ...]  # predicted vs measured, per phase

``python experiments/simulate.py COMMAND --help`` describes each (digenrl/sim/cli.py). Tables go to
``runs/simulate/<name>`` unless ``--out`` says otherwise; ``--regenerate`` rewrites the committed one in
``experiments/results/<name>``.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import digenrl  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from digenrl.sim.cli import COMMANDS, dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__doc__, COMMANDS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
