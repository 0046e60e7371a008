"""Command-line and report plumbing shared by the benchmarks (``experiments/measure.py generator``,
``trainer``, ``reward``, ``backends``, ``costs``; ``python -m digenrl.perf.backward_check``): the flags they
have in common (one definition each: device and dtype, timing, the report, the shape, the optimised
path), comma-separated list flags, where ``--out`` writes, and the cells of the eager-vs-optimised markdown
tables."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from digenrl.data.dtypes import TORCH_DTYPES

#: the code paths the generator and trainer benchmarks time side by side (``--paths``)
PATHS = ("eager", "optimized")
#: ``--compile-dynamic`` -> torch.compile's ``dynamic``
DYNAMIC = {"auto": None, "true": True, "false": False}


def add_model_flag(p: argparse.ArgumentParser, *, default: str = "tiny-sd3") -> None:
    """``--model``: a zoo entry (``model.name``)."""
    from digenrl.models.specs import MODEL_SPECS

    p.add_argument("--model", default=default, choices=sorted(MODEL_SPECS), help="zoo entry (model.name)")


def add_device_flags(
    p: argparse.ArgumentParser,
    *,
    dtype_help: str | None = "auto: bfloat16 on cuda else fp32",
    threads: bool = True,
) -> None:
    """``--device``, ``--dtype`` (``auto`` or a ``model.dtype`` name; ``dtype_help=None``: no ``--dtype``)
    and ``--threads``."""
    p.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:1")
    if dtype_help is not None:
        p.add_argument("--dtype", default="auto", choices=["auto", *TORCH_DTYPES], help=dtype_help)
    if threads:
        p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's)")


def resolve_dtype(name: str, device: torch.device) -> str:
    """``--dtype auto``: bfloat16 on CUDA, else float32; any other name as given."""
    if name != "auto":
        return name
    return "bfloat16" if device.type == "cuda" else "float32"


def add_shape_flags(p: argparse.ArgumentParser) -> None:
    """``--height`` / ``--width`` / ``--frames``, each defaulting to the model's."""
    p.add_argument("--height", type=int, default=None, help="pixels (default: the model's)")
    p.add_argument("--width", type=int, default=None, help="pixels (default: the model's)")
    p.add_argument("--frames", type=int, default=None, help="video frames (default: the model's)")


def add_optimized_path_flags(p: argparse.ArgumentParser, *, paths: str, paths_help: str) -> None:
    """``--paths`` (a comma-separated subset of :data:`PATHS`) and the optimised path's settings:
    ``--attention-backend``, ``--compile``, ``--compile-mode``, ``--compile-dynamic``."""
    from digenrl.config import COMPILE_MODES

    p.add_argument("--paths", default=paths, help=paths_help)
    p.add_argument("--attention-backend", default="native", help="optimised path's model.attention_backend")
    p.add_argument("--compile", action="store_true", help="optimised path: torch.compile (model.compile)")
    p.add_argument("--compile-mode", default="default", choices=COMPILE_MODES, help="torch.compile mode")
    p.add_argument(
        "--compile-dynamic",
        default="auto",
        choices=sorted(DYNAMIC),
        help="auto: torch's automatic dynamic shapes (one recompile per changed dim); false: per shape",
    )


def add_text_flags(p: argparse.ArgumentParser, *, padding_default: str, padding_help: str) -> None:
    """``--text-tokens COND,UNCOND`` (real tokens of a masked encoder's prompts; see :func:`check_text`) and
    ``--text-padding`` (``model.text_padding``, digenrl/models/text_padding.py)."""
    from digenrl.config import TEXT_PADDING_MODES

    p.add_argument(
        "--text-tokens",
        default=None,
        help="COND,UNCOND: real tokens of the prompts and of the empty prompt of a masked text encoder "
        "(Qwen-Image), the rest padding as the encoder pads them; default every token real",
    )
    p.add_argument("--text-padding", default=padding_default, choices=TEXT_PADDING_MODES, help=padding_help)


def check_text(args: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """``args.text_tokens`` as a ``(cond, uncond)`` pair of counts >= 1 (or None); a usage error otherwise."""
    if args.text_tokens is None:
        return
    tokens = int_list(args.text_tokens, "--text-tokens", p)
    if len(tokens) != 2 or min(tokens) < 1:
        p.error(f"--text-tokens takes COND,UNCOND (two counts >= 1), got {args.text_tokens!r}")
    args.text_tokens = tuple(tokens)


def add_timing_flags(
    p: argparse.ArgumentParser, *, warmup: int, iters: int, warmup_help: str, iters_help: str
) -> None:
    """``--warmup`` (untimed) and ``--iters`` (timed, the median is reported); see :func:`check_timing`."""
    p.add_argument("--warmup", type=int, default=warmup, help=warmup_help)
    p.add_argument("--iters", type=int, default=iters, help=iters_help)


def check_timing(args: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """A usage error unless ``--iters >= 1`` and ``--warmup >= 0``."""
    if args.iters < 1 or args.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")


def add_report_flags(
    p: argparse.ArgumentParser, *, skipped: str = "configurations", flops: bool = True
) -> None:
    """``--no-flops`` and ``--ceiling-size`` (with ``flops``), ``--time-budget-s`` (what it skips:
    ``skipped``) and ``--out`` (see :func:`output_paths`)."""
    if flops:
        p.add_argument("--no-flops", action="store_true", help="skip FLOP counting")
        p.add_argument("--ceiling-size", type=int, default=None, help="n of the n³ matmul ceiling (0: skip)")
    p.add_argument("--time-budget-s", type=float, default=0.0, help=f"skip {skipped} after this (0: none)")
    p.add_argument("--out", default=None, help="output directory, or a .json path")


def int_list(text: str, flag: str, parser: argparse.ArgumentParser) -> list[int]:
    """``"1,4,16"`` → ``[1, 4, 16]``; anything but positive integers is a usage error naming ``flag``."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        parser.error(f"{flag} must be comma-separated integers, got {text!r}")
    if not values or min(values) < 1:
        parser.error(f"{flag} needs positive integers, got {text!r}")
    return values


def name_list(text: str, flag: str, allowed: tuple[str, ...], parser: argparse.ArgumentParser) -> list[str]:
    """``"optimized,eager"`` → ``["optimized", "eager"]`` (order kept); names outside ``allowed`` are a
    usage error naming ``flag``."""
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values or any(v not in allowed for v in values):
        parser.error(f"{flag} must be a comma-separated subset of {','.join(allowed)}, got {text!r}")
    return values


def output_paths(out: str, kind: str, model: str) -> tuple[Path, Path]:
    """(json, markdown) for ``--out``: a directory gets ``<kind>-<model>.json/.md``; a .json path its .md."""
    path = Path(out)
    if path.suffix == ".json":
        return path, path.with_suffix(".md")
    return path / f"{kind}-{model}.json", path / f"{kind}-{model}.md"


def fmt(value: float | None, spec: str) -> str:
    """``format(value, spec)``, or ``-`` for a value that was not measured."""
    return "-" if value is None else format(value, spec)


def cell(row: dict, key: str, spec: str, *, primary: str) -> str:
    """One table cell of a result row. A row without the ``primary`` time (skipped or failed) shows
    why in that column and ``-`` elsewhere."""
    if row.get(key) is not None:
        return format(row[key], spec)
    return row.get("skipped", row.get("error", "-"))[:40] if key == primary else "-"


def speedup(eager: dict, optimized: dict, key: str) -> str:
    """``eager[key] / optimized[key]`` as ``1.23x``, or ``-`` unless both paths measured ``key``."""
    if key in eager and key in optimized:
        return f"{eager[key] / optimized[key]:.2f}x"
    return "-"
