"""Write the simulator's cost file (:class:`digenrl.costs.CostModel`) from the generator and trainer
benchmarks.

    python experiments/measure.py emit --generator runs/perf/generator-sd3.5-medium.json \
        --trainer runs/perf/trainer-sd3.5-medium.json --device-name h200
    # -> runs/costs/h200-sd3.5-medium.json (--out-dir experiments/results/costs to replace a committed file)

Taken from the benchmark JSONs, for ONE code path (``--path``; a file never mixes eager and optimised
points — a point the path lacks stays missing, and :mod:`digenrl.costs.audit` lists it for
re-measurement):

* ``generator_step_points`` / ``generator_peak_bytes``: the generator benchmark's ms per step (velocity +
  SDE transition) and peak memory per batch and CFG;
* ``train_points`` / ``train_peak_bytes``: the trainer benchmark's forward + backward time of one
  micro-batch (``micro_batch_ms``) and peak memory per micro-batch and CFG, for ``--mode`` and, with CFG,
  the training gradient ``--cfg-grad`` (``algo.cfg_grad``; rows from before it existed count as ``both``,
  the only gradient then); ``optimizer_step_s``: its median optimizer step; ``activation_checkpointing``:
  whether the benchmark ran with it;
* byte counts: the trainer benchmark's ``costs[<mode>/<path>]``; its gradient-parking time
  (``grad_park_s``, what ``tag.park_grads=true`` adds to a TAG switch) goes to ``meta``;
* ``text_encoder_bytes`` / ``vae_param_bytes``: counted on the meta device from the model spec
  (:func:`digenrl.costs.extrapolation.model_facts`);
* ``path``: ``compiled+autocast`` / ``compiled`` / ``eager`` as the trainer benchmark's path settings say.

The VAE decode and the reward are not in either benchmark: measured here at the generator's batch sizes
(median of ``--iters`` calls, random VAE weights, reward ``--reward``; the decoder compiled with
``--compile-vae``, as ``model.compile_vae=true`` runs it, ``meta.vae_decode`` says which), or taken from an
existing cost file of the same model with ``--score-from`` (then nothing runs on a device, so a committed
benchmark can be re-emitted on any machine).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from digenrl.config import CFG_GRAD_MODES, Config
from digenrl.costs.cost_model import CFG_KEYS, CostModel, cost_path, run_path

DEFAULT_OUT_DIR = "runs/costs"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="experiments/measure.py emit",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--generator", required=True, help="generator benchmark JSON (measure.py generator)")
    p.add_argument(
        "--trainer",
        required=True,
        action="append",
        help="trainer benchmark JSON (measure.py trainer); repeatable: the rows of all, a later file's point "
        "replacing an earlier one's at the same micro-batch",
    )
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
    p.add_argument("--score-from", default=None, help="cost file whose decode/reward points to reuse")
    p.add_argument(
        "--compile-vae",
        action="store_true",
        help="time the decode with the VAE's decoder compiled (model.compile_vae=true; --warmup >= 1)",
    )
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--out-dir", default=DEFAULT_OUT_DIR, help="folder of <device>-<model>.json")
    args = p.parse_args(argv)
    if args.iters < 1 or args.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    if args.compile_vae and args.warmup < 1:
        p.error("--compile-vae needs --warmup >= 1: the first decode of each batch size compiles")
    if args.compile_vae and args.score_from:
        p.error("--compile-vae times the decode here; --score-from reuses another file's points")
    return args


def _by_cfg(rows: list[dict], key: str, value: str, path: str, scale: float) -> dict[str, dict[int, Any]]:
    """{cfg|no_cfg: {batch: value × scale}} from the benchmark rows of ``path`` only."""
    out: dict[str, dict[int, Any]] = {}
    for r in rows:
        if r.get("path") != path or r.get(value) is None:
            continue
        out.setdefault(CFG_KEYS[bool(r["cfg"])], {})[int(r[key])] = r[value] * scale
    return out


def _bytes(points: dict[str, dict[int, float]]) -> dict[str, dict[int, int]]:
    return {flag: {b: int(v) for b, v in pts.items()} for flag, pts in points.items()}


def generator_points(report: dict, path: str) -> tuple[dict, dict]:
    """(seconds, peak bytes) per CFG flag and batch of the generator benchmark's ``path`` rows."""
    seconds = _by_cfg(report["results"], "batch_size", "ms_per_step", path, 1e-3)
    if not seconds:
        raise ValueError(f"generator JSON has no timed rows for path {path!r}")
    return seconds, _bytes(_by_cfg(report["results"], "batch_size", "peak_mem_gib", path, 2**30))


def trainer_points(report: dict, mode: str, path: str, cfg_grad: str) -> tuple[dict, dict, float]:
    """(seconds, peak bytes, optimizer step seconds) of the trainer benchmark's ``mode`` / ``path`` rows."""
    rows = [r for r in report["results"] if r.get("mode") == mode]
    grads = {r.get("cfg_grad", "both") for r in rows if r.get("cfg") and "micro_batch_ms" in r}
    if grads and cfg_grad not in grads:
        raise ValueError(
            f"trainer JSON has CFG rows for cfg_grad {sorted(grads)} only, not {cfg_grad!r}: pass --cfg-grad "
            f"{sorted(grads)[0]}, or re-run the trainer benchmark with --cfg-grad {cfg_grad}"
        )
    rows = [r for r in rows if not r.get("cfg") or r.get("cfg_grad", "both") == cfg_grad]
    seconds = _by_cfg(rows, "micro_batch_size", "micro_batch_ms", path, 1e-3)
    if not seconds:
        raise ValueError(f"trainer JSON has no timed rows for mode {mode!r}, path {path!r}")
    peaks = _bytes(_by_cfg(rows, "micro_batch_size", "peak_mem_gib", path, 2**30))
    steps = [r["optimizer_step_ms"] for r in rows if r.get("path") == path and "optimizer_step_ms" in r]
    return seconds, peaks, statistics.median(steps) / 1e3


def trainer_bytes(report: dict, mode: str, path: str) -> dict:
    costs = report.get("costs", {})
    key = f"{mode}/{path}"
    if key in costs and "error" not in costs[key]:
        return costs[key]
    raise ValueError(f"trainer JSON has no byte counts for {key} (keys: {sorted(costs)})")


def merge_trainer_reports(reports: list[dict]) -> dict:
    """One trainer report from several of one model: every row (later rows win for the same point, because
    the point tables are filled in order), byte counts and path settings from the last report with them."""
    if len({r["model"] for r in reports}) != 1:
        raise ValueError(f"trainer JSONs of different models: {sorted({r['model'] for r in reports})}")
    merged = {**reports[0], "results": [row for r in reports for row in r["results"]]}
    for key in ("costs", "paths", "cfg_split_min_batch"):
        for report in reports:
            if report.get(key):
                merged[key] = report[key]
    merged["argv"] = [a for r in reports for a in r.get("argv", [])]  # e.g. --activation-checkpointing
    return merged


def path_of(report: dict, path: str) -> str:
    """The :data:`digenrl.costs.cost_model.PATHS` entry a benchmark's ``path`` ran."""
    if path == "eager":
        return "eager"
    settings = report.get("paths", {}).get(path, {})
    return run_path(bool(settings.get("compiled")), bool(settings.get("autocast")))


def measure_decode_and_reward(
    model: str, batches: list[int], latent_shape: list[int], dtype: str, args: argparse.Namespace
) -> tuple[dict[int, float], dict[int, float], int]:
    """Seconds to decode B latents with the spec's VAE (random weights) and to score B images."""
    import torch

    from digenrl.data.dtypes import TORCH_DTYPES
    from digenrl.models import get_model_spec
    from digenrl.models.optimize import compile_vae_decoder
    from digenrl.models.vae import LatentDecoder
    from digenrl.perf import roofline
    from digenrl.rewards.registry import build_reward

    device = roofline.resolve_device(args.device)
    spec = get_model_spec(model)
    torch.manual_seed(0)
    decoder = LatentDecoder.build(spec, device=device, dtype=TORCH_DTYPES[dtype])
    if args.compile_vae and not compile_vae_decoder(decoder):
        raise ValueError(f"--compile-vae: {model}'s VAE has no decoder network to compile")
    reward = build_reward(args.reward, device=device)
    prompts = [f"a photo of object number {i}" for i in range(max(batches))]
    decode, score = {}, {}
    for b in batches:
        z = torch.randn(b, *latent_shape, device=device)
        times = roofline.time_calls_ms(
            lambda z=z: decoder.decode(z), device, warmup=args.warmup, iters=args.iters
        )
        decode[b] = statistics.median(times) / 1e3
        images = decoder.decode(z)
        times = roofline.time_calls_ms(
            lambda im=images, b=b: reward(im, prompts[:b]), device, warmup=args.warmup, iters=args.iters
        )
        score[b] = statistics.median(times) / 1e3
    reward_params = [
        p for v in vars(reward).values() if isinstance(v, torch.nn.Module) for p in v.parameters()
    ]
    return decode, score, int(sum(p.numel() * p.element_size() for p in reward_params))


def build_cost_model(args: argparse.Namespace, command: str = "") -> CostModel:
    generator = json.loads(Path(args.generator).read_text())
    trainer = merge_trainer_reports([json.loads(Path(t).read_text()) for t in args.trainer])
    if generator["model"] != trainer["model"]:
        raise ValueError(f"generator JSON is {generator['model']!r}, trainer JSON {trainer['model']!r}")
    model = generator["model"]
    gen_points, gen_peaks = generator_points(generator, args.path)
    train_points, train_peaks, optimizer_s = trainer_points(trainer, args.mode, args.path, args.cfg_grad)
    counts = trainer_bytes(trainer, args.mode, args.path)
    batches = sorted({b for pts in gen_points.values() for b in pts})
    if args.score_from:
        source = CostModel.load(args.score_from)
        if source.model != model:
            raise ValueError(f"--score-from {args.score_from} is for {source.model!r}, not {model!r}")
        decode, score, reward_bytes = (
            source.vae_decode_points,
            source.reward_points,
            source.reward_param_bytes,
        )
        reward_name = source.meta.get("reward", args.reward)
        vae_decode = source.meta.get("vae_decode", "eager")
    else:
        decode, score, reward_bytes = measure_decode_and_reward(
            model, batches, generator["latent_shape"], generator["dtype"], args
        )
        reward_name = args.reward
        vae_decode = "compiled" if args.compile_vae else "eager"
    from digenrl.costs.extrapolation import component_bytes  # counts parameters on the meta device

    facts = component_bytes(model)
    filled: dict[str, Any] = {
        "device": args.device_name,
        "model": model,
        "generator_step_points": gen_points,
        "vae_decode_points": decode,
        "reward_points": score,
        "train_points": train_points,
        "optimizer_step_s": optimizer_s,
        "reward_param_bytes": reward_bytes,
        "text_encoder_bytes": facts["text_encoder_bytes"],
        "vae_param_bytes": facts["vae_bytes"],
        "path": path_of(trainer, args.path),
        "activation_checkpointing": "--activation-checkpointing" in trainer.get("argv", []),
        "train_peak_bytes": train_peaks,
        "generator_peak_bytes": gen_peaks,
    }
    # every other field of the cost model (byte counts) comes from the trainer bench
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
            "generator_path": path_of(generator, args.path),
            "generator_path_settings": generator.get("paths", {}).get(args.path),
            "trainer_path_settings": trainer.get("paths", {}).get(args.path),
            "trainer_mode": args.mode,
            "cfg_grad": args.cfg_grad,
            "cfg_split_min_batch": trainer.get("cfg_split_min_batch"),
            "grad_park_s": counts.get("grad_park_s", counts.get("helper_switch_s")),
            "reward": reward_name,
            "score_from": args.score_from,
            "vae_decode": vae_decode,
            "height": generator.get("height"),
            "width": generator.get("width"),
            "frames": generator.get("frames"),
            "latent_shape": generator.get("latent_shape"),
            "train_steps_per_sample": counts.get("train_steps_per_sample"),
            "environment": generator.get("environment"),
            "sources": [str(args.generator), *map(str, args.trainer)],
        },
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python experiments/measure.py emit " + shlex.join(sys.argv[2:] if argv is None else argv)
    costs = build_cost_model(args, command=command.strip())
    out = costs.save(cost_path(costs.device, costs.model, args.out_dir))
    print(costs.describe())
    print(f"wrote {out}")
    return 0
