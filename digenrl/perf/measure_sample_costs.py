"""Measure per-sample cost distributions for the simulator's variance (docs/design.md §5, "Per-sample
variance"; the file format is :mod:`digenrl.costs.sample_costs`).

    python experiments/measure.py reward-latency                       # tiny VLM judge, CPU: a smoke run
    python experiments/measure.py reward-latency --reward vlm-judge --lengths 1,16,64,128,256 \
        --out runs/variance                                             # on a GPU: Qwen2.5-VL-7B size
    python experiments/measure.py reward-latency --url http://HOST:PORT --requests 200 --out runs/variance
    python experiments/measure.py sample-costs                         # tiny-wan, CPU: a smoke run
    python experiments/measure.py sample-costs --model wan2.1-14b --frames 33,49,65,81 --out runs/variance
    python experiments/measure.py sample-costs --frames 33,49,65,81 \
        --carry experiments/results/costs/h200-wan2.1-14b.json --out runs/variance   # no GPU: assumed

What each times, with random weights (the systems cost does not depend on weight values):

* ``reward-latency`` (a judge): the VLM judge (``digenrl/rewards/vlm_judge.py``) at its real size answering
  with a generated rationale of exactly L tokens (``generate`` with ``min_new_tokens = max_new_tokens = L``;
  random weights never stop early), for each L of ``--lengths``, on ``--batch`` images: prefill + L decode
  steps, the median of ``--iters`` after ``--warmup``. The distribution written is ``discrete`` over those
  latencies — the output lengths are taken as equally likely, an assumption the file states (give the
  lengths a real judge produced, repeated as often as they occur, to make it the measured mix).
* ``reward-latency --url``: ``--requests`` requests, one after another, of ``--batch`` images each to a
  reward server speaking ``reward.name=remote``'s wire format (``digenrl/rewards/remote.py``; e.g.
  ``python -m digenrl.rewards.serve``), each timed end to end: an ``empirical`` distribution of request
  latency (an idle server's; a loaded one queues more).
* ``sample-costs``: one denoising step (``Sampler.velocity`` + ``transition``, as ``measure.py generator``)
  of ``--batch`` samples at each frame count of ``--frames``: a ``discrete`` distribution, drawn per prompt
  (a prompt's samples share its frame count), whose batched forward costs the mean of its members (a
  sampler that runs each frame count as its own forward). Prompt length does not vary the cost of the
  models here (their text conditions are padded to the encoder's fixed length, ``spec.text_encoder``),
  so nothing is measured for it. ``--carry COSTFILE`` times nothing: the step cost per frame count is the
  measured file's carried by counted FLOPs (:func:`digenrl.costs.extrapolation.reshape`), and the file
  says ``assumed (...)`` with that source.

Writes ``<out>/variance-<name>.json`` (a :class:`~digenrl.costs.sample_costs.SampleVariance`, source
``measured: <command>``) and ``<out>/variance-<name>-report.json`` (every timing, device, environment).
Default ``--out``: ``runs/variance``. A GPU result goes under ``experiments/results/costs/variance/`` to be
used by the tables (``simulate.py throughput --variance FILE``); a CPU smoke run belongs nowhere there.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from digenrl.costs.sample_costs import SampleCostDistribution, SampleVariance
from digenrl.perf import bench_cli, roofline
from digenrl.perf.bench_cli import int_list

KINDS = ("reward", "generator")


def parse_args(argv: list[str] | None, kind: str) -> argparse.Namespace:
    command = "reward-latency" if kind == "reward" else "sample-costs"
    p = argparse.ArgumentParser(
        prog=f"experiments/measure.py {command}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if kind == "reward":
        p.add_argument("--reward", default="tiny-vlm-judge", help="a VLM judge of the registry")
        p.add_argument(
            "--lengths", default="1,8,32", help="generated output tokens per answer, e.g. 1,16,64,256"
        )
        p.add_argument("--url", default=None, help="time a reward server at http://HOST:PORT instead")
        p.add_argument("--requests", type=int, default=50, help="--url: requests to time")
        p.add_argument("--height", type=int, default=512, help="image height (pixels)")
        p.add_argument("--width", type=int, default=512, help="image width (pixels)")
    else:
        bench_cli.add_model_flag(p, default="tiny-wan")
        p.add_argument(
            "--frames", default=None, help="frame counts, e.g. 33,49,65,81 (default: tiny-wan's 5,9,13)"
        )
        p.add_argument("--height", type=int, default=None, help="pixels (default: the model's)")
        p.add_argument("--width", type=int, default=None, help="pixels (default: the model's)")
        p.add_argument(
            "--carry",
            type=Path,
            default=None,
            help="a measured video cost file: carry its step cost to each frame count by counted FLOPs "
            "(no timing; the distribution is labelled assumed)",
        )
    p.add_argument("--batch", type=int, default=1, help="samples per timed call")
    bench_cli.add_device_flags(p)
    bench_cli.add_timing_flags(
        p,
        warmup=1,
        iters=3,
        warmup_help="untimed calls per point",
        iters_help="timed calls per point (median)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed the simulator's draws use (written to the file)")
    p.add_argument("--out", type=Path, default=Path("runs/variance"), help="output directory")
    args = p.parse_args(argv)
    bench_cli.check_timing(args, p)
    if args.batch < 1:
        p.error("--batch must be >= 1")
    if kind == "reward":
        args.lengths = int_list(args.lengths, "--lengths", p)
        if len(args.lengths) < 2 and args.url is None:
            p.error("--lengths needs at least two output lengths (a distribution)")
        if args.url is not None and args.requests < 2:
            p.error("--requests must be >= 2 (a distribution)")
    else:
        args.frames = int_list(args.frames or "5,9,13", "--frames", p)
        if len(args.frames) < 2:
            p.error("--frames needs at least two frame counts (a distribution)")
    args.command = shlex.join(["python", "experiments/measure.py", command, *(argv or [])])
    return args


def _median_s(fn: Callable[[], object], device: torch.device, args: argparse.Namespace) -> float:
    return statistics.median(roofline.time_calls_ms(fn, device, warmup=args.warmup, iters=args.iters)) / 1e3


def judge_latencies(args: argparse.Namespace, device: torch.device) -> tuple[list[dict[str, Any]], str]:
    """Seconds of one judge call per output length (module docstring)."""
    from digenrl.rewards.registry import build_reward
    from digenrl.rewards.vlm_judge import VLMJudge

    reward = build_reward(args.reward, device=device)
    if not isinstance(reward, VLMJudge):
        raise SystemExit(f"--reward {args.reward} is not a VLM judge; time another reward with --url")
    torch.manual_seed(args.seed)
    images = torch.rand(args.batch, 3, args.height, args.width, device=device)
    prompts = [f"a photo of object {i}" for i in range(args.batch)]
    inputs = reward.encode(images, prompts)
    rows = []
    for length in args.lengths:

        @torch.no_grad()
        def call(length: int = length) -> object:
            return reward.model.generate(
                **inputs, max_new_tokens=length, min_new_tokens=length, do_sample=False
            )

        seconds = _median_s(call, device, args)
        rows.append({"output_tokens": length, "seconds": seconds})
        print(
            f"# {args.reward}: {length} output tokens x {args.batch} images: {seconds * 1e3:.1f} ms",
            flush=True,
        )
    note = (
        f"{args.reward} (random weights, {reward.num_parameters():,} parameters) on {args.batch} "
        f"{args.height}x{args.width} image(s) per call, prefill + L decode steps for L in {args.lengths}; "
        "the lengths are taken as equally likely (an assumption: replace --lengths by a real judge's)"
    )
    return rows, note


def server_latencies(args: argparse.Namespace) -> tuple[list[dict[str, Any]], str]:
    """Seconds of ``--requests`` sequential requests to the server at ``--url``."""
    from digenrl.rewards.remote import RemoteReward

    reward = RemoteReward(args.url)
    generator = torch.Generator().manual_seed(args.seed)
    images = torch.rand(args.batch, 3, args.height, args.width, generator=generator)
    prompts = [f"a photo of object {i}" for i in range(args.batch)]
    for _ in range(args.warmup):
        reward.score_images(images, prompts)
    rows = []
    for i in range(args.requests):
        start = time.perf_counter()
        reward.score_images(images, prompts)
        rows.append({"request": i, "seconds": time.perf_counter() - start})
    note = (
        f"{args.requests} sequential requests of {args.batch} {args.height}x{args.width} image(s) to a "
        "reward server (an idle server: requests queued behind others' wait longer)"
    )
    return rows, note


def generator_costs(args: argparse.Namespace, device: torch.device) -> tuple[list[dict[str, Any]], str]:
    """Seconds of one denoising step per frame count (module docstring)."""
    from digenrl.data.dtypes import TORCH_DTYPES
    from digenrl.models import TextCondition, build_flow_model, get_model_spec
    from digenrl.models.flow_model import latent_shape_for
    from digenrl.perf.bench_generator import StepCase, make_sampler

    spec = get_model_spec(args.model)
    if not spec.is_video:
        raise SystemExit(
            f"--model {args.model} is an image model: its per-sample cost does not vary (fixed resolution, "
            "text padded to a fixed length); sample-costs measures video models at several frame counts"
        )
    height, width = args.height or spec.default_height, args.width or spec.default_width
    for frames in args.frames:  # every frame count checked before the model is built
        latent_shape_for(spec, height, width, frames, key_prefix="--")
    dtype = TORCH_DTYPES[bench_cli.resolve_dtype(args.dtype, device)]
    torch.manual_seed(args.seed)
    flow_model = build_flow_model(spec, dtype=dtype, device=device)
    flow_model.eval().requires_grad_(False)
    uncond = TextCondition.random(spec.text_encoder, 1, device=device, dtype=flow_model.dtype)
    rows = []
    for frames in args.frames:
        latent_shape = flow_model.latent_shape(height, width, frames)
        tokens = flow_model.token_count(height, width, frames)
        case = StepCase(
            flow_model, make_sampler(spec.name, spec, tokens, False), args.batch, latent_shape, uncond
        )
        seconds = _median_s(lambda c=case: c.step(flow_model), device, args)
        rows.append({"frames": frames, "tokens": tokens, "seconds": seconds})
        print(
            f"# {spec.name}: {frames} frames ({tokens} tokens) x {args.batch}: {seconds * 1e3:.1f} ms/step",
            flush=True,
        )
    note = (
        f"{spec.name} (random weights) at {height}x{width}, one denoising step of {args.batch} sample(s) per "
        f"frame count; frame counts {args.frames} equally likely per prompt (the sampler's buckets)"
    )
    return rows, note


def carried_costs(args: argparse.Namespace) -> tuple[list[dict[str, Any]], str, str, str]:
    """Step seconds per frame count carried from the measured cost file ``--carry`` (module docstring)."""
    from digenrl.costs.cost_model import CostModel
    from digenrl.costs.extrapolation import reshape

    costs = CostModel.load(args.carry)
    if costs.meta.get("frames") is None:
        raise SystemExit(f"--carry {args.carry} is not a video model's cost file (no meta.frames)")
    rows = []
    for frames in args.frames:
        carried = reshape(costs, frames)
        rows.append({"frames": frames, "seconds": carried.generator_step_s(args.batch, False)})
    source = (
        f"assumed (frame counts {args.frames} equally likely per prompt; step cost per frame count carried "
        f"from the measured {args.carry} at {costs.meta['frames']} frames by counted FLOPs, "
        f"digenrl/costs/extrapolation.py reshape; {args.command})"
    )
    note = f"{costs.model} on {costs.device}, {args.batch} sample(s) per forward; nothing timed"
    return rows, note, source, costs.model


def run(args: argparse.Namespace, kind: str) -> tuple[SampleVariance, dict[str, Any]]:
    device = roofline.resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    source = f"measured: {args.command}"
    if kind == "generator":
        if args.carry is not None:
            rows, note, source, model = carried_costs(args)
            name = f"{model}-frames-assumed"
        else:
            rows, note = generator_costs(args, device)
            name = f"{args.model}-frames"
        dist = SampleCostDistribution(
            "generate",
            "discrete",
            source,
            values=tuple(r["seconds"] for r in rows),
            per="prompt",
            batching="mean",
            note=note,
        )
    elif args.url is not None:
        rows, note = server_latencies(args)
        name = "remote-reward"
        dist = SampleCostDistribution(
            "reward", "empirical", source, values=tuple(r["seconds"] for r in rows), note=note
        )
    else:
        rows, note = judge_latencies(args, device)
        name = f"{args.reward}-latency"
        dist = SampleCostDistribution(
            "reward", "discrete", source, values=tuple(r["seconds"] for r in rows), note=note
        )
    where = roofline.device_description(device)
    timed = not (kind == "generator" and args.carry is not None)
    variance = SampleVariance(name, (dist,), seed=args.seed, note=f"measured on {where}" if timed else note)
    report = {  # nothing of this machine's where nothing was timed (--carry)
        "command": args.command,
        "device": str(device) if timed else None,
        "device_name": where if timed else None,
        "environment": roofline.environment() if timed else None,
        "rows": rows,
        "variance": variance.to_dict(),
    }
    return variance, report


def main(argv: list[str] | None = None, kind: str = "reward") -> int:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    args = parse_args(sys.argv[1:] if argv is None else argv, kind)
    try:  # a bad cost file or frame count: its message, not a traceback
        variance, report = run(args, kind)
    except ValueError as error:
        raise SystemExit(f"{args.command.split(' ', 3)[2]}: {error}") from error
    path = variance.save(args.out / f"variance-{variance.name}.json")
    (args.out / f"variance-{variance.name}-report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(variance.describe())
    print(f"wrote {path}")
    return 0
