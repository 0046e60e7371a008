"""Measure the simulator's per-operation cost model of one model on this machine's device.

    python experiments/run_profile.py                                    # tiny-sd3 on CPU (< 60 s)
    python experiments/run_profile.py --model sd3.5-medium --device auto --batches 1,4,8,16 \
        --micro-batches 1,2,4,8

Writes ``experiments/results/costs/<device>-<model>.json`` (or ``--out``) and prints the table. The file
is what ``digenrl.sim.simulate`` / ``experiments/run_plan.py`` read (``CostModel.load``); see
``digenrl/sim/measure.py`` for what is timed and how.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

try:
    import digenrl  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from digenrl.perf.bench_cli import int_list
from digenrl.sim.costs import cost_path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-sd3", help="zoo entry (model.name)")
    p.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:1")
    p.add_argument("--device-name", default=None, help="name in the cost file (default: cpu / h200 / …)")
    p.add_argument(
        "--out", default=None, help="output JSON (default: experiments/results/costs/<device>-<model>.json)"
    )
    p.add_argument("--batches", default="1,2,4", help="generator / decode / reward batch sizes")
    p.add_argument("--micro-batches", default="1,2,4", help="training micro-batch sizes (units)")
    p.add_argument(
        "--cfg", default="both", choices=["on", "off", "both"], help="guidance settings to measure"
    )
    p.add_argument("--mode", default="lora", choices=["lora", "full"], help="trainer.mode")
    p.add_argument("--reward", default="brightness", help="reward registry name")
    p.add_argument(
        "--dtype", default=None, choices=["float32", "bfloat16", "float16"], help="default: bf16 on cuda"
    )
    p.add_argument("--num-steps", type=int, default=None, help="sampler steps (default: the model's)")
    p.add_argument("--height", type=int, default=None)
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--pretrained-path", default=None, help="local diffusers-style directory")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5, help="timed calls per measurement (median)")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for torch (default on CPU: 1 — tiny models are overhead-bound and extra threads "
        "only add contention noise on shared machines)",
    )
    args = p.parse_args(argv)
    args.batches = int_list(args.batches, "--batches", p)
    args.micro_batches = int_list(args.micro_batches, "--micro-batches", p)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from digenrl.perf.roofline import resolve_device
    from digenrl.sim.measure import measure_costs

    threads = args.threads or (1 if resolve_device(args.device).type == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    flags = {"on": [True], "off": [False], "both": [False, True]}[args.cfg]
    command = "python experiments/run_profile.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    start = time.perf_counter()
    costs = measure_costs(
        args.model,
        args.device,
        batches=args.batches,
        micro_batches=args.micro_batches,
        cfg_flags=flags,
        mode=args.mode,
        reward=args.reward,
        dtype=args.dtype,
        num_steps=args.num_steps,
        height=args.height,
        width=args.width,
        pretrained_path=args.pretrained_path,
        warmup=args.warmup,
        iters=args.iters,
        device_name=args.device_name,
        command=command.strip(),
    )
    out = Path(args.out) if args.out else cost_path(costs.device, costs.model)
    costs.save(out)
    print(costs.describe())
    print(f"wrote {out} ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
