"""The same policy update under the trainer backends, side by side on one device (world size 1): FSDP2,
DeepSpeed ZeRO-2 and ZeRO-3, for full fine-tuning and LoRA.

    python experiments/measure.py backends                                  # tiny-sd3 on CPU (gloo)
    python experiments/measure.py backends --config experiments/configs/sd35-medium-lora.yaml \
        model.compile=false --out out/backends                              # SD3.5-M, 512², bf16, one GPU

The model, resolution, dtype, sampler (steps, guidance), LoRA rank, learning rates and micro-batch size come
from ``--config`` and ``key=value`` overrides, as ``run_train.py`` reads them; weights are random (seeded, so
every backend starts from the same ones). One logical batch of ``--samples × --train-steps`` on-policy units
(drawn by the sampler from the initial model, :func:`digenrl.perf.bench_trainer.synthetic_batch`) is trained
by every configuration:

* **agreement**: after one optimizer step on that batch, the trainable weights (fp32 master weights where
  the backend keeps them: FSDP2 full fine-tuning in bf16, DeepSpeed bf16) are compared with the first
  backend's (the reference, FSDP2 by default): max |Δθ| difference, and the relative L2 difference of the
  updates ‖Δ − Δ_ref‖ / ‖Δ_ref‖;
* **speed**: ``--warmup`` more updates untimed, then ``--iters`` timed ones (forward + backward of every unit
  and the optimizer step); seconds per update and per unit are medians;
* **memory**: peak ``torch.cuda.max_memory_allocated`` over the updates (model, gradients, optimizer state
  and activations), and what stays allocated once the configuration is torn down (a leak check).

FSDP2 runs as FSDP2 on a one-rank mesh (``exact_backend``), not as the plain single-process path a run
with one trainer would take. DeepSpeed must be installed (``pip install digenrl[deepspeed]``; its CPU
accelerator runs the tiny model with gloo). ``--out`` is a directory (``backends-<model>.json`` and ``.md``)
or a ``.json`` path; both are rewritten after every configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import json
import math
import statistics
import sys
import time
import traceback
from types import SimpleNamespace

import torch
import torch.distributed as dist

from digenrl.config import Config, load_config
from digenrl.data.dtypes import TORCH_DTYPES
from digenrl.data.trajectory import TrajectoryBatch
from digenrl.models import MODEL_SPECS, TextCondition, build_flow_model
from digenrl.perf import bench_cli, roofline
from digenrl.perf.bench_cli import fmt, name_list, output_paths
from digenrl.perf.bench_trainer import synthetic_batch
from digenrl.rollout.sampler import Sampler
from digenrl.trainer import PolicyTrainer
from digenrl.trainer.parallel import import_deepspeed, init_one_rank_group

#: ``--backends`` names → (trainer.backend, trainer.deepspeed_stage)
BACKENDS = {
    "fsdp2": ("fsdp2", None),
    "deepspeed-0": ("deepspeed", 0),
    "deepspeed-1": ("deepspeed", 1),
    "deepspeed-2": ("deepspeed", 2),
    "deepspeed-3": ("deepspeed", 3),
    "ddp": ("ddp", None),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="experiments/measure.py backends",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", default=None, help="a run config (YAML); default: the built-in tiny-sd3 one")
    p.add_argument("overrides", nargs="*", help="key=value config overrides, as run_train.py takes them")
    p.add_argument("--backends", default="fsdp2,deepspeed-2,deepspeed-3", help="first one = the reference")
    p.add_argument("--modes", default="full,lora", help="comma-separated training modes: full, lora")
    p.add_argument("--samples", type=int, default=None, help="trajectories (default: micro-batch size)")
    p.add_argument("--train-steps", type=int, default=1, help="trained transitions per trajectory")
    p.add_argument("--full-lr", type=float, default=None, help="trainer.lr for mode full (default: 1e-5)")
    bench_cli.add_device_flags(p, dtype_help=None, threads=False)
    bench_cli.add_timing_flags(
        p,
        warmup=1,
        iters=3,
        warmup_help="untimed updates after the compared one",
        iters_help="timed updates per configuration (median)",
    )
    bench_cli.add_report_flags(p, flops=False)
    args = p.parse_args(argv)
    args.backends = name_list(args.backends, "--backends", tuple(BACKENDS), p)
    args.modes = name_list(args.modes, "--modes", ("full", "lora"), p)
    if args.train_steps < 1 or args.iters < 1 or args.warmup < 0 or (args.samples or 1) < 1:
        p.error("--samples, --train-steps and --iters must be >= 1, --warmup >= 0")
    return args


def require_deepspeed(backends: list[str], device: torch.device) -> None:
    """Fail before any model is built when a DeepSpeed backend is asked for and cannot run (not installed,
    or its accelerator is not ``device``'s type: :func:`digenrl.trainer.parallel.import_deepspeed`)."""
    if any(BACKENDS[b][0] == "deepspeed" for b in backends):
        try:
            import_deepspeed(device)
        except (ImportError, RuntimeError) as exc:
            raise SystemExit(f"--backends {','.join(backends)}: {exc}") from None


def mode_config(args: argparse.Namespace, mode: str, backend: str) -> Config:
    name, stage = BACKENDS[backend]
    cfg = load_config(args.config, list(args.overrides))
    cfg.trainer.mode, cfg.trainer.backend = mode, name
    if stage is not None:
        cfg.trainer.deepspeed_stage = stage
    if mode == "full":
        cfg.trainer.lr = args.full_lr if args.full_lr is not None else 1e-5  # flow_grpo's full fine-tune lr
        cfg.algo.kl_beta = 0.0
    return cfg


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = roofline.resolve_device(args.device)
        base = load_config(args.config, list(args.overrides))
        self.model_name = base.model.name
        self.t_start = time.perf_counter()
        self.report: dict = {
            "model": base.model.name,
            "device": str(self.device),
            "device_name": roofline.device_description(self.device),
            "dtype": base.model.dtype,
            "height": base.model.height,
            "width": base.model.width,
            "micro_batch_size": base.trainer.micro_batch_size,
            "environment": {**roofline.environment(), "deepspeed": _deepspeed_version()},
            "argv": sys.argv[1:] if args.out else [],
            "reference": args.backends[0],
            "results": [],
        }

    def write(self) -> None:
        if not self.args.out:
            return
        json_path, md_path = output_paths(self.args.out, "backends", self.model_name)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(self.report, indent=1))
        md_path.write_text(format_markdown(self.report) + "\n")

    def over_budget(self) -> bool:
        return bool(self.args.time_budget_s) and time.perf_counter() - self.t_start > self.args.time_budget_s

    def run(self) -> dict:
        for mode in self.args.modes:
            ref: dict = {}
            batch: TrajectoryBatch | None = None
            for backend in self.args.backends:
                row: dict = {"mode": mode, "backend": backend}
                if self.over_budget():
                    self.report["results"].append({**row, "skipped": "time budget"})
                    continue
                try:
                    batch = self.run_one(mode, backend, row, ref, batch)
                except torch.OutOfMemoryError:
                    row["skipped"] = "out of memory"
                except Exception as exc:  # one broken configuration must not lose the others
                    traceback.print_exc()
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
                finally:
                    gc.collect()
                    if self.device.type == "cuda":
                        torch.cuda.empty_cache()
                        row["left_allocated_gib"] = torch.cuda.memory_allocated(self.device) / 2**30
                self.report["results"].append(row)
                print(format_row(row), flush=True)
                self.write()
            ref.clear()
        return self.report

    def run_one(
        self, mode: str, backend: str, row: dict, ref: dict, batch: TrajectoryBatch | None
    ) -> TrajectoryBatch:
        """Build, compare one step with the reference, time the rest; returns the shared batch."""
        args, device = self.args, self.device
        cfg = mode_config(args, mode, backend)
        spec = MODEL_SPECS[cfg.model.name]
        t0 = time.perf_counter()
        torch.manual_seed(cfg.seed)
        flow_model = build_flow_model(spec, dtype=TORCH_DTYPES[cfg.model.dtype], device=device)
        height, width = cfg.model.height or spec.default_height, cfg.model.width or spec.default_width
        frames = cfg.model.frames if spec.is_video else None
        tokens = flow_model.token_count(height, width, frames)
        sampler = Sampler.from_config(cfg, spec, tokens)
        torch.manual_seed(cfg.seed + 1)
        uncond = TextCondition.random(spec.text_encoder, 1, device=device) if sampler.true_cfg else None
        if batch is None:  # drawn once per mode from the initial weights: every backend trains on it
            torch.manual_seed(cfg.seed + 2)
            samples = args.samples or cfg.trainer.micro_batch_size
            shape = SimpleNamespace(samples=samples, train_steps=args.train_steps)
            latent_shape = flow_model.latent_shape(height, width, frames)
            batch = synthetic_batch(flow_model, sampler, latent_shape, shape, uncond, device)
        torch.manual_seed(cfg.seed + 3)  # LoRA's initial A matrices: the same for every backend
        trainer = PolicyTrainer(cfg, flow_model, sampler, uncond=uncond, device=device, exact_backend=True)
        self.report["height"], self.report["width"] = height, width
        row.update(
            {
                "backend_class": type(trainer.backend).__name__,
                "trainable_params": sum(_numel(p) for p in trainer.backend.trainable_parameters()),
                "units": batch.num_units,
                "lr": cfg.trainer.lr,
                "setup_s": time.perf_counter() - t0,
            }
        )
        try:
            before = trainer.trainable_state_dict()
            roofline.reset_peak_memory(device)
            stats = trainer.accumulate(batch, 1.0 / batch.num_units)
            step = trainer.step()
            after = trainer.trainable_state_dict()
            row["grad_norm"], row["update_norm"] = step["grad_norm"], step["update_norm"]
            spread = max(abs(stats["ratio_min"] - 1), abs(stats["ratio_max"] - 1))
            row["on_policy_max_abs_ratio_minus_1"] = spread
            if not ref:
                ref.update(before=before, after=after)
            else:
                row.update(compare(before, after, ref["before"], ref["after"], device))
            del before, after
            times, acc_times = [], []
            for i in range(args.warmup + args.iters):
                roofline.synchronize(device)
                t1 = time.perf_counter()
                trainer.accumulate(batch, 1.0 / batch.num_units)
                roofline.synchronize(device)
                t2 = time.perf_counter()
                trainer.step()
                roofline.synchronize(device)
                if i >= args.warmup:
                    times.append(time.perf_counter() - t1)
                    acc_times.append(t2 - t1)
            update_s = statistics.median(times)
            row.update(
                {
                    "update_s": update_s,
                    "accumulate_s": statistics.median(acc_times),
                    "s_per_unit": update_s / batch.num_units,
                    "peak_mem_gib": roofline.peak_memory_gib(device),
                }
            )
        finally:
            engine = getattr(trainer.backend, "engine", None)
            if engine is not None:
                engine.destroy()
            del trainer, flow_model
        return batch


def compare(before, after, ref_before, ref_after, device: torch.device) -> dict[str, float]:
    """How one configuration's first update differs from the reference's: max |Δ| in fp32 and L2 sums in
    float64, one tensor at a time on ``device`` (billions of parameters are too slow on the host)."""
    if before.keys() != ref_before.keys():
        raise ValueError("trainable parameters differ from the reference's")
    init_diff = max_diff = 0.0
    delta_sq = ref_sq = 0.0
    for name in ref_before:
        b0, a0, b, a = (t[name].to(device, torch.float32) for t in (ref_before, ref_after, before, after))
        init_diff = max(init_diff, float((b - b0).abs().max()))
        max_diff = max(max_diff, float((a - a0).abs().max()))
        delta_sq += float((a - a0).double().pow(2).sum())  # (a - b0) - (a0 - b0)
        ref_sq += float((a0 - b0).double().pow(2).sum())
    return {
        "init_max_abs_diff": init_diff,
        "max_abs_diff": max_diff,
        "update_rel_diff": math.sqrt(delta_sq / ref_sq) if ref_sq > 0 else float("nan"),
    }


def _numel(p: torch.Tensor) -> int:
    return p.ds_numel if hasattr(p, "ds_numel") else p.numel()


def _deepspeed_version() -> str | None:
    """The installed DeepSpeed's version, read from its metadata: importing ``deepspeed`` fixes its
    accelerator for the whole process, which :func:`require_deepspeed` must choose first."""
    try:
        return importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        return None


def format_row(row: dict) -> str:
    if "update_s" not in row:
        return f"[backends] {row['mode']:4s} {row['backend']:12s} {row.get('skipped') or row.get('error')}"
    return (
        f"[backends] {row['mode']:4s} {row['backend']:12s} {row['s_per_unit'] * 1e3:8.2f} ms/unit "
        f"peak {fmt(row.get('peak_mem_gib'), '.2f')} GiB  max|dθ| {fmt(row.get('max_abs_diff'), '.3g')}  "
        f"rel Δ {fmt(row.get('update_rel_diff'), '.3g')}"
    )


def format_markdown(report: dict) -> str:
    lines = [
        f"### backends: {report['model']}, {report['device_name']}, {report['dtype']}, "
        f"{report['width']}x{report['height']}, micro-batch {report['micro_batch_size']}, world size 1",
        "",
        f"Reference: {report['reference']} (agreement columns compare the first optimizer step on the same "
        f"batch with it). DeepSpeed {report['environment'].get('deepspeed')}, torch "
        f"{report['environment'].get('torch')}.",
        "",
        "| mode | backend | trainable params | units | s/update | ms/unit | peak GiB | init max abs diff "
        "| max abs diff after step | update rel diff | grad norm | left GiB |",
        "|:---|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        if "update_s" not in r:
            why = r.get("skipped") or r.get("error", "-")
            lines.append(f"| {r['mode']} | {r['backend']} | {why[:80]} |" + " - |" * 9)
            continue
        lines.append(
            f"| {r['mode']} | {r['backend']} | {r['trainable_params']:,} | {r['units']} | "
            f"{r['update_s']:.3f} | {r['s_per_unit'] * 1e3:.2f} | {fmt(r.get('peak_mem_gib'), '.2f')} | "
            f"{fmt(r.get('init_max_abs_diff'), '.2e')} | {fmt(r.get('max_abs_diff'), '.2e')} | "
            f"{fmt(r.get('update_rel_diff'), '.2e')} | {fmt(r.get('grad_norm'), '.4g')} | "
            f"{fmt(r.get('left_allocated_gib'), '.2f')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = Bench(args)
    require_deepspeed(args.backends, bench.device)
    init_one_rank_group(bench.device)
    try:
        report = bench.run()
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    print(format_markdown(report))
    failed = [r for r in report["results"] if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
