"""Benchmark the FlowModel forward (one denoising step) of a zoo entry with random weights.

    python experiments/bench_generator.py                                   # tiny-sd3, CPU or GPU
    python experiments/bench_generator.py --model sd3.5-medium --batch-sizes 1,4,16 --out sd35.json

For each batch size B and CFG setting it times the transformer forward that one sampler step issues:
B samples, or 2B (cond ++ uncond, as the rollout sampler batches them) with classifier-free guidance on a
true-CFG model. Guidance-distilled models (FLUX-dev, HunyuanVideo) embed guidance, so "cfg on" equals "off"
and is skipped. Warm-up forwards first, then the median of N timed forwards (CUDA synchronised). FLOPs of one
forward are counted with torch.utils.flop_counter.FlopCounterMode (matmuls, convolutions, attention), so
achieved TFLOP/s = FLOPs / median time. Text conditions are random tensors with the spec's shapes: text
encoders are not built, so a 20 B model is benchmarked without its 8 B encoder.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

try:
    import digenrl  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from digenrl.models import (
    MODEL_SPECS,
    FlowModel,
    TextCondition,
    build_flow_model,
    get_model_spec,
    set_attention_backend,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-sd3", choices=sorted(MODEL_SPECS), help="zoo entry (model.name)")
    p.add_argument("--batch-sizes", default="1,4", help="comma-separated samples per step, e.g. 1,4,16")
    p.add_argument("--cfg", default="both", choices=["on", "off", "both"], help="classifier-free guidance")
    p.add_argument("--height", type=int, default=None, help="pixels (default: the model's)")
    p.add_argument("--width", type=int, default=None, help="pixels (default: the model's)")
    p.add_argument("--frames", type=int, default=None, help="video frames (default: the model's)")
    p.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:1")
    p.add_argument(
        "--dtype", default="auto", choices=["auto", *DTYPES], help="auto: bfloat16 on cuda else fp32"
    )
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's)")
    p.add_argument("--attention-backend", default="native", help="diffusers attention backend")
    p.add_argument("--warmup", type=int, default=2, help="untimed forwards per configuration")
    p.add_argument("--iters", type=int, default=5, help="timed forwards per configuration (median reported)")
    p.add_argument("--no-flops", action="store_true", help="skip FLOP counting")
    p.add_argument("--out", default=None, help="write results as JSON to this path")
    args = p.parse_args(argv)
    try:
        args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    except ValueError:
        p.error(f"--batch-sizes must be comma-separated integers, got {args.batch_sizes!r}")
    if not args.batch_sizes or min(args.batch_sizes) < 1:
        p.error("--batch-sizes needs positive integers")
    if args.iters < 1 or args.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    return args


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def random_condition(flow_model: FlowModel, batch: int, device: torch.device) -> TextCondition:
    text = flow_model.spec.text_encoder
    dtype = flow_model.dtype
    embeds = torch.randn(batch, text.seq_len, text.embed_dim, device=device, dtype=dtype)
    pooled = (
        None if text.pooled_dim is None else torch.randn(batch, text.pooled_dim, device=device, dtype=dtype)
    )
    mask = torch.ones(batch, text.seq_len, device=device, dtype=torch.bool) if text.uses_mask else None
    return TextCondition(embeds, pooled, mask)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.machine()} CPU, {torch.get_num_threads()} threads"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def count_flops(flow_model: FlowModel, x: torch.Tensor, sigma: torch.Tensor, cond: TextCondition) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        flow_model(x, sigma, cond)
    return int(counter.get_total_flops())


def bench_one(
    flow_model: FlowModel, latent_shape: tuple[int, ...], model_batch: int, args: argparse.Namespace
) -> dict:
    device = flow_model.device
    x = torch.randn(model_batch, *latent_shape, device=device, dtype=flow_model.dtype)
    sigma = torch.rand(model_batch, device=device)
    cond = random_condition(flow_model, model_batch, device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    with torch.no_grad():
        for _ in range(args.warmup):
            flow_model(x, sigma, cond)
        synchronize(device)
        for _ in range(args.iters):
            start = time.perf_counter()
            flow_model(x, sigma, cond)
            synchronize(device)
            times.append(time.perf_counter() - start)
    row = {
        "model_batch": model_batch,
        "ms_per_step": 1000 * statistics.median(times),
        "ms_min": 1000 * min(times),
        "ms_max": 1000 * max(times),
        "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }
    if not args.no_flops:
        row["flops_per_step"] = count_flops(flow_model, x, sigma, cond)
        row["tflops_per_s"] = row["flops_per_step"] / (row["ms_per_step"] / 1000) / 1e12
    return row


def run(args: argparse.Namespace) -> dict:
    spec = get_model_spec(args.model)
    device = resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = (
        DTYPES[args.dtype]
        if args.dtype != "auto"
        else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    )
    height, width = args.height or spec.default_height, args.width or spec.default_width
    frames = args.frames if args.frames is not None else spec.default_frames
    t0 = time.perf_counter()
    flow_model = build_flow_model(spec, dtype=dtype, device=device)
    flow_model.eval()
    build_s = time.perf_counter() - t0
    set_attention_backend(flow_model, args.attention_backend)
    latent_shape = flow_model.latent_shape(height, width, frames)
    cfg_modes = {"on": [True], "off": [False], "both": [False, True]}[args.cfg]
    results = []
    for batch in args.batch_sizes:
        for cfg in cfg_modes:
            row = {"batch_size": batch, "cfg": cfg}
            if cfg and not flow_model.uses_true_cfg:
                results.append({**row, "skipped": "guidance-embedded model: no separate CFG pass"})
                continue
            model_batch = 2 * batch if cfg else batch
            try:
                row.update(bench_one(flow_model, latent_shape, model_batch, args))
            except torch.OutOfMemoryError:
                results.append({**row, "model_batch": model_batch, "skipped": "out of memory"})
                continue
            row["samples_per_s"] = batch / (row["ms_per_step"] / 1000)
            results.append(row)
    return {
        "model": spec.name,
        "family": spec.family,
        "parameters": sum(p.numel() for p in flow_model.parameters()),
        "device": str(device),
        "device_name": device_name(device),
        "dtype": str(dtype).removeprefix("torch."),
        "attention_backend": args.attention_backend,
        "height": height,
        "width": width,
        "frames": frames,
        "latent_shape": list(latent_shape),
        "image_tokens": flow_model.token_count(height, width, frames),
        "text_tokens": spec.text_encoder.seq_len,
        "build_s": build_s,
        "warmup": args.warmup,
        "iters": args.iters,
        "torch": torch.__version__,
        "results": results,
    }


def format_table(report: dict) -> str:
    head = (
        f"{report['model']} ({report['parameters'] / 1e6:,.2f} M params) on {report['device']} "
        f"[{report['device_name']}], {report['dtype']}, {report['height']}x{report['width']}"
        + (f"x{report['frames']}f" if report["frames"] else "")
        + f", {report['image_tokens']} image + {report['text_tokens']} text tokens"
    )
    cols = (
        f"{'batch':>5} {'cfg':>4} {'fwd B':>6} {'ms/step':>9} {'samples/s':>10} {'TFLOP/s':>9} "
        f"{'GFLOP/fwd':>10} {'peak GiB':>9}"
    )
    lines = [head, cols, "-" * len(cols)]
    for r in report["results"]:
        if "skipped" in r:
            lines.append(f"{r['batch_size']:>5} {'on' if r['cfg'] else 'off':>4}  skipped: {r['skipped']}")
            continue
        tflops = f"{r['tflops_per_s']:.4g}" if "tflops_per_s" in r else "-"
        gflop = f"{r['flops_per_step'] / 1e9:.4g}" if "flops_per_step" in r else "-"
        mem = f"{r['peak_mem_gib']:.2f}" if r["peak_mem_gib"] is not None else "-"
        lines.append(
            f"{r['batch_size']:>5} {'on' if r['cfg'] else 'off':>4} {r['model_batch']:>6} "
            f"{r['ms_per_step']:>9.2f} {r['samples_per_s']:>10.2f} {tflops:>9} {gflop:>10} {mem:>9}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    print(format_table(report))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
