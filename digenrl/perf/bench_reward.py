"""Benchmark a reward's scoring call on batches of decoded images: seconds per batch and peak memory, and
the simulator's reward costs (``reward_points``, ``reward_param_bytes``) as a cost-file fragment.

    python experiments/measure.py reward                                   # tiny-vlm-judge, CPU or GPU
    python experiments/measure.py reward --reward vlm-judge --batch-sizes 1,4,8,16 --out runs/perf
    python experiments/measure.py reward --reward vlm-judge --batch-sizes 1,4,8,16 --out runs/perf \
        --apply-to experiments/results/costs/h200-sd3.5-medium.json \
        experiments/results/costs/h200-flux.1-dev.json
    python experiments/measure.py reward --reward imagereward --batch-sizes 16 --out runs/perf   # any reward
    python experiments/measure.py reward --reward hpsv2.1 --dry-run    # build at real size on meta, no timing

What is timed is what a generator (or scorer) rank's ``score`` phase calls after the VAE decode:
``reward(images, prompts)`` on ``[B, 3, H, W]`` images in [0, 1] already on the device, with the reward's own
batch size set to the largest ``--batch-sizes`` entry, so each call is one forward. For the VLM judge that
includes the tensor preprocessing, the tokenisation and the one forward of vision tower + language model
(``digenrl/rewards/vlm_judge.py``); its vision tower alone is timed too (``vision_ms``), and with
``--vision-attention varlen`` (the default on a GPU) its output is compared with transformers' per-window
loop (``vision_varlen_vs_loop_rel_l2``). Every reward with a model runs the same way (clipscore,
hpsv2.1, imagereward, ocr, their tiny-* twins, pickscore and aesthetic with ``--weights-path``); each call
gets per-sample metadata naming a text (what the OCR reward reads for). Rewards build with random weights
unless ``--weights-path`` is given (the registry's rule, ``digenrl/rewards/registry.py``). ``--dry-run``
builds the reward on the ``meta`` device (shapes only, no memory, no timing) and reports its parameters
and ``reward_param_bytes``: a check that a real-size reward builds, on a machine that could not hold it.

Per row: median ms per call over ``--iters`` after ``--warmup`` (CUDA events), the first call, FLOPs counted
by ``FlopCounterMode`` and the fraction of an n³ matmul ceiling measured in the same run (``--ceiling-size``,
8192 on a GPU), and peak memory ``torch.cuda.max_memory_allocated`` (weights included; ``act_gib`` is the
part above the resident weights).

Outputs (``--out``: a directory gets ``reward-<name>.json`` / ``.md``; a ``.json`` path its ``.md`` beside):
the report, rewritten after every row, with ``cost_fragment`` = the ``reward_points`` (seconds per batch) and
``reward_param_bytes`` of :class:`digenrl.costs.CostModel`. ``--apply-to FILE...`` writes each given
cost file again under ``<out>/costs/`` with these reward costs (``CostModel.with_reward``), when its device
and decoded image size match this run's; copy the written files over ``experiments/results/costs/`` to make
the simulator score with this reward.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import shlex
import sys
import time
import traceback
from pathlib import Path

import torch

from digenrl.costs.cost_model import CostModel
from digenrl.data.dtypes import TORCH_DTYPES, dtype_name
from digenrl.perf import bench_cli, roofline
from digenrl.perf.bench_cli import fmt, int_list, output_paths
from digenrl.rewards.registry import available_rewards, build_reward, reward_class


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="experiments/measure.py reward",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--reward", default="tiny-vlm-judge", help=f"registry name ({', '.join(available_rewards())})"
    )
    p.add_argument("--weights-path", default=None, help="local weights directory (default: random weights)")
    p.add_argument("--batch-sizes", default="1,4", help="comma-separated images per call, e.g. 1,4,8,16")
    p.add_argument("--height", type=int, default=512, help="decoded image height (pixels)")
    p.add_argument("--width", type=int, default=512, help="decoded image width (pixels)")
    bench_cli.add_device_flags(
        p,
        dtype_help="reward model dtype; auto: the reward's default "
        "(VLM judge and OCR: bf16 on cuda, else fp32)",
    )
    p.add_argument(
        "--device-name", default=None, help="device in the cost fragment (default: cpu / h200 / …)"
    )
    p.add_argument(
        "--attn-implementation",
        default="sdpa",
        help="VLM judge: transformers attention (sdpa, flash_attention_2)",
    )
    p.add_argument(
        "--vision-attention",
        default="auto",
        choices=["auto", "loop", "varlen"],
        help="VLM judge: vision windows one attention call each (loop) or all in one (varlen; auto: on cuda)",
    )
    bench_cli.add_timing_flags(
        p,
        warmup=2,
        iters=5,
        warmup_help="untimed calls per batch size",
        iters_help="timed calls per batch size (median reported)",
    )
    bench_cli.add_report_flags(p, skipped="batch sizes")
    p.add_argument("--apply-to", nargs="*", default=[], help="cost files to rewrite with these reward costs")
    p.add_argument("--dry-run", action="store_true", help="build on the meta device, report sizes, no timing")
    args = p.parse_args(argv)
    args.batch_sizes = sorted(set(int_list(args.batch_sizes, "--batch-sizes", p)))
    bench_cli.check_timing(args, p)
    if args.height < 1 or args.width < 1:
        p.error("--height and --width must be positive")
    if args.apply_to and not args.out:
        p.error("--apply-to writes under --out/costs: give --out")
    return args


def is_vlm_judge(reward) -> bool:
    from digenrl.rewards.vlm_judge import VLMJudge

    return isinstance(reward, VLMJudge)


def reward_kwargs(name: str, args: argparse.Namespace) -> dict:
    """Constructor settings: one forward per call (reward batch = largest batch); the dtype where the reward
    takes one; VLM attention."""
    from digenrl.rewards.vlm_judge import VLMJudge

    cls = reward_class(name)
    kwargs: dict = {}
    parameters = inspect.signature(cls.__init__).parameters
    if "batch_size" in parameters:
        kwargs["batch_size"] = max(args.batch_sizes)
    if "dtype" in parameters and args.dtype != "auto":
        kwargs["dtype"] = TORCH_DTYPES[args.dtype]
    if issubclass(cls, VLMJudge):
        kwargs["attn_implementation"] = args.attn_implementation
        kwargs["vision_attention"] = args.vision_attention
    return kwargs


def prompts_for(batch: int) -> list[str]:
    """The prompts digenrl/perf/measure_costs.py scores with (lengths as in a real prompt set)."""
    return [f"a photo of object number {i}" for i in range(batch)]


def metadata_for(batch: int) -> list[dict]:
    """Per-sample metadata as a .jsonl prompt set gives it: the text an OCR reward looks for and a GenEval
    colour-attribution clause (what the GenEval reward checks; other rewards ignore both)."""
    geneval = {"tag": "color_attr", "include": [{"class": "dog", "count": 1, "color": "red"}]}
    return [{"text": f"object {i}", **geneval} for i in range(batch)]


def reward_parameters(reward) -> list[torch.nn.Parameter]:
    """Every parameter of the reward's models (``RewardFunction.modules``, helper objects included)."""
    return [p for module in reward.modules() for p in module.parameters()]


def reward_dtype(reward) -> torch.dtype | None:
    """The dtype of the reward's first floating-point parameter (None for a pixel reward)."""
    return next((p.dtype for p in reward_parameters(reward) if p.is_floating_point()), None)


def _write(report: dict, args: argparse.Namespace) -> None:
    if not args.out:
        return
    json_path, md_path = output_paths(args.out, "reward", report["reward"])
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2))
    md_path.write_text(format_markdown(report) + "\n")


def bench_batch(reward, batch: int, device: torch.device, args: argparse.Namespace, weights_gib) -> dict:
    generator = torch.Generator(device="cpu").manual_seed(batch)
    images = torch.rand(batch, 3, args.height, args.width, generator=generator).to(device)
    prompts, metadata = prompts_for(batch), metadata_for(batch)
    row: dict = {"batch_size": batch}
    roofline.reset_peak_memory(device)
    row["first_call_s"] = roofline.timed_first_call_s(lambda: reward(images, prompts, metadata), device)
    times = roofline.time_calls_ms(
        lambda: reward(images, prompts, metadata), device, warmup=args.warmup, iters=args.iters
    )
    stats = roofline.summarize_ms(times)
    row.update(ms_per_call=stats["ms"], ms_min=stats["ms_min"], ms_max=stats["ms_max"])
    scores = reward(images, prompts, metadata)
    row.update(
        score_min=float(scores.min()),
        score_max=float(scores.max()),
        scores_finite=bool(scores.isfinite().all()),
    )
    if batch > 1:  # the batched call must score like one call per image (up to the dtype's rounding)
        singles = torch.cat(
            [reward(images[i : i + 1], prompts[i : i + 1], metadata[i : i + 1]) for i in range(min(batch, 4))]
        )
        row["batch_vs_single_max_abs"] = float((scores[: len(singles)] - singles).abs().max())
    row["peak_mem_gib"] = roofline.peak_memory_gib(device)
    if row["peak_mem_gib"] is not None and weights_gib is not None:
        row["act_gib"] = row["peak_mem_gib"] - weights_gib
    row["ms_per_image"] = row["ms_per_call"] / batch
    row["images_per_s"] = batch / (row["ms_per_call"] / 1e3)
    if is_vlm_judge(reward):
        with torch.no_grad():
            inputs = reward.encode(images, prompts)
            row["lm_tokens"] = int(inputs["input_ids"].shape[1])  # per sample, longest prompt
            row["image_tokens"] = int(inputs["mm_token_type_ids"][0].sum())
            vision = reward.model.model.get_image_features
            vision_ms = roofline.time_calls_ms(
                lambda: vision(inputs["pixel_values"], inputs["image_grid_thw"]),
                device,
                warmup=1,
                iters=max(1, args.iters // 2),
            )
            row["vision_ms"] = roofline.summarize_ms(vision_ms)["ms"]
            if reward.vision_attention == "varlen":  # the packed windows against transformers' own loop
                packed = torch.cat(vision(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output)
                reward.set_vision_attention("loop")
                looped = torch.cat(vision(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output)
                reward.set_vision_attention("varlen")
                error = (packed.float() - looped.float()).norm() / looped.float().norm()
                row["vision_varlen_vs_loop_rel_l2"] = float(error)
    if not args.no_flops:
        with contextlib.suppress(torch.OutOfMemoryError), torch.no_grad():
            row["flops_per_call"] = roofline.count_flops(lambda: reward(images, prompts, metadata))
            row["tflops_per_s"] = row["flops_per_call"] / (row["ms_per_call"] / 1e3) / 1e12
    return row


def run(args: argparse.Namespace, command: str = "") -> dict:
    device = roofline.resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    report: dict = {
        "reward": args.reward,
        "weights_path": args.weights_path,
        "device": str(device),
        "device_label": args.device_name or _device_label(device),
        "device_name": roofline.device_description(device),
        "environment": roofline.environment(),
        "height": args.height,
        "width": args.width,
        "warmup": args.warmup,
        "iters": args.iters,
        "command": command,
        "results": [],
    }
    if args.dry_run:
        return dry_run(args, report)
    roofline.reset_peak_memory(device)
    t0 = time.perf_counter()
    reward = build_reward(
        args.reward, weights_path=args.weights_path, device=device, **reward_kwargs(args.reward, args)
    )
    roofline.synchronize(device)
    report["build_s"] = time.perf_counter() - t0
    params = reward_parameters(reward)
    report["parameters"] = sum(p.numel() for p in params)
    report["reward_param_bytes"] = roofline.tensor_bytes(params)
    dtype = reward_dtype(reward)
    report["dtype"] = dtype_name(dtype) if dtype is not None else None
    ceiling_n = (
        args.ceiling_size if args.ceiling_size is not None else (8192 if device.type == "cuda" else 256)
    )
    if ceiling_n > 0:  # in the reward model's dtype (float32 for a pixel reward)
        report["ceiling"] = roofline.matmul_ceiling(device, dtype or torch.float32, n=ceiling_n)
        print(f"# matmul ceiling {ceiling_n}^3: {report['ceiling']['tflops']:.1f} TFLOP/s", flush=True)
        roofline.reset_peak_memory(device)
    weights_gib = torch.cuda.memory_allocated(device) / 2**30 if device.type == "cuda" else None
    report["weights_gib"] = weights_gib
    if is_vlm_judge(reward):
        report["attn_implementation"] = reward.model.config.text_config._attn_implementation
        report["vision_attention"] = reward.vision_attention
        report["question"] = reward.question
        report["vision_resize_hw"] = list(reward.transform.output_hw(args.height, args.width))
    print(
        f"# {args.reward}: {report['parameters']:,} parameters, "
        f"{report['reward_param_bytes'] / 2**30:.2f} GiB, built in {report['build_s']:.1f} s",
        flush=True,
    )
    for batch in args.batch_sizes:
        if args.time_budget_s and time.perf_counter() - t_start > args.time_budget_s:
            report["results"].append({"batch_size": batch, "skipped": "time budget"})
            continue
        try:
            row = bench_batch(reward, batch, device, args, weights_gib)
        except torch.OutOfMemoryError:
            report["results"].append({"batch_size": batch, "skipped": "out of memory"})
            roofline.reset_peak_memory(device)
            continue
        except Exception as exc:  # one broken batch size must not lose the others
            traceback.print_exc()
            report["results"].append(
                {"batch_size": batch, "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
            )
            continue
        if "tflops_per_s" in row and "ceiling" in report:
            row["fraction_of_ceiling"] = row["tflops_per_s"] / report["ceiling"]["tflops"]
        report["results"].append(row)
        print(format_row(row), flush=True)
        report["cost_fragment"] = cost_fragment(report)
        _write(report, args)
    report["cost_fragment"] = cost_fragment(report)
    report["wall_s"] = time.perf_counter() - t_start
    if args.apply_to:
        report["applied"] = apply_to_cost_files(report, args.apply_to, Path(args.out) / "costs")
    _write(report, args)
    return report


def dry_run(args: argparse.Namespace, report: dict) -> dict:
    """Build the reward on the ``meta`` device (no memory, no weights) and report its size: whether a
    real-size reward builds and what ``reward_param_bytes`` it would have, without timing anything."""
    reward = build_reward(
        args.reward, weights_path=args.weights_path, device="meta", **reward_kwargs(args.reward, args)
    )
    params = reward_parameters(reward)
    dtype = reward_dtype(reward)
    report.update(
        dry_run=True,
        parameters=sum(p.numel() for p in params),
        reward_param_bytes=roofline.tensor_bytes(params),
        dtype=dtype_name(dtype) if dtype is not None else None,
    )
    print(
        f"# {args.reward} (dry run, meta device): {report['parameters']:,} parameters, "
        f"{report['reward_param_bytes'] / 2**30:.2f} GiB in {report['dtype']}",
        flush=True,
    )
    _write(report, args)
    return report


def _device_label(device: torch.device) -> str:
    from digenrl.perf.measure_costs import device_label

    return device_label(device)


def cost_fragment(report: dict) -> dict:
    """The CostModel fields this run measured: seconds per scoring call of B images, resident bytes."""
    return {
        "reward": report["reward"],
        "device": report["device_label"],
        "height": report["height"],
        "width": report["width"],
        "reward_points": {
            r["batch_size"]: r["ms_per_call"] / 1e3 for r in report["results"] if "ms_per_call" in r
        },
        "reward_param_bytes": report["reward_param_bytes"],
    }


def apply_to_cost_files(report: dict, paths: list[str], out_dir: Path) -> list[dict]:
    """Each cost file again under ``out_dir`` (same name) with this run's reward costs, or why not."""
    fragment = report["cost_fragment"]
    provenance = {
        "source": "measured",
        "command": report["command"],
        "device_name": report["device_name"],
        "dtype": report.get("dtype"),
        "attn_implementation": report.get("attn_implementation"),
        "vision_attention": report.get("vision_attention"),
        "height": fragment["height"],
        "width": fragment["width"],
        "weights_path": report["weights_path"],
    }
    done = []
    for path in paths:
        entry: dict = {"file": str(path)}
        try:
            costs = CostModel.load(path)
        except ValueError as error:
            done.append({**entry, "skipped": str(error)})
            continue
        size = (costs.meta.get("height"), costs.meta.get("width"))
        reason = None
        if not fragment["reward_points"]:
            reason = "no batch size was measured"
        elif costs.device != fragment["device"]:
            reason = f"cost file is for device {costs.device!r}, this run measured {fragment['device']!r}"
        elif costs.meta.get("frames"):
            reason = f"video cost file ({costs.meta['frames']} frames): one call scores B x frames images"
        elif size != (fragment["height"], fragment["width"]):
            scored = f"{fragment['height']}x{fragment['width']}"
            reason = f"cost file decodes {size[0]}x{size[1]} images, this run scored {scored}"
        if reason:
            done.append({**entry, "skipped": reason})
            print(f"# --apply-to {path}: skipped, {reason}", flush=True)
            continue
        updated = costs.with_reward(
            fragment["reward"], fragment["reward_points"], fragment["reward_param_bytes"], provenance
        )
        written = updated.save(out_dir / Path(path).name)
        done.append({**entry, "written": str(written)})
        print(f"# --apply-to {path}: wrote {written}", flush=True)
    return done


def format_row(r: dict) -> str:
    return (
        f"B={r['batch_size']:<3} {r['ms_per_call']:9.2f} ms/call  {r['ms_per_image']:8.2f} ms/image  "
        f"{fmt(r.get('tflops_per_s'), '.4g'):>7} TFLOP/s  first {r['first_call_s']:.2f} s  "
        f"peak {fmt(r.get('peak_mem_gib'), '.2f')} GiB  vision {fmt(r.get('vision_ms'), '.2f')} ms  "
        f"scores [{r['score_min']:.4f}, {r['score_max']:.4f}] batch-vs-single "
        f"{fmt(r.get('batch_vs_single_max_abs'), '.2g')}"
    )


def format_markdown(report: dict) -> str:
    head = (
        f"### reward: {report['reward']} ({report.get('parameters', 0):,} params, "
        f"{report.get('reward_param_bytes', 0) / 2**30:.2f} GiB), {report['device_name']}"
        + (f", {report['dtype']}" if report.get("dtype") else "")
        + (
            f", attention {report['attn_implementation']}, vision windows {report['vision_attention']}"
            if report.get("attn_implementation")
            else ""
        )
        + f", {report['height']}x{report['width']} images"
        + (
            f" (resized to {report['vision_resize_hw'][0]}x{report['vision_resize_hw'][1]})"
            if "vision_resize_hw" in report
            else ""
        )
    )
    lines = [head, ""]
    if report.get("ceiling"):
        c = report["ceiling"]
        lines.append(f"matmul ceiling ({c['n']}³ {c['dtype']}): {c['tflops']:.1f} TFLOP/s")
    if report.get("question"):
        lines.append(f"question: `{report['question']}`")
    lines += [
        "",
        "| batch | ms/call | ms/image | images/s | vision ms | LM tokens | TFLOP/s | % ceil | peak GiB "
        "| act GiB | 1st call s | scores | batch vs single |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in report["results"]:
        if "ms_per_call" not in r:
            lines.append(f"| {r['batch_size']} | {r.get('skipped', r.get('error', '-'))[:60]} |" + " |" * 11)
            continue
        lines.append(
            f"| {r['batch_size']} | {r['ms_per_call']:.2f} | {r['ms_per_image']:.2f} "
            f"| {r['images_per_s']:.1f} | {fmt(r.get('vision_ms'), '.2f')} | {r.get('lm_tokens', '-')} "
            f"| {fmt(r.get('tflops_per_s'), '.4g')} "
            f"| {fmt(r.get('fraction_of_ceiling'), '.1%')} | {fmt(r.get('peak_mem_gib'), '.2f')} "
            f"| {fmt(r.get('act_gib'), '.2f')} | {r['first_call_s']:.1f} "
            f"| [{r['score_min']:.3f}, {r['score_max']:.3f}]{'' if r['scores_finite'] else ' NON-FINITE'} "
            f"| {fmt(r.get('batch_vs_single_max_abs'), '.2g')} |"
        )
    agreement = [
        r["vision_varlen_vs_loop_rel_l2"] for r in report["results"] if "vision_varlen_vs_loop_rel_l2" in r
    ]
    if agreement:
        lines += [
            "",
            "vision tower, varlen vs transformers' per-window loop: relative L2 difference up to "
            f"{max(agreement):.2g}",
        ]
    fragment = report.get("cost_fragment")
    if fragment and fragment["reward_points"]:
        lines += [
            "",
            "Cost-file fragment (`digenrl.costs.CostModel` fields; seconds per scoring call of B images):",
            "",
            "```json",
            json.dumps(
                {
                    "reward_points": fragment["reward_points"],
                    "reward_param_bytes": fragment["reward_param_bytes"],
                },
                indent=2,
            ),
            "```",
            "",
            f"It applies to cost files of device `{fragment['device']}` that decode {fragment['height']}x"
            f"{fragment['width']} images: re-run with `--apply-to experiments/results/costs/<file>.json ...` "
            "(writes them under `<out>/costs/`), or put the two fields into the file and set `meta.reward` "
            f"to `{fragment['reward']}`.",
        ]
    for entry in report.get("applied", []):
        lines.append(
            f"- `{entry['file']}`: "
            + (f"wrote `{entry['written']}`" if "written" in entry else f"skipped ({entry['skipped']})")
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python experiments/measure.py reward " + shlex.join(sys.argv[2:] if argv is None else argv)
    report = run(args, command=command.strip())
    if report.get("dry_run"):
        return 0
    print(format_markdown(report))
    if args.out:
        print(f"wrote {output_paths(args.out, 'reward', report['reward'])[0]}")
    return 0
