"""Write the simulator's cost file (digenrl.sim.costs.CostModel) from the generator and trainer benchmarks.

    python experiments/emit_costs.py --generator out/perf/generator-sd3.5-medium.json \
        --trainer out/perf/trainer-sd3.5-medium.json --device-name h200
    # -> experiments/results/costs/h200-sd3.5-medium.json (or --out-dir)

Taken from the benchmark JSONs (one ``--path``, the project's ``optimized`` by default, falling back to
``eager`` for a point the chosen path lacks):

* ``generator_step_points``: bench_generator's ms per step (velocity + SDE transition) per batch and CFG;
* ``train_points``: bench_trainer's forward + backward time of one micro-batch (``micro_batch_ms``) per
  micro-batch size and CFG, for ``--mode`` and, with CFG, the training gradient ``--cfg-grad``
  (``algo.cfg_grad``; rows from before it existed count as ``both``, the only gradient then);
  ``optimizer_step_s``: its median optimizer step;
* byte counts and ``helper_switch_s``: bench_trainer's ``costs[<mode>/<path>]``.

Measured here, because neither benchmark builds them: the VAE decode (random weights of the spec's VAE) and
the reward (``--reward``, default the config's) at the generator's batch sizes, with the median of
``--iters`` calls. ``digenrl/sim/measure.py`` (experiments/run_profile.py) measures the same model end to end
with the real rollout engine; this emitter exists so one GPU call yields the cost file from the benchmarks.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import torch

try:
    import digenrl  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from digenrl.config import Config
from digenrl.rollout.sampler import CFG_GRAD_MODES
from digenrl.sim.costs import CFG_KEYS, COSTS_DIR, CostModel, cost_path

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--generator", required=True, help="bench_generator.py JSON")
    p.add_argument("--trainer", required=True, help="bench_trainer.py JSON")
    p.add_argument("--device-name", required=True, help="device part of the file name (h200, cpu, ...)")
    p.add_argument("--path", default="optimized", choices=["optimized", "eager"], help="which path's times")
    p.add_argument("--mode", default="lora", choices=["lora", "full"], help="trainer.mode of train_points")
    p.add_argument(
        "--cfg-grad",
        default=Config().algo.cfg_grad,
        choices=list(CFG_GRAD_MODES),
        help="algo.cfg_grad of the CFG train_points",
    )
    p.add_argument("--reward", default=Config().reward.name, help="reward registry name to time")
    p.add_argument("--device", default="auto", help="where the VAE decode and reward are timed")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--out-dir", default=str(COSTS_DIR), help="folder of <device>-<model>.json")
    args = p.parse_args(argv)
    if args.iters < 1 or args.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    return args


def _points_by_cfg(rows: list[dict], key: str, value: str, path: str) -> dict[str, dict[int, float]]:
    """{cfg|no_cfg: {batch: seconds}} from benchmark rows, ``path`` first, ``eager`` filling gaps."""
    out: dict[str, dict[int, float]] = {}
    for wanted in (path, "eager"):
        for r in rows:
            if r.get("path") != wanted or r.get(value) is None:
                continue
            points = out.setdefault(CFG_KEYS[bool(r["cfg"])], {})
            points.setdefault(int(r[key]), r[value] / 1e3)
    return out


def generator_points(report: dict, path: str) -> dict[str, dict[int, float]]:
    points = _points_by_cfg(report["results"], "batch_size", "ms_per_step", path)
    if not points:
        raise ValueError(f"generator JSON has no timed rows for path {path!r} or eager")
    return points


def trainer_points(
    report: dict, mode: str, path: str, cfg_grad: str
) -> tuple[dict[str, dict[int, float]], float]:
    rows = [r for r in report["results"] if r.get("mode") == mode]
    grads = {r.get("cfg_grad", "both") for r in rows if r.get("cfg") and "micro_batch_ms" in r}
    if grads and cfg_grad not in grads:
        raise ValueError(
            f"trainer JSON has CFG rows for cfg_grad {sorted(grads)} only, not {cfg_grad!r}: pass --cfg-grad "
            f"{sorted(grads)[0]}, or re-run bench_trainer.py with --cfg-grad {cfg_grad}"
        )
    rows = [r for r in rows if not r.get("cfg") or r.get("cfg_grad", "both") == cfg_grad]
    points = _points_by_cfg(rows, "micro_batch_size", "micro_batch_ms", path)
    if not points:
        raise ValueError(f"trainer JSON has no timed rows for mode {mode!r}, path {path!r} or eager")
    steps = [r["optimizer_step_ms"] for r in rows if r.get("path") == path and "optimizer_step_ms" in r]
    steps = steps or [r["optimizer_step_ms"] for r in rows if "optimizer_step_ms" in r]
    return points, statistics.median(steps) / 1e3


def trainer_bytes(report: dict, mode: str, path: str) -> dict:
    costs = report.get("costs", {})
    for key in (f"{mode}/{path}", f"{mode}/eager"):
        if key in costs and "error" not in costs[key]:
            return costs[key]
    raise ValueError(f"trainer JSON has no byte counts for {mode}/{path} (keys: {sorted(costs)})")


def measure_decode_and_reward(
    model: str, batches: list[int], latent_shape: list[int], dtype: str, args: argparse.Namespace
) -> tuple[dict[int, float], dict[int, float], int]:
    """Seconds to decode B latents with the spec's VAE (random weights) and to score B images."""
    from digenrl.models import get_model_spec
    from digenrl.models.vae import LatentDecoder
    from digenrl.perf import roofline
    from digenrl.rewards.registry import build_reward

    device = roofline.resolve_device(args.device)
    spec = get_model_spec(model)
    torch.manual_seed(0)
    decoder = LatentDecoder.build(spec, device=device, dtype=DTYPES[dtype])
    reward = build_reward(args.reward, device=device)
    prompts = [f"a photo of object number {i}" for i in range(max(batches))]
    decode, score = {}, {}
    for b in batches:
        z = torch.randn(b, *latent_shape, device=device)
        decode[b] = (
            statistics.median(
                roofline.time_calls_ms(
                    lambda z=z: decoder.decode(z), device, warmup=args.warmup, iters=args.iters
                )
            )
            / 1e3
        )
        images = decoder.decode(z)
        score[b] = (
            statistics.median(
                roofline.time_calls_ms(
                    lambda im=images, b=b: reward(im, prompts[:b]),
                    device,
                    warmup=args.warmup,
                    iters=args.iters,
                )
            )
            / 1e3
        )
    reward_params = [
        p for v in vars(reward).values() if isinstance(v, torch.nn.Module) for p in v.parameters()
    ]
    return decode, score, int(sum(p.numel() * p.element_size() for p in reward_params))


def build_cost_model(args: argparse.Namespace, command: str = "") -> CostModel:
    generator = json.loads(Path(args.generator).read_text())
    trainer = json.loads(Path(args.trainer).read_text())
    if generator["model"] != trainer["model"]:
        raise ValueError(f"generator JSON is {generator['model']!r}, trainer JSON {trainer['model']!r}")
    model = generator["model"]
    gen_points = generator_points(generator, args.path)
    train_points, optimizer_s = trainer_points(trainer, args.mode, args.path, args.cfg_grad)
    counts = trainer_bytes(trainer, args.mode, args.path)
    batches = sorted({b for pts in gen_points.values() for b in pts})
    decode, score, reward_bytes = measure_decode_and_reward(
        model, batches, generator["latent_shape"], generator["dtype"], args
    )
    filled = {
        "device": args.device_name,
        "model": model,
        "generator_step_points": gen_points,
        "vae_decode_points": decode,
        "reward_points": score,
        "train_points": train_points,
        "optimizer_step_s": optimizer_s,
        "reward_param_bytes": reward_bytes,
    }
    # every other field of the cost model (byte counts, helper_switch_s) comes from the trainer bench
    for f in fields(CostModel):
        if f.name not in filled and f.name in counts:
            filled[f.name] = counts[f.name]
    missing = [
        f.name
        for f in fields(CostModel)
        if f.name not in filled and f.default is MISSING and f.default_factory is MISSING
    ]
    if missing:
        raise ValueError(f"the trainer JSON's costs[{args.mode}/...] lack cost-model field(s) {missing}")
    return CostModel(
        **filled,
        source="measured",
        command=command,
        meta={
            "device_name": generator.get("device_name"),
            "dtype": generator.get("dtype"),
            "path": args.path,
            "generator_path_settings": generator.get("paths", {}).get(args.path),
            "trainer_path_settings": trainer.get("paths", {}).get(args.path),
            "trainer_mode": args.mode,
            "cfg_grad": args.cfg_grad,
            "cfg_split_min_batch": trainer.get("cfg_split_min_batch"),
            "reward": args.reward,
            "height": generator.get("height"),
            "width": generator.get("width"),
            "frames": generator.get("frames"),
            "latent_shape": generator.get("latent_shape"),
            "train_steps_per_sample": counts.get("train_steps_per_sample"),
            "environment": generator.get("environment"),
            "sources": [str(args.generator), str(args.trainer)],
        },
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python experiments/emit_costs.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    costs = build_cost_model(args, command=command.strip())
    out = costs.save(cost_path(costs.device, costs.model, args.out_dir))
    print(costs.describe())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
