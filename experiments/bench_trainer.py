"""Benchmark the policy update (PolicyTrainer.accumulate + step) of a zoo entry with random weights.

    python experiments/bench_trainer.py                                     # tiny-sd3, CPU or GPU
    python experiments/bench_trainer.py --model sd3.5-medium --modes lora,full \
        --micro-batch-sizes 1,2,4,8 --samples 8 --train-steps 2 --out sd35_train.json

For each training mode (LoRA / full fine-tune) and micro-batch size it times one logical batch of
``samples × train-steps`` training units: the FlowGRPO training forward (velocity with the rollout's CFG,
flow-SDE transition log-prob, clipped loss, KL to the adapter-disabled reference when --kl-beta > 0),
backward, and the optimizer step, in one process (backend ``none``). Trajectory data are synthetic and
re-recorded with the current weights before each micro-batch size, so the ratio spread of the first
(pre-update) pass shows how far the training forward drifts from the rollout forward (all --samples in one
forward) at that micro-batch composition. Reported: ms per unit (median over --iters logical batches),
units/s, peak CUDA memory. Text conditions are random tensors with the spec's shapes (no text encoder).
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

from digenrl.config import Config, apply_overrides
from digenrl.models import MODEL_SPECS, FlowModel, TextCondition, build_flow_model
from digenrl.rollout.sampler import Sampler
from digenrl.rollout.trajectory import TrajectoryBatch
from digenrl.trainer import PolicyTrainer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _int_list(text: str, flag: str, parser: argparse.ArgumentParser) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        parser.error(f"{flag} must be comma-separated integers, got {text!r}")
    if not values or min(values) < 1:
        parser.error(f"{flag} needs positive integers")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-sd3", choices=sorted(MODEL_SPECS), help="zoo entry (model.name)")
    p.add_argument("--modes", default="lora,full", help="comma-separated training modes: lora, full")
    p.add_argument("--micro-batch-sizes", default="1,2,4", help="training units per forward/backward")
    p.add_argument("--samples", type=int, default=4, help="trajectories per logical batch")
    p.add_argument("--train-steps", type=int, default=2, help="trained transitions per trajectory")
    p.add_argument("--num-steps", type=int, default=None, help="sampler steps (default: the model's)")
    p.add_argument("--guidance-scale", type=float, default=None, help="CFG scale (default: the model's)")
    p.add_argument(
        "--kl-beta", type=float, default=0.0, help="KL weight (LoRA only; adds a reference forward)"
    )
    p.add_argument("--lora-rank", type=int, default=32)
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--height", type=int, default=None, help="pixels (default: the model's)")
    p.add_argument("--width", type=int, default=None, help="pixels (default: the model's)")
    p.add_argument("--frames", type=int, default=None, help="video frames (default: the model's)")
    p.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:1")
    p.add_argument(
        "--dtype", default="auto", choices=["auto", *DTYPES], help="auto: bfloat16 on cuda else fp32"
    )
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's)")
    p.add_argument("--warmup", type=int, default=1, help="untimed logical batches per configuration")
    p.add_argument("--iters", type=int, default=3, help="timed logical batches per configuration (median)")
    p.add_argument("--out", default=None, help="write results as JSON to this path")
    args = p.parse_args(argv)
    args.micro_batch_sizes = _int_list(args.micro_batch_sizes, "--micro-batch-sizes", p)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or any(m not in ("lora", "full") for m in args.modes):
        p.error(f"--modes must be a comma-separated subset of lora,full, got {args.modes}")
    if args.samples < 1 or args.train_steps < 1 or args.iters < 1 or args.warmup < 0:
        p.error("--samples, --train-steps and --iters must be >= 1, --warmup >= 0")
    if args.kl_beta < 0:
        p.error("--kl-beta must be >= 0")
    return args


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def random_condition(flow_model: FlowModel, batch: int, device: torch.device) -> TextCondition:
    text = flow_model.spec.text_encoder
    embeds = torch.randn(batch, text.seq_len, text.embed_dim, device=device)
    pooled = None if text.pooled_dim is None else torch.randn(batch, text.pooled_dim, device=device)
    mask = torch.ones(batch, text.seq_len, device=device, dtype=torch.bool) if text.uses_mask else None
    return TextCondition(embeds, pooled, mask)


def make_config(args: argparse.Namespace, mode: str, dtype: str) -> Config:
    overrides = {
        "model.name": args.model,
        "model.dtype": dtype,
        "trainer.mode": mode,
        "trainer.backend": "none",
        "trainer.lora_rank": args.lora_rank,
        "trainer.lora_alpha": 2 * args.lora_rank,
        "trainer.activation_checkpointing": args.activation_checkpointing,
        "algo.kl_beta": args.kl_beta if mode == "lora" else 0.0,
        "sampler.num_steps": args.num_steps,
        "sampler.guidance_scale": args.guidance_scale,
    }
    return apply_overrides(Config(), overrides)


@torch.no_grad()
def synthetic_batch(
    flow_model: FlowModel,
    sampler: Sampler,
    latent_shape: tuple[int, ...],
    args: argparse.Namespace,
    uncond: TextCondition | None,
    device: torch.device,
) -> TrajectoryBatch:
    """On-policy trajectories: every trained transition is drawn by the sampler from the model itself."""
    b, k = args.samples, min(args.train_steps, sampler.num_steps)
    cond = random_condition(flow_model, b, device)
    x = torch.randn(b, *latent_shape, device=device)
    lat, nxt, logp, sig, nsig = [], [], [], [], []
    for i in range(k):
        s = sampler.sigmas[i].to(device).expand(b).contiguous()
        sn = sampler.sigmas[i + 1].to(device).expand(b).contiguous()
        v = sampler.velocity(flow_model, x, s, cond, uncond)
        res = sampler.transition(v, x, s, sn, noise=torch.randn(x.shape, device=device))
        lat.append(x)
        nxt.append(res.prev_sample)
        logp.append(res.log_prob)
        sig.append(s)
        nsig.append(sn)
        x = res.prev_sample
    return TrajectoryBatch(
        prompts=[f"benchmark prompt {i}" for i in range(b)],
        prompt_ids=torch.arange(b) // 2,
        sample_ids=torch.arange(b) % 2,
        seeds=torch.arange(b),
        cond=cond,
        latents=torch.stack(lat, 1),
        next_latents=torch.stack(nxt, 1),
        log_probs=torch.stack(logp, 1),
        step_indices=torch.arange(k).expand(b, -1).clone(),
        sigmas=torch.stack(sig, 1),
        next_sigmas=torch.stack(nsig, 1),
        policy_version=torch.zeros(b, dtype=torch.long),
        iteration=0,
        advantages=torch.randn(b, device=device),
    )


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_mode(args: argparse.Namespace, mode: str, device: torch.device, dtype_name: str) -> list[dict]:
    cfg = make_config(args, mode, dtype_name)
    torch.manual_seed(0)
    flow_model = build_flow_model(args.model, dtype=DTYPES[dtype_name], device=device)
    height = args.height or flow_model.spec.default_height
    width = args.width or flow_model.spec.default_width
    frames = args.frames if flow_model.spec.is_video else None
    latent_shape = flow_model.latent_shape(height, width, frames)
    sampler = Sampler.from_config(cfg, flow_model.spec, flow_model.token_count(height, width, frames))
    uncond = random_condition(flow_model, 1, device) if sampler.true_cfg else None
    trainer = PolicyTrainer(cfg, flow_model, sampler, uncond=uncond, device=device)
    trainable = sum(p.numel() for p in trainer.backend.trainable_parameters())
    rows = []
    for mbs in args.micro_batch_sizes:
        trainer.cfg.trainer.micro_batch_size = mbs
        batch = synthetic_batch(flow_model, sampler, latent_shape, args, uncond, device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        times, on_policy = [], {}
        for i in range(args.warmup + args.iters):
            synchronize(device)
            start = time.perf_counter()
            stats = trainer.accumulate(batch, 1.0 / batch.num_units)
            trainer.step()
            on_policy = on_policy or stats
            synchronize(device)
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
        median = statistics.median(times)
        rows.append(
            {
                "model": args.model,
                "mode": mode,
                "dtype": dtype_name,
                "micro_batch_size": mbs,
                "units": batch.num_units,
                "cfg": sampler.true_cfg,
                "kl": cfg.algo.kl_beta > 0,
                "trainable_params": trainable,
                "latent_shape": list(latent_shape),
                "s_per_batch": median,
                "ms_per_unit": 1e3 * median / batch.num_units,
                "units_per_s": batch.num_units / median,
                "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30
                if device.type == "cuda"
                else None,
                "on_policy_ratio_min": on_policy["ratio_min"],
                "on_policy_ratio_max": on_policy["ratio_max"],
            }
        )
        print_row(rows[-1])
    del trainer, flow_model
    return rows


def print_header() -> None:
    print(
        f"{'model':<16}{'mode':<6}{'mbs':>5}{'units':>7}{'ms/unit':>11}{'units/s':>10}{'peak GiB':>10}"
        f"{'max |ratio-1|':>15}"
    )


def print_row(r: dict) -> None:
    mem = f"{r['peak_mem_gib']:.2f}" if r["peak_mem_gib"] is not None else "-"
    spread = max(abs(r["on_policy_ratio_min"] - 1), abs(r["on_policy_ratio_max"] - 1))
    print(
        f"{r['model']:<16}{r['mode']:<6}{r['micro_batch_size']:>5}{r['units']:>7}"
        f"{r['ms_per_unit']:>11.2f}{r['units_per_s']:>10.2f}{mem:>10}{spread:>15.2e}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype_name = args.dtype if args.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{platform.machine()} CPU"
    print(f"# trainer benchmark on {where}, {dtype_name}, torch {torch.__version__}")
    print_header()
    rows = [row for mode in args.modes for row in bench_mode(args, mode, device, dtype_name)]
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        meta = {"device": where, "torch": torch.__version__, "argv": sys.argv[1:]}
        Path(args.out).write_text(json.dumps({"meta": meta, "results": rows}, indent=1))
        print(f"# wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
