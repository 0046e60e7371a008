"""Benchmark the policy update (PolicyTrainer.accumulate + step) of a zoo entry with random weights, the
diffusers-eager path and the project's optimised path side by side, plus an attention-backward regression
check.

    python experiments/measure.py trainer                                     # tiny-sd3, CPU or GPU
    python experiments/measure.py trainer --model sd3.5-medium --modes lora --micro-batch-sizes 1,2,4 \
        --samples 4 --train-steps 1 --paths optimized,eager --out out/perf
    python experiments/measure.py trainer --regression-only --regression-model flux.1-dev --out out/perf
    python experiments/measure.py trainer --model sd3.5-medium --modes lora --micro-batch-sizes 4,8,16 \
        --samples 16 --train-steps 1 --cfg on --cfg-grad cond,both --paths optimized --out out/perf

For each training mode (LoRA / full), path, guidance setting and micro-batch size it times one logical batch
of ``samples × train-steps`` units: the FlowGRPO training forward (velocity with the rollout's CFG, flow-SDE
transition log-prob, clipped loss, KL to the adapter-disabled reference when --kl-beta > 0) and backward
(``accumulate``), and separately the optimizer step. Trajectories are re-recorded on-policy with the current
weights before each configuration, so the first accumulate's ratio spread max |r − 1| shows how far the
training forward drifts from the rollout forward; that first pass is never timed (with --compile it compiles:
``first_accumulate_s``). FLOPs of the accumulate (forward + backward) are counted by
FlopCounterMode, and compared with an n³ matmul ceiling measured in the same run.

With CFG, ``--cfg-grad cond,both`` times both training gradients (``algo.cfg_grad``,
digenrl/rollout/sampler.py) side by side, in the same rows and a cond-vs-both table: ``cond`` detaches the
unconditional prediction and, from ``--cfg-split-min-batch`` samples per micro-batch on (default the library's
CFG_SPLIT_MIN_BATCH), runs it as a separate no-graph pass; ``--cfg-split-min-batch 1`` splits at every size,
which measures where the split starts to pay. Each row records ``cfg_grad`` and ``uncond_pass`` (separate,
batched, or mixed when the micro-batch plan has sizes on both sides of the threshold).

Paths (``--paths``; run them ``optimized,eager`` on a GPU: a failing fused kernel can poison the process):

* ``eager``: diffusers and torch defaults (SDPA with torch's kernel choice, cuDNN included);
* ``optimized``: :func:`digenrl.models.optimize.optimize_flow_model` for training (safe attention backend;
  ``torch.compile`` of the repeated blocks with ``--compile``; 16-bit autocast with ``--autocast``), as the
  project trains.

``--regression`` (or ``--regression-only``) runs :mod:`digenrl.perf.backward_check` in subprocesses: a LoRA
forward + backward through a slice of ``--regression-model`` (2 dual-stream + 2 single-stream blocks of
FLUX by default) with each ``--regression-settings`` (default: project-safe, and torch/diffusers defaults),
reported as pass/fail. Text conditions are random tensors with the spec's shapes (no text encoder); for a
masked encoder (Qwen-Image) ``--text-tokens COND,UNCOND`` makes that many tokens real and the rest padding, as
real prompts are, and ``--text-padding`` is ``model.text_padding`` of both paths (``split``: the padding cut,
no mask, as the loop runs it; default ``mask``: the padded, masked forward the committed cost files timed).

``--out`` is a directory (``trainer-<model>.json`` and ``.md``) or a ``.json`` path; the JSON is rewritten
after every configuration. The JSON also carries the byte counts the simulator's cost model needs
(``experiments/measure.py emit`` reads it, :mod:`digenrl.perf.emit_costs`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import traceback
from dataclasses import replace
from itertools import product

import torch

from digenrl.config import CFG_GRAD_MODES, TRAINER_MODES, Config, apply_overrides
from digenrl.data.dtypes import TORCH_DTYPES
from digenrl.data.micro_batches import plan_micro_batches
from digenrl.data.trajectory import TrajectoryBatch
from digenrl.models import MODEL_SPECS, FlowModel, TextCondition, build_flow_model
from digenrl.models.attention_safety import (
    KNOWN_BAD_ATTENTION,
    AttentionShape,
    parse_cudnn_version,
    parse_torch_version,
)
from digenrl.models.optimize import CompileSettings, optimize_flow_model
from digenrl.perf import backward_check, bench_cli, roofline
from digenrl.perf.bench_cli import DYNAMIC, PATHS, fmt, int_list, name_list, output_paths
from digenrl.perf.kernel_profile import format_profile, profile_call
from digenrl.perf.measure_costs import time_grad_park, wire_bytes
from digenrl.rollout.sampler import CFG_SPLIT_MIN_BATCH, Sampler
from digenrl.trainer import PolicyTrainer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="experiments/measure.py trainer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench_cli.add_model_flag(p)
    p.add_argument("--modes", default="lora,full", help="comma-separated training modes: lora, full")
    p.add_argument("--micro-batch-sizes", default="1,2,4", help="training units per forward/backward")
    p.add_argument("--samples", type=int, default=4, help="trajectories per logical batch")
    p.add_argument("--train-steps", type=int, default=2, help="trained transitions per trajectory")
    p.add_argument("--num-steps", type=int, default=None, help="sampler steps (default: the model's)")
    p.add_argument(
        "--cfg",
        default="default",
        choices=["default", "on", "off", "both"],
        help="guidance: the model's default scale, on (>= 1.5), off (1.0), or both on and off",
    )
    p.add_argument(
        "--cfg-grad",
        default=Config().algo.cfg_grad,
        help="comma-separated algo.cfg_grad values timed side by side with CFG on: cond (unconditional "
        "prediction detached), both (full gradient)",
    )
    p.add_argument(
        "--cfg-split-min-batch",
        type=int,
        default=CFG_SPLIT_MIN_BATCH,
        help="cfg_grad=cond: smallest micro-batch that runs the unconditional branch as its own no-graph "
        "pass (1: always)",
    )
    p.add_argument(
        "--kl-beta", type=float, default=0.0, help="KL weight (LoRA only; adds a reference forward)"
    )
    p.add_argument("--lora-rank", type=int, default=32)
    p.add_argument("--activation-checkpointing", action="store_true")
    bench_cli.add_shape_flags(p)
    bench_cli.add_device_flags(p)
    bench_cli.add_optimized_path_flags(p, paths="optimized,eager", paths_help="comma-separated, in run order")
    p.add_argument(
        "--eager-sdpa",
        default="default",
        choices=["default", "safe"],
        help="eager path's SDPA kernels: torch's defaults (cuDNN included), or the project's safe choice "
        "(for models whose default backward is known to fail, e.g. FLUX size on torch 2.11 + cuDNN 9.19)",
    )
    p.add_argument(
        "--autocast",
        action="store_true",
        help="optimised path: 16-bit autocast, LoRA in bf16 (model.autocast)",
    )
    bench_cli.add_timing_flags(
        p,
        warmup=1,
        iters=3,
        warmup_help="untimed batches after the first (on-policy) one",
        iters_help="timed logical batches per configuration (median)",
    )
    bench_cli.add_report_flags(p)
    p.add_argument(
        "--profile",
        action="store_true",
        help="after timing, profile one accumulate per configuration (device-busy fraction, top kernels)",
    )
    bench_cli.add_text_flags(p, padding_default="mask", padding_help="model.text_padding of both paths")
    p.add_argument("--regression", action="store_true", help="also run the attention-backward regression")
    p.add_argument("--regression-only", action="store_true", help="run only the regression check")
    p.add_argument("--regression-model", default="flux.1-dev", help="zoo entry sliced for the check")
    p.add_argument("--regression-blocks", default="2,2", help="dual-stream,single-stream blocks kept")
    p.add_argument("--regression-heights", default="512", help="comma-separated square sizes (pixels)")
    p.add_argument("--regression-settings", default="safe,default", help="subset of safe,default,cudnn")
    p.add_argument("--regression-timeout-s", type=float, default=180.0, help="per subprocess")
    args = p.parse_args(argv)
    args.micro_batch_sizes = int_list(args.micro_batch_sizes, "--micro-batch-sizes", p)
    args.modes = name_list(args.modes, "--modes", TRAINER_MODES, p)
    args.paths = name_list(args.paths, "--paths", PATHS, p)
    args.cfg_grad = name_list(args.cfg_grad, "--cfg-grad", CFG_GRAD_MODES, p)
    if args.cfg_split_min_batch < 1:
        p.error("--cfg-split-min-batch must be >= 1")
    args.regression_settings = name_list(
        args.regression_settings, "--regression-settings", backward_check.SETTINGS, p
    )
    args.regression_heights = int_list(args.regression_heights, "--regression-heights", p)
    bench_cli.check_text(args, p)
    blocks = int_list(args.regression_blocks, "--regression-blocks", p)
    if len(blocks) != 2:
        p.error("--regression-blocks takes two integers: dual-stream,single-stream")
    args.regression_blocks = blocks
    if args.samples < 1 or args.train_steps < 1 or args.iters < 1 or args.warmup < 0:
        p.error("--samples, --train-steps and --iters must be >= 1, --warmup >= 0")
    if args.kl_beta < 0:
        p.error("--kl-beta must be >= 0")
    return args


def guidance_scale(spec, setting: str) -> float | None:
    """The sampler's guidance scale for ``--cfg`` (None: the model's default)."""
    if setting == "default" or spec.guidance_embedded:
        return None
    return max(spec.default_guidance_scale, 1.5) if setting == "on" else 1.0


def uncond_pass(sampler: Sampler, samples: int, train_steps: int, micro_batch_size: int) -> str | None:
    """How the training forward runs the unconditional branch (None without CFG): ``separate`` (its own
    no-graph pass in every micro-batch of the plan), ``batched`` (inside the 2B forward), or ``mixed``."""
    if not sampler.true_cfg:
        return None
    plan = plan_micro_batches(samples, min(train_steps, sampler.num_steps), micro_batch_size)
    kinds = {sampler.separate_uncond_pass(len(mb)) for mb in plan}
    return "separate" if kinds == {True} else "batched" if kinds == {False} else "mixed"


def training_variants(sampler: Sampler, args: argparse.Namespace) -> list[tuple[str | None, Sampler]]:
    """(cfg_grad, sampler) per ``--cfg-grad`` value with CFG; one (None, sampler) without."""
    if not sampler.true_cfg:
        return [(None, sampler)]
    return [
        (g, replace(sampler, cfg_grad=g, cfg_split_min_batch=args.cfg_split_min_batch)) for g in args.cfg_grad
    ]


def make_config(args: argparse.Namespace, mode: str, dtype: str, scale: float | None) -> Config:
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
        "sampler.guidance_scale": scale,
        "model.text_padding": args.text_padding,
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
    *,
    real_tokens: int | None = None,
) -> TrajectoryBatch:
    """On-policy trajectories: every trained transition is drawn by the sampler from the model itself;
    ``real_tokens``: of a masked text encoder, that many real tokens a prompt (default all)."""
    b, k = args.samples, min(args.train_steps, sampler.num_steps)
    cond = TextCondition.random(flow_model.spec.text_encoder, b, device=device, real_tokens=real_tokens)
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
        final_latents=x,
        advantages=torch.randn(b, device=device),
    )


def shipped_bytes(batch: TrajectoryBatch) -> dict[str, int]:
    """The cost model's byte counts of what the systems ship (:func:`digenrl.perf.measure_costs.wire_bytes`);
    a synthetic batch has no rewards yet, so it gets the zero rewards a scored one would carry."""
    rewards = torch.zeros(batch.batch_size, device=batch.final_latents.device)
    sizes = wire_bytes(replace(batch, rewards=rewards))
    return {
        "fragment_bytes_per_sample": sizes["per_sample"],
        "unit_bytes": sizes["per_unit"],
        "cond_bytes_per_sample": sizes["cond"],
        "latent_bytes_per_sample": sizes["latent"],
    }


class Bench:
    """One benchmark run: shared ceiling, FLOP counts and the report written after every row."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = roofline.resolve_device(args.device)
        self.dtype_name = bench_cli.resolve_dtype(args.dtype, self.device)
        self.t_start = time.perf_counter()
        self.cudnn_sdp_default = torch.backends.cuda.cudnn_sdp_enabled()
        self.flops: dict[tuple[str, bool], int] = {}
        self.real_tokens = args.text_tokens or (None, None)  # (prompt, empty prompt) of --text-tokens
        self.report: dict = {
            "model": args.model,
            "device": str(self.device),
            "device_name": roofline.device_description(self.device),
            "dtype": self.dtype_name,
            "environment": roofline.environment(),
            "argv": sys.argv[1:] if args.out else [],
            "cfg_split_min_batch": args.cfg_split_min_batch,
            "real_text_tokens": list(args.text_tokens) if args.text_tokens else None,
            "text_padding": args.text_padding,
            "paths": {},
            "costs": {},
            "results": [],
        }

    def write(self) -> None:
        if not self.args.out:
            return
        json_path, md_path = output_paths(self.args.out, "trainer", self.args.model)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(self.report, indent=1))
        md_path.write_text(format_markdown(self.report) + "\n")

    def over_budget(self) -> bool:
        return bool(self.args.time_budget_s) and time.perf_counter() - self.t_start > self.args.time_budget_s

    def measure_ceiling(self) -> None:
        n = self.args.ceiling_size
        n = n if n is not None else (8192 if self.device.type == "cuda" else 256)
        if n > 0:
            self.report["ceiling"] = roofline.matmul_ceiling(self.device, TORCH_DTYPES[self.dtype_name], n=n)

    def run_mode_path(self, mode: str, path: str) -> None:
        args, device = self.args, self.device
        spec = MODEL_SPECS[args.model]
        scales = {
            "default": [None],
            "on": [guidance_scale(spec, "on")],
            "off": [guidance_scale(spec, "off")],
            "both": [guidance_scale(spec, "off"), guidance_scale(spec, "on")],
        }[args.cfg]
        scales = list(dict.fromkeys(scales))  # guidance-distilled models: one setting only
        cfg = make_config(args, mode, self.dtype_name, scales[0])
        torch.manual_seed(0)
        flow_model = build_flow_model(args.model, dtype=TORCH_DTYPES[self.dtype_name], device=device)
        height = args.height or spec.default_height
        width = args.width or spec.default_width
        frames = args.frames if spec.is_video else None
        latent_shape = flow_model.latent_shape(height, width, frames)
        tokens = flow_model.token_count(height, width, frames)
        uncond = TextCondition.random(
            flow_model.spec.text_encoder, 1, device=device, real_tokens=self.real_tokens[1]
        )
        samplers = [
            Sampler.from_config(make_config(args, mode, self.dtype_name, s), spec, tokens) for s in scales
        ]
        trainer = PolicyTrainer(cfg, flow_model, samplers[0], uncond=uncond, device=device)
        if path == "eager":
            # PolicyTrainer applied the project's safe attention choice; the eager path measures the defaults
            # unless --eager-sdpa safe keeps it (then eager differs from optimised by compilation alone)
            if args.eager_sdpa == "default":
                torch.backends.cuda.enable_cudnn_sdp(self.cudnn_sdp_default)
            self.report["paths"]["eager"] = {
                "attention": f"native, {'torch SDPA defaults' if args.eager_sdpa == 'default' else 'safe'}",
                "compiled": False,
            }
        batches = {}
        for sampler in samplers:
            trainer.sampler, trainer.uncond = sampler, (uncond if sampler.true_cfg else None)
            batch = synthetic_batch(
                flow_model,
                sampler,
                latent_shape,
                args,
                trainer.uncond,
                device,
                real_tokens=self.real_tokens[0],
            )
            batches[sampler.true_cfg] = (sampler, batch)
            # FLOPs per logical batch depend on the micro-batch size only through the CFG pass layout
            for grad, variant in training_variants(sampler, args):
                trainer.sampler = variant
                for mbs in args.micro_batch_sizes:
                    key = self.flops_key(mode, variant, grad, mbs)
                    if args.no_flops or key in self.flops:
                        continue
                    trainer.cfg.trainer.micro_batch_size = mbs
                    with contextlib.suppress(torch.OutOfMemoryError):
                        self.flops[key] = roofline.count_flops(
                            lambda b=batch: trainer.accumulate(b, 1.0 / b.num_units)
                        )
                    trainer.zero_grad()
        if path == "optimized":
            settings = CompileSettings(mode=args.compile_mode, dynamic=DYNAMIC[args.compile_dynamic])
            applied = optimize_flow_model(
                flow_model,
                compile=args.compile,
                attention_backend=args.attention_backend,
                needs_backward=True,
                compile_settings=settings,
                autocast=args.autocast,
                text_padding=args.text_padding,
            )
            self.report["paths"]["optimized"] = applied.to_dict()
        trainable = trainer.backend.trainable_parameters()
        for true_cfg, (sampler, _) in batches.items():
            trainer.uncond = uncond if true_cfg else None
            # cfg_grad innermost: a time budget that runs out still leaves pairs to compare
            for mbs, (grad, variant) in product(args.micro_batch_sizes, training_variants(sampler, args)):
                sampler = trainer.sampler = variant
                row = {
                    "path": path,
                    "mode": mode,
                    "cfg": true_cfg,
                    "cfg_grad": grad,
                    "uncond_pass": uncond_pass(variant, args.samples, args.train_steps, mbs),
                    "micro_batch_size": mbs,
                    "trainable_params": sum(p.numel() for p in trainable),
                    "latent_shape": list(latent_shape),
                }
                if self.over_budget():
                    self.report["results"].append({**row, "skipped": "time budget"})
                    continue
                try:
                    row.update(self.time_config(trainer, flow_model, sampler, latent_shape, uncond, mbs))
                except torch.OutOfMemoryError:
                    trainer.zero_grad()
                    self.report["results"].append({**row, "skipped": "out of memory"})
                    roofline.reset_peak_memory(device)
                    continue
                except Exception as exc:  # one broken configuration must not lose the others
                    traceback.print_exc()
                    trainer.zero_grad()
                    self.report["results"].append({**row, "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
                    continue
                flops = self.flops.get(self.flops_key(mode, variant, grad, mbs))
                if flops is not None:
                    row["flops_per_batch"] = flops
                    row["tflops_per_s"] = flops / (row["accumulate_ms"] / 1e3) / 1e12
                    if "ceiling" in self.report:
                        row["fraction_of_ceiling"] = row["tflops_per_s"] / self.report["ceiling"]["tflops"]
                self.report["results"].append(row)
                print(format_row(row), flush=True)
                self.write()
        self.record_costs(mode, path, trainer, flow_model, batches, device)

    def flops_key(self, mode: str, sampler: Sampler, grad: str | None, mbs: int) -> tuple:
        layout = uncond_pass(sampler, self.args.samples, self.args.train_steps, mbs)
        return (mode, sampler.true_cfg, grad, layout)

    def time_config(self, trainer, flow_model, sampler, latent_shape, uncond, mbs: int) -> dict:
        args, device = self.args, self.device
        trainer.cfg.trainer.micro_batch_size = mbs
        batch = synthetic_batch(
            flow_model, sampler, latent_shape, args, trainer.uncond, device, real_tokens=self.real_tokens[0]
        )
        roofline.reset_peak_memory(device)
        acc_ms, step_ms, on_policy, first_s = [], [], None, None
        # pass 0 is never timed: it is the on-policy pass, and with --compile it includes compilation
        for i in range(1 + args.warmup + args.iters):
            roofline.synchronize(device)
            t0 = time.perf_counter()
            stats = trainer.accumulate(batch, 1.0 / batch.num_units)
            roofline.synchronize(device)
            t1 = time.perf_counter()
            trainer.step()
            roofline.synchronize(device)
            t2 = time.perf_counter()
            if on_policy is None:  # the first pass, before any update: on-policy
                on_policy, first_s = stats, t1 - t0
            if i > args.warmup:
                acc_ms.append(1e3 * (t1 - t0))
                step_ms.append(1e3 * (t2 - t1))
        acc = statistics.median(acc_ms)
        units = batch.num_units
        spread = max(abs(on_policy["ratio_min"] - 1), abs(on_policy["ratio_max"] - 1))
        extra = {}
        if args.profile:
            extra["profile"] = profile_call(lambda: trainer.accumulate(batch, 1.0 / batch.num_units), device)
            trainer.zero_grad()
        return {
            **extra,
            "units": units,
            "accumulate_ms": acc,
            "micro_batch_ms": acc * mbs / units,
            "ms_per_unit": acc / units,
            "units_per_s": units / (acc / 1e3),
            "optimizer_step_ms": statistics.median(step_ms),
            "first_accumulate_s": first_s,
            "peak_mem_gib": roofline.peak_memory_gib(device),
            "on_policy_ratio_min": on_policy["ratio_min"],
            "on_policy_ratio_max": on_policy["ratio_max"],
            "max_abs_ratio_minus_1": spread,
        }

    def record_costs(self, mode, path, trainer, flow_model, batches, device) -> None:
        """Byte counts and scalar costs of this mode/path, as digenrl.costs.CostModel names them."""
        try:
            _, batch = next(iter(batches.values()))
            trainable = trainer.backend.trainable_parameters()
            self.report["costs"][f"{mode}/{path}"] = {
                "weight_sync_bytes": roofline.tensor_bytes(trainable),
                "grad_bytes": roofline.tensor_bytes(trainable),
                "param_bytes": roofline.tensor_bytes(list(flow_model.parameters())),
                "optimizer_bytes": roofline.tensor_bytes(
                    [t for st in trainer.optimizer.state.values() for t in st.values() if torch.is_tensor(t)]
                ),
                **shipped_bytes(batch),
                "grad_park_s": time_grad_park(trainer, batch, device, warmup=1, iters=3),
                "train_steps_per_sample": batch.num_train_steps,
            }
        except Exception as exc:
            traceback.print_exc()
            self.report["costs"][f"{mode}/{path}"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        self.write()

    def run_regression(self) -> None:
        args = self.args
        results = []
        for setting in args.regression_settings:
            print(f"# backward regression: {args.regression_model} slice, setting {setting}", flush=True)
            result = backward_check.run_in_subprocess(
                args.regression_model,
                setting=setting,
                double=args.regression_blocks[0],
                single=args.regression_blocks[1],
                heights=tuple(args.regression_heights),
                device=args.device,
                dtype=args.dtype,
                timeout_s=args.regression_timeout_s,
            )
            result["verdict"] = regression_verdict(result)
            results.append(result)
            print(
                f"#   {'PASS' if result.get('passed') else 'FAIL'} {_regression_detail(result)}", flush=True
            )
            print(f"#   {result['verdict']}", flush=True)
            self.report["regression"] = results
            self.write()


def regression_verdict(result: dict) -> str:
    """What a regression result says about the known-bad table (digenrl/models/attention_safety.py)."""
    setting, passed = result.get("setting"), bool(result.get("passed"))
    if setting == "safe":
        return "project trainer path OK" if passed else "PROJECT TRAINER PATH FAILS: add a table row"
    torch_text, cudnn = result.get("torch"), result.get("cudnn")
    if torch_text is None:
        return "no verdict (the check did not start)"
    device_type = str(result.get("device", "cpu")).split(":")[0]
    if setting == "cudnn" and device_type != "cuda":
        return f"not applicable: cuDNN attention needs CUDA, this is {device_type}"
    if setting == "no-cudnn":  # the flash / memory-efficient reference the cuDNN gradients are compared with
        return "reference (cuDNN SDPA off) OK" if passed else "REFERENCE FAILS: cuDNN SDPA off fails too"
    backend = "_native_cudnn" if setting == "cudnn" else "native"
    shape = result.get("attention_shape")
    listed = any(
        row.matches(
            backend,
            needs_backward=True,
            device_type=device_type,
            torch_version=parse_torch_version(torch_text),
            cudnn_version=parse_cudnn_version(cudnn),
            shape=AttentionShape(**shape) if shape else None,
        )
        for row in KNOWN_BAD_ATTENTION
    )
    if listed:
        return (
            "known-bad combination reproduces" if not passed else "listed as bad but PASSED: row may be stale"
        )
    return "not listed, passes" if passed else "FAILS BUT NOT LISTED: add a table row"


def _regression_detail(result: dict) -> str:
    errors = [r.get("error") for r in result.get("runs", []) if r.get("error")]
    if result.get("error"):
        errors.insert(0, result["error"])
    if errors:
        return errors[0].splitlines()[0][:200]
    runs = result.get("runs", [])
    return ", ".join(f"{r['height']}px finite={r.get('finite')} {r.get('seconds', 0):.2f} s" for r in runs)


def cfg_label(r: dict) -> str:
    """``off``, ``on`` (a row from before cfg_grad existed), ``on, both`` or ``on, cond (separate)``."""
    if not r.get("cfg"):
        return "off"
    grad, layout = r.get("cfg_grad"), r.get("uncond_pass")
    if grad is None:
        return "on"
    return f"on, {grad}" + (f" ({layout})" if grad == "cond" and layout else "")


def format_row(r: dict) -> str:
    return (
        f"{r['path']:>9} {r['mode']:<4} cfg={cfg_label(r):<19} mbs={r['micro_batch_size']:<3} "
        f"{r['ms_per_unit']:9.2f} ms/unit  step {r['optimizer_step_ms']:.2f} ms  "
        f"{fmt(r.get('tflops_per_s'), '.4g'):>7} TFLOP/s  "
        f"{fmt(r.get('fraction_of_ceiling'), '.1%'):>6} of ceil  "
        f"peak {fmt(r.get('peak_mem_gib'), '.2f')} GiB  max|r-1| {r['max_abs_ratio_minus_1']:.2e}"
    )


def cfg_grad_table(results: list[dict]) -> list[str]:
    """cfg_grad=cond next to cfg_grad=both for every (mode, path, micro-batch) that timed both; empty
    when the run timed one of them only."""
    pairs: dict[tuple, dict[str, dict]] = {}
    for r in results:
        if r.get("cfg") and r.get("cfg_grad") and "micro_batch_size" in r:
            pairs.setdefault((r["mode"], r["path"], r["micro_batch_size"]), {})[r["cfg_grad"]] = r
    pairs = {k: v for k, v in pairs.items() if len(v) == 2}
    if not pairs:
        return []
    lines = [
        "",
        "CFG training gradient: cond (unconditional prediction detached) vs both (full gradient)",
        "",
        "| mode | path | mbs | cond uncond pass | both ms/unit | cond ms/unit | cond/both time | both GiB "
        "| cond GiB | cond/both memory | both max abs(r-1) | cond max abs(r-1) |",
        "|:---|:---|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def cell(row: dict, key: str, spec: str) -> str:
        return bench_cli.cell(row, key, spec, primary="ms_per_unit")

    def ratio(row: dict, base: dict, key: str) -> str:
        if row.get(key) is not None and base.get(key):
            return f"{row[key] / base[key]:.2f}x"
        return "-"

    for (mode, path, mbs), rows in pairs.items():
        c, b = rows["cond"], rows["both"]
        lines.append(
            f"| {mode} | {path} | {mbs} | {c.get('uncond_pass', '-')} | {cell(b, 'ms_per_unit', '.2f')} "
            f"| {cell(c, 'ms_per_unit', '.2f')} | {ratio(c, b, 'ms_per_unit')} "
            f"| {cell(b, 'peak_mem_gib', '.2f')} | {cell(c, 'peak_mem_gib', '.2f')} "
            f"| {ratio(c, b, 'peak_mem_gib')} | {cell(b, 'max_abs_ratio_minus_1', '.2e')} "
            f"| {cell(c, 'max_abs_ratio_minus_1', '.2e')} |"
        )
    return lines


def format_markdown(report: dict) -> str:
    title = f"trainer: {report['model']}" if report["results"] else "attention-backward regression"
    lines = [f"### {title}, {report['device_name']}, {report['dtype']}", ""]
    if report.get("real_text_tokens"):
        cond, uncond = report["real_text_tokens"]
        lines.append(
            f"text: {cond} real tokens a prompt, {uncond} for the empty one, "
            f"text padding {report.get('text_padding', 'mask')}"
        )
    ceiling = report.get("ceiling")
    if ceiling:
        lines.append(f"matmul ceiling ({ceiling['n']}³ {ceiling['dtype']}): {ceiling['tflops']:.1f} TFLOP/s")
    eager = report["paths"].get("eager")
    if eager:
        lines.append(f"eager path: attention {eager['attention']}, compiled=False")
    opt = report["paths"].get("optimized")
    if opt:
        att = opt["attention"]
        lines.append(
            f"optimised path: attention {att['backend']}, cuDNN SDPA disabled={att['disable_cudnn_sdp']}, "
            f"compiled={opt['compiled']}, autocast={opt.get('autocast', False)}"
            + (f"; {'; '.join(att['reasons'])}" if att["reasons"] else "")
        )
    if report["results"]:
        lines += [
            "",
            "| mode | cfg | mbs | eager ms/unit | opt ms/unit | speedup | eager TFLOP/s | opt TFLOP/s "
            "| opt % ceil | opt step ms | eager GiB | opt GiB | eager max abs(r-1) | opt max abs(r-1) |",
            "|:---|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        by_key: dict[tuple, dict[str, dict]] = {}
        for r in report["results"]:
            if "micro_batch_size" in r:
                key = (r["mode"], cfg_label(r), r["micro_batch_size"])
                by_key.setdefault(key, {})[r["path"]] = r
        for (mode, cfg, mbs), rows in by_key.items():
            e, o = rows.get("eager", {}), rows.get("optimized", {})

            def cell(row: dict, key: str, spec: str) -> str:
                return bench_cli.cell(row, key, spec, primary="ms_per_unit")

            speed = bench_cli.speedup(e, o, "ms_per_unit")
            lines.append(
                f"| {mode} | {cfg} | {mbs} | {cell(e, 'ms_per_unit', '.2f')} "
                f"| {cell(o, 'ms_per_unit', '.2f')} | {speed} | {cell(e, 'tflops_per_s', '.4g')} "
                f"| {cell(o, 'tflops_per_s', '.4g')} | {cell(o, 'fraction_of_ceiling', '.1%')} "
                f"| {cell(o, 'optimizer_step_ms', '.2f')} | {cell(e, 'peak_mem_gib', '.2f')} "
                f"| {cell(o, 'peak_mem_gib', '.2f')} | {cell(e, 'max_abs_ratio_minus_1', '.2e')} "
                f"| {cell(o, 'max_abs_ratio_minus_1', '.2e')} |"
            )
        lines += cfg_grad_table(report["results"])
    for r in report["results"]:
        if r.get("profile"):
            title = (
                f"profile {r['path']} {r['mode']} cfg={cfg_label(r)} "
                f"mbs={r['micro_batch_size']} ({r['units']} units)"
            )
            lines += ["", format_profile(r["profile"], title)]
    failed = [r for r in report["results"] if "micro_batch_size" not in r]
    lines += [f"\n{r['mode']}/{r['path']} failed: {r.get('error', '?')}" for r in failed]
    regression = report.get("regression")
    if regression:
        lines += [
            "",
            "| backward regression | setting | result | verdict | detail |",
            "|:---|:---|:---:|:---|:---|",
        ]
        for r in regression:
            blocks = r.get("blocks", {})
            what = f"{r.get('model')} slice {blocks.get('double', '?')}+{blocks.get('single', '?')} blocks"
            detail = _regression_detail(r).replace("|", "/")
            lines.append(
                f"| {what} | {r.get('setting')} | {'PASS' if r.get('passed') else 'FAIL'} "
                f"| {r.get('verdict', '-')} | {detail} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    bench = Bench(args)
    print(
        f"# trainer benchmark on {bench.report['device_name']}, {bench.dtype_name}, torch {torch.__version__}"
    )
    if not args.regression_only:
        bench.measure_ceiling()
        for mode in args.modes:
            for path in args.paths:
                try:
                    bench.run_mode_path(mode, path)  # its model is freed on return
                    roofline.reset_peak_memory(bench.device)
                except Exception as exc:  # e.g. the model does not fit: keep the other modes/paths
                    traceback.print_exc()
                    bench.report["results"].append(
                        {"path": path, "mode": mode, "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
                    )
                    bench.write()
    if args.regression or args.regression_only:
        bench.run_regression()
    bench.report["wall_s"] = time.perf_counter() - bench.t_start
    bench.write()
    print(format_markdown(bench.report))
    if args.out:
        print(f"# wrote {output_paths(args.out, 'trainer', args.model)[0]}")
    return 0
