"""Benchmark one denoising step of a zoo generator, diffusers-eager path and the project's optimised path
side by side, with random weights.

    python experiments/measure.py generator                                    # tiny-sd3, CPU or GPU
    python experiments/measure.py generator --model sd3.5-medium --batch-sizes 1,4,16 --compile --out out/perf
    python experiments/measure.py generator --model wan2.1-14b --frames 17 --batch-sizes 1 --compile --out o

A step is what the rollout engine issues per denoising step: ``Sampler.velocity`` (the transformer forward of
B samples, or of 2B = cond ++ uncond with true classifier-free guidance) and ``Sampler.transition`` (flow-SDE
step and its log-prob, float32). Guidance-distilled models (FLUX-dev, HunyuanVideo) embed guidance, so their
"cfg on" row is skipped.

Paths (``--paths``):

* ``eager``: the model as diffusers builds it (attention ``native`` = torch SDPA with torch's kernel choice);
* ``optimized``: :func:`digenrl.models.optimize.optimize_flow_model` applied in place (safe attention
  backend ``--attention-backend``; ``torch.compile`` of the repeated blocks with ``--compile``; CUDA graphs
  with ``--cuda-graphs``; FP8 base linears with ``--fp8``, :mod:`digenrl.models.fp8`). Its first call per
  shape is timed separately (``first_call_s``: compilation).

Per row: median ms per step over ``--iters`` after ``--warmup`` (CUDA events), FLOPs of the step counted by
``FlopCounterMode`` on the eager model, achieved TFLOP/s, the fraction of an n³ matmul ceiling measured in
the same run (``--ceiling-size``, 8192 on a GPU), and peak CUDA memory. With both paths, a log-prob agreement
check (same seeds through :mod:`digenrl.rollout.noise`) compares them: the optimised path recomputes the
eager path's recorded transitions (the trainer's on-policy ratio, max |r − 1|) and samples its own from the
same noise (relative error). Text conditions are random tensors of the spec's shapes (no text encoder);
``--text-tokens`` pads them as a masked encoder (Qwen-Image) pads real prompts, and ``--text-padding`` sets
``model.text_padding`` on the optimised path (the eager path keeps the padded, masked text).

``--out`` is a directory (``generator-<model>.json`` and ``.md`` are written there) or a ``.json`` path (the
``.md`` goes beside it). The JSON is rewritten after every row, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import traceback

import torch

from digenrl.config import Config, apply_overrides
from digenrl.data.dtypes import TORCH_DTYPES
from digenrl.models import FlowModel, TextCondition, build_flow_model, get_model_spec
from digenrl.models.fp8 import apply_fp8
from digenrl.models.optimize import CompileSettings, optimize_flow_model
from digenrl.perf import bench_cli, logprob_agreement, roofline
from digenrl.perf.bench_cli import DYNAMIC, PATHS, fmt, int_list, name_list, output_paths
from digenrl.rollout.noise import sample_seed
from digenrl.rollout.sampler import Sampler


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="experiments/measure.py generator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench_cli.add_model_flag(p)
    p.add_argument("--batch-sizes", default="1,4", help="comma-separated samples per step, e.g. 1,4,16")
    p.add_argument("--cfg", default="both", choices=["on", "off", "both"], help="classifier-free guidance")
    bench_cli.add_shape_flags(p)
    bench_cli.add_device_flags(p)
    bench_cli.add_optimized_path_flags(
        p, paths="eager,optimized", paths_help="comma-separated subset of eager,optimized"
    )
    p.add_argument("--whole-model", action="store_true", help="compile the whole transformer, not its blocks")
    p.add_argument(
        "--needs-backward",
        action="store_true",
        help="optimised path: pick attention as a process that also trains does (every rank of a run: "
        "digenrl/systems/components.py), so the step runs the kernels a run's rollout runs (e.g. no cuDNN "
        "SDPA where the safety table disables it for training); default: the forward-only choice",
    )
    p.add_argument(
        "--fp8",
        action="store_true",
        help="the optimized path runs the blocks' linears in FP8 (model.fp8, digenrl/models/fp8.py); with "
        "both paths the log-prob check then compares FP8 against the 16-bit eager model",
    )
    p.add_argument(
        "--cuda-graphs", action="store_true", help="= --compile --compile-mode reduce-overhead (fixed shapes)"
    )
    bench_cli.add_text_flags(
        p, padding_default="mask", padding_help="optimised path: model.text_padding (the eager path: mask)"
    )
    bench_cli.add_timing_flags(
        p,
        warmup=2,
        iters=5,
        warmup_help="untimed steps per configuration",
        iters_help="timed steps per configuration (median reported)",
    )
    bench_cli.add_report_flags(p)
    p.add_argument("--agreement-steps", type=int, default=2, help="steps of the log-prob check (0: skip)")
    p.add_argument("--agreement-samples", type=int, default=2, help="samples of the log-prob check")
    args = p.parse_args(argv)
    args.batch_sizes = int_list(args.batch_sizes, "--batch-sizes", p)
    bench_cli.check_timing(args, p)
    args.paths = name_list(args.paths, "--paths", PATHS, p)
    bench_cli.check_text(args, p)
    if args.cuda_graphs:
        args.compile, args.compile_mode = True, "reduce-overhead"
    if args.agreement_steps < 0 or args.agreement_samples < 1:
        p.error("--agreement-steps must be >= 0 and --agreement-samples >= 1")
    return args


def make_sampler(model: str, spec, tokens: int, cfg_on: bool) -> Sampler:
    """The model's sampler with true CFG on (its default scale, at least 1.5) or off (scale 1);
    guidance-distilled models keep their embedded scale (same rule as digenrl/perf/measure_costs.py)."""
    if spec.guidance_embedded:
        scale = spec.default_guidance_scale
    else:
        scale = max(spec.default_guidance_scale, 1.5) if cfg_on else 1.0
    cfg = apply_overrides(Config(), {"model.name": model, "sampler.guidance_scale": scale})
    return Sampler.from_config(cfg, spec, tokens)


class StepCase:
    """Inputs of one (batch, cfg) configuration, drawn once and reused by both paths."""

    def __init__(
        self,
        flow_model: FlowModel,
        sampler: Sampler,
        batch: int,
        latent_shape,
        uncond,
        real_tokens: int | None = None,
    ) -> None:
        device = flow_model.device
        self.sampler = sampler
        self.x = torch.randn(batch, *latent_shape, device=device)
        self.sigma = sampler.sigmas[0].to(device).expand(batch)
        self.sigma_next = sampler.sigmas[1].to(device).expand(batch)
        self.cond = TextCondition.random(
            flow_model.spec.text_encoder,
            batch,
            device=device,
            dtype=flow_model.dtype,
            real_tokens=real_tokens,
        )
        self.uncond = uncond if sampler.true_cfg else None
        self.noise = torch.randn_like(self.x)

    @torch.no_grad()
    def step(self, flow_model: FlowModel) -> torch.Tensor:
        v = self.sampler.velocity(flow_model, self.x, self.sigma, self.cond, self.uncond)
        return self.sampler.transition(v, self.x, self.sigma, self.sigma_next, noise=self.noise).prev_sample


def _write(report: dict, args: argparse.Namespace) -> None:
    if not args.out:
        return
    json_path, md_path = output_paths(args.out, "generator", report["model"])
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2))
    md_path.write_text(format_markdown(report) + "\n")


def bench_case(
    flow_model: FlowModel, case: StepCase, device: torch.device, args: argparse.Namespace
) -> dict[str, float | None]:
    roofline.reset_peak_memory(device)
    first = roofline.timed_first_call_s(lambda: case.step(flow_model), device)
    times = roofline.time_calls_ms(
        lambda: case.step(flow_model), device, warmup=args.warmup, iters=args.iters
    )
    stats = roofline.summarize_ms(times)
    return {
        "ms_per_step": stats["ms"],
        "ms_min": stats["ms_min"],
        "ms_max": stats["ms_max"],
        "first_call_s": first,
        "peak_mem_gib": roofline.peak_memory_gib(device),
    }


def run(args: argparse.Namespace) -> dict:
    spec = get_model_spec(args.model)
    device = roofline.resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype_name = bench_cli.resolve_dtype(args.dtype, device)
    dtype = TORCH_DTYPES[dtype_name]
    height, width = args.height or spec.default_height, args.width or spec.default_width
    frames = args.frames if args.frames is not None else spec.default_frames
    t_start = time.perf_counter()
    report: dict = {
        "model": spec.name,
        "family": spec.family,
        "device": str(device),
        "device_name": roofline.device_description(device),
        "dtype": dtype_name,
        "environment": roofline.environment(),
        "argv": sys.argv[1:] if args.out else [],
        "paths": {},
        "results": [],
    }
    ceiling_n = (
        args.ceiling_size if args.ceiling_size is not None else (8192 if device.type == "cuda" else 256)
    )
    if ceiling_n > 0:
        report["ceiling"] = roofline.matmul_ceiling(device, dtype, n=ceiling_n)
        print(
            f"# matmul ceiling {ceiling_n}^3 {dtype_name}: {report['ceiling']['tflops']:.1f} TFLOP/s",
            flush=True,
        )
    torch.manual_seed(0)
    t0 = time.perf_counter()
    flow_model = build_flow_model(spec, dtype=dtype, device=device)
    flow_model.eval().requires_grad_(False)
    report["build_s"] = time.perf_counter() - t0
    latent_shape = flow_model.latent_shape(height, width, frames)
    tokens = flow_model.token_count(height, width, frames)
    report.update(
        parameters=sum(p.numel() for p in flow_model.parameters()),
        param_bytes=sum(p.numel() * p.element_size() for p in flow_model.parameters()),
        height=height,
        width=width,
        frames=frames,
        latent_shape=list(latent_shape),
        image_tokens=tokens,
        text_tokens=spec.text_encoder.seq_len,
        warmup=args.warmup,
        iters=args.iters,
        attention_backend=args.attention_backend,
        real_text_tokens=list(args.text_tokens) if args.text_tokens else None,
        text_padding=args.text_padding,
    )
    cond_tokens, uncond_tokens = args.text_tokens or (None, None)
    uncond = TextCondition.random(
        flow_model.spec.text_encoder, 1, device=device, dtype=flow_model.dtype, real_tokens=uncond_tokens
    )
    cfg_modes = {"on": [True], "off": [False], "both": [False, True]}[args.cfg]
    cases: dict[tuple[int, bool], StepCase | str] = {}
    for batch in args.batch_sizes:
        for cfg in cfg_modes:
            if cfg and not flow_model.uses_true_cfg:
                cases[(batch, cfg)] = "guidance-embedded model: no separate CFG pass"
                continue
            cases[(batch, cfg)] = StepCase(
                flow_model,
                make_sampler(spec.name, spec, tokens, cfg),
                batch,
                latent_shape,
                uncond,
                cond_tokens,
            )

    flops: dict[tuple[int, bool], int] = {}
    if not args.no_flops:  # counted on the unoptimised model: the optimised path computes the same function
        for key, case in cases.items():
            if isinstance(case, StepCase):
                with contextlib.suppress(torch.OutOfMemoryError):
                    flops[key] = roofline.count_flops(lambda c=case: c.step(flow_model))
    agreement_ref = None
    if set(PATHS) <= set(args.paths) and args.agreement_steps > 0:
        agreement = _agreement_inputs(flow_model, spec, tokens, latent_shape, uncond, args)
        agreement_ref = (agreement, logprob_agreement.rollout(**agreement, model=flow_model))

    for (batch, cfg), case in cases.items():  # a configuration no path has: one row for all of them
        if isinstance(case, str):
            row = {"path": "all", "batch_size": batch, "cfg": cfg, "model_batch": 2 * batch, "skipped": case}
            report["results"].append(row)
    for path in [p for p in PATHS if p in args.paths]:
        if path == "optimized":
            fp8_layers = apply_fp8(flow_model) if args.fp8 else 0
            settings = CompileSettings(
                mode=args.compile_mode, dynamic=DYNAMIC[args.compile_dynamic], regional=not args.whole_model
            )
            applied = optimize_flow_model(
                flow_model,
                compile=args.compile,
                attention_backend=args.attention_backend,
                needs_backward=args.needs_backward,
                compile_settings=settings,
                text_padding=args.text_padding,
            )
            report["paths"]["optimized"] = {**applied.to_dict(), "fp8_layers": fp8_layers}
        else:
            report["paths"]["eager"] = {"attention": "native (diffusers default)", "compiled": False}
        for (batch, cfg), case in cases.items():
            row: dict = {
                "path": path,
                "batch_size": batch,
                "cfg": cfg,
                "model_batch": 2 * batch if cfg else batch,
            }
            if isinstance(case, str):
                continue
            if args.time_budget_s and time.perf_counter() - t_start > args.time_budget_s:
                report["results"].append({**row, "skipped": "time budget"})
                continue
            try:
                row.update(bench_case(flow_model, case, device, args))
            except torch.OutOfMemoryError:
                report["results"].append({**row, "skipped": "out of memory"})
                roofline.reset_peak_memory(device)
                continue
            except Exception as exc:  # one broken configuration must not lose the others
                traceback.print_exc()
                report["results"].append({**row, "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
                continue
            row["samples_per_s"] = batch / (row["ms_per_step"] / 1000)
            if (batch, cfg) in flops:
                row["flops_per_step"] = flops[(batch, cfg)]
                row["tflops_per_s"] = row["flops_per_step"] / (row["ms_per_step"] / 1000) / 1e12
                if "ceiling" in report:
                    row["fraction_of_ceiling"] = row["tflops_per_s"] / report["ceiling"]["tflops"]
            report["results"].append(row)
            print(format_row(row), flush=True)
            _write(report, args)
    if agreement_ref is not None:
        inputs, reference = agreement_ref
        try:
            free = logprob_agreement.rollout(**inputs, model=flow_model)
            recomputed = logprob_agreement.recompute_log_probs(
                inputs["sampler"], flow_model, reference, inputs["cond"], inputs["uncond"]
            )
            report["agreement"] = logprob_agreement.compare(
                reference, free, recomputed, clip_range=Config().algo.clip_range
            )
            report["agreement"]["cfg"] = inputs["sampler"].true_cfg
        except Exception as exc:
            traceback.print_exc()
            report["agreement"] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
    report["wall_s"] = time.perf_counter() - t_start
    _write(report, args)
    return report


def _agreement_inputs(flow_model, spec, tokens, latent_shape, uncond, args) -> dict:
    """Sampler (CFG as the model normally runs), seeds, condition of the log-prob agreement check."""
    sampler = make_sampler(spec.name, spec, tokens, cfg_on=flow_model.uses_true_cfg)
    n = args.agreement_samples
    return {
        "sampler": sampler,
        "seeds": [sample_seed(0, 0, i, 0) for i in range(n)],
        "latent_shape": tuple(latent_shape),
        "cond": TextCondition.random(
            flow_model.spec.text_encoder,
            n,
            device=flow_model.device,
            dtype=flow_model.dtype,
            real_tokens=args.text_tokens[0] if args.text_tokens else None,
        ),
        "uncond": uncond if sampler.true_cfg else None,
        "steps": args.agreement_steps,
    }


def format_row(r: dict) -> str:
    return (
        f"{r['path']:>9} B={r['batch_size']:<3} cfg={'on' if r['cfg'] else 'off':<3} "
        f"fwd={r['model_batch']:<3} "
        f"{r['ms_per_step']:9.2f} ms/step  {fmt(r.get('tflops_per_s'), '.4g'):>7} TFLOP/s  "
        f"{fmt(r.get('fraction_of_ceiling'), '.1%'):>6} of ceiling  first {r['first_call_s']:.2f} s  "
        f"peak {fmt(r.get('peak_mem_gib'), '.2f')} GiB"
    )


def format_markdown(report: dict) -> str:
    """Eager and optimised rows side by side, one line per (batch, cfg)."""
    ceiling = report.get("ceiling")
    head = (
        f"### generator step: {report['model']} ({report.get('parameters', 0) / 1e9:.2f} B params), "
        f"{report['device_name']}, {report['dtype']}, {report.get('height')}x{report.get('width')}"
        + (f"x{report['frames']}f" if report.get("frames") else "")
        + f", {report.get('image_tokens')} image + {report.get('text_tokens')} text tokens"
        + (
            " (real: {} a prompt, {} the empty one)".format(*report["real_text_tokens"])
            if report.get("real_text_tokens")
            else ""
        )
        + f", text padding {report.get('text_padding', 'mask')}"
    )
    lines = [head, ""]
    if ceiling:
        lines.append(f"matmul ceiling ({ceiling['n']}³ {ceiling['dtype']}): {ceiling['tflops']:.1f} TFLOP/s")
    opt = report["paths"].get("optimized")
    if opt:
        att = opt["attention"]
        lines.append(
            f"optimised path: attention {att['backend']} (asked {att['requested']}), "
            f"compiled={opt['compiled']}"
            + (f" {opt['compile_settings']}" if opt.get("compile_settings") else "")
            + (f", FP8 in {opt['fp8_layers']} linear layers" if opt.get("fp8_layers") else "")
        )
    lines += [
        "",
        "| batch | cfg | fwd B | eager ms | opt ms | speedup | eager TFLOP/s | opt TFLOP/s | opt % ceil "
        "| eager GiB | opt GiB | opt 1st call s |",
        "|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_key: dict[tuple, dict[str, dict]] = {}
    for r in report["results"]:
        by_key.setdefault((r["batch_size"], r["cfg"], r["model_batch"]), {})[r["path"]] = r
    for (batch, cfg, model_batch), rows in sorted(by_key.items(), key=lambda item: item[0][:2]):
        both = rows.get("all", {})
        e, o = rows.get("eager", both), rows.get("optimized", both)

        def cell(row: dict, key: str, spec: str) -> str:
            return bench_cli.cell(row, key, spec, primary="ms_per_step")

        speed = bench_cli.speedup(e, o, "ms_per_step")
        lines.append(
            f"| {batch} | {'on' if cfg else 'off'} | {model_batch} | {cell(e, 'ms_per_step', '.2f')} "
            f"| {cell(o, 'ms_per_step', '.2f')} | {speed} | {cell(e, 'tflops_per_s', '.4g')} "
            f"| {cell(o, 'tflops_per_s', '.4g')} | {cell(o, 'fraction_of_ceiling', '.1%')} "
            f"| {cell(e, 'peak_mem_gib', '.2f')} | {cell(o, 'peak_mem_gib', '.2f')} "
            f"| {cell(o, 'first_call_s', '.1f')} |"
        )
    agreement = report.get("agreement")
    if agreement:
        if "error" in agreement:
            lines += ["", f"log-prob agreement: error {agreement['error']}"]
        else:
            lines += [
                "",
                f"log-prob agreement (optimised vs eager, {agreement['samples']} samples x "
                f"{agreement['steps']} steps, cfg={agreement['cfg']}): max |ratio-1| = "
                f"{agreement['max_abs_ratio_minus_1']:.3g} (clip range {agreement['clip_range']:g}), "
                f"final latent rel L2 = {agreement['final_latent_rel_l2']:.3g}, log-prob rel L2 = "
                f"{agreement['log_prob_rel_l2']:.3g}, pass={agreement['pass']}",
            ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    print(format_markdown(report))
    if args.out:
        print(f"wrote {output_paths(args.out, 'generator', report['model'])[0]}")
    return 0
