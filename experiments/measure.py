"""Measure: everything that times real components on this machine's device (nothing here simulates or plots).

    python experiments/measure.py device     --out runs/device              # matmul ceiling, memory, copies
    python experiments/measure.py costs      --model tiny-sd3               # cost file, real components
    python experiments/measure.py generator  --model sd3.5-medium --compile  # generator step benchmark
    python experiments/measure.py trainer    --model flux.1-dev --compile --autocast   # trainer benchmark
    python experiments/measure.py attention  --out runs/attention            # attention kernels per backend
    python experiments/measure.py reward     --reward vlm-judge --batch-sizes 1,4,8,16  # reward benchmark
    python experiments/measure.py switch     --model flux.1-dev --modes lora,full  # colocated-engine switch
    python experiments/measure.py reward-latency --reward vlm-judge --lengths 1,16,64,256  # judge per sample
    python experiments/measure.py sample-costs --model wan2.1-14b --frames 33,49,65,81  # step per frame count
    python experiments/measure.py backends   --config experiments/configs/sd35-medium-lora.yaml  # vs ZeRO
    python experiments/measure.py emit       --generator G.json --trainer T.json --device-name h200
    python experiments/measure.py missing                                    # stale cost points to re-measure
    python experiments/measure.py ablation   --nproc 2 --trainers 1 --profile cpu-2   # real runs side by side
    python experiments/measure.py validation-runs                            # real CPU runs vs the simulator

``python experiments/measure.py COMMAND --help`` describes each. Outputs go under ``runs/`` unless
``--out`` names another folder (``--out experiments/results/...`` replaces a committed result).
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

from digenrl.reports.cli import dispatch, missing, module_main  # noqa: E402
from digenrl.reports.folders import Folders  # noqa: E402

#: The checkout's folders: committed results, and runs/ for everything else.
FOLDERS = Folders(root=REPO, results=REPO / "experiments" / "results", runs=REPO / "runs")
TINY_CONFIG = REPO / "experiments" / "configs" / "tiny.yaml"

COMMANDS = {
    "device": "digenrl.perf.measure_device",
    "costs": "digenrl.perf.measure_costs",
    "generator": "digenrl.perf.bench_generator",
    "trainer": "digenrl.perf.bench_trainer",
    "attention": "digenrl.perf.bench_attention",
    "reward": "digenrl.perf.bench_reward",
    "backends": "digenrl.perf.bench_backends",
    "switch": "digenrl.perf.measure_switch",
    "reward-latency": module_main("digenrl.perf.measure_sample_costs", kind="reward"),
    "sample-costs": module_main("digenrl.perf.measure_sample_costs", kind="generator"),
    "emit": "digenrl.perf.emit_costs",
    "missing": partial(missing, folders=FOLDERS),
    "ablation": module_main("digenrl.perf.ablation", config=TINY_CONFIG, out=FOLDERS.runs / "ablation"),
    "validation-runs": module_main(
        "digenrl.reports.validation_runs", config=TINY_CONFIG, out=FOLDERS.runs / "validation"
    ),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch(__doc__, COMMANDS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
