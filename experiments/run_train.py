"""Train a flow-matching generator with FlowGRPO under any DigenRL schedule.

    python experiments/run_train.py --config experiments/configs/tiny.yaml iterations=5
    torchrun --nproc_per_node=2 experiments/run_train.py --config experiments/configs/tiny.yaml \
        system=colocated-sync profile=cpu-2 out_dir=runs/tiny2

Positional ``key=value`` arguments override the YAML (see ``digenrl/config.py``). ``python -m
digenrl.launch`` is the same command (what torchrun's workers run when this one starts them). The run writes
``out_dir/config.yaml``, ``metrics.jsonl``, ``events/rank*.jsonl``, ``trace.json`` and checkpoints.
"""

from __future__ import annotations

import sys

from digenrl.launch import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
