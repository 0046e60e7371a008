"""``python experiments/export.py RUN_DIR [--step N] [--ema] --format FORMAT --out DIR [--pipeline]``.

Writes the trained policy of a run folder where diffusers, peft or ComfyUI load it (``--format diffusers``,
``peft`` or ``kohya``; docs/export.md). Bad input — a folder without a checkpoint, a step that is not
there, ``--ema`` on a run without an EMA, ``--format peft`` or ``kohya`` for a full fine-tuning run,
``kohya`` for a family ComfyUI does not map, an output folder that is not empty — exits with status 2
and a message naming the folder, file or flag.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from digenrl.config import ConfigError
from digenrl.dependency_logs import quiet_dependency_logs
from digenrl.export.formats import FORMATS, write_adapter, write_pipeline, write_transformer
from digenrl.export.trained import TrainedPolicy, load_trained
from digenrl.models.specs import get_family
from digenrl.trainer.lora_export import DIFFUSERS_LORA_FILE, KOHYA_LORA_FILE, check_kohya_family


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="experiments/export.py",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="the out_dir of a training run")
    p.add_argument("--step", type=int, default=None, help="checkpoint step_<N> (default: the latest)")
    p.add_argument("--ema", action="store_true", help="export the EMA of the weights (trainer.ema_decay > 0)")
    p.add_argument(
        "--format",
        required=True,
        choices=FORMATS,
        help="diffusers: pipe.load_lora_weights(DIR) for a LoRA, save_pretrained for full fine-tuning; "
        "peft: PeftModel.from_pretrained(transformer, DIR) (LoRA runs); kohya: one safetensors file of "
        "lora_transformer_*.lora_down/lora_up/alpha keys for ComfyUI (LoRA runs of SD3 and FLUX)",
    )
    p.add_argument("--out", type=Path, required=True, help="output folder (new or empty)")
    p.add_argument("--pipeline", action="store_true", help="write a whole diffusers pipeline directory")
    p.add_argument(
        "--device",
        default="cpu",
        help="where models are built (--pipeline, full fine-tuning); a random base is rebuilt only on the "
        "device type the run used (default: cpu)",
    )
    return p.parse_args(argv)


def export(args: argparse.Namespace) -> TrainedPolicy:
    """Write the export ``args`` describe; returns the policy written."""
    out: Path = args.out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {str(out)!r} exists and is not an empty folder; choose a new one")
    policy = load_trained(args.run_dir, args.step, ema=args.ema)
    if args.format in ("peft", "kohya") and not policy.lora:
        raise ConfigError(
            f"--format {args.format} writes a LoRA adapter, but {args.run_dir} fine-tuned the whole "
            "transformer (trainer.mode=full); use --format diffusers (the transformer's save_pretrained)"
        )
    if args.format == "kohya":
        if args.pipeline:
            raise ConfigError(
                "--format kohya with --pipeline: a pipeline directory carries its adapter for diffusers or "
                "peft; export the kohya file on its own (drop --pipeline)"
            )
        try:
            check_kohya_family(policy.spec.family)
        except ValueError as error:
            raise ConfigError(str(error)) from None
    out.mkdir(parents=True, exist_ok=True)
    if args.pipeline:
        write_pipeline(policy, out, args.format, args.device)
    elif policy.lora:
        write_adapter(policy, out, args.format)
    else:
        write_transformer(policy, out, args.device)
    return policy


def usage_lines(policy: TrainedPolicy, fmt: str, out: Path, pipeline: bool) -> list[str]:
    """How to load what was written (printed after an export)."""
    pipe_cls = get_family(policy.spec.family).pipeline_class
    transformer_cls = policy.spec.transformer_class
    if pipeline:
        lines = [f"pipe = diffusers.{pipe_cls}.from_pretrained({str(out)!r})"]
        if policy.lora and fmt == "diffusers":
            lines.append(f"pipe.load_lora_weights({str(out)!r})")
        elif policy.lora:
            lines.append(f"pipe.transformer = peft.PeftModel.from_pretrained(pipe.transformer, {str(out)!r})")
        t5 = [c.max_length for c in policy.spec.text_encoder.components if c.model_class == "T5EncoderModel"]
        if t5:  # the T5 length is a call argument of the SD3 / FLUX pipelines, not read from the tokenizer
            lines.append(
                f"image = pipe('a prompt', max_sequence_length={t5[0]}).images[0]  # the run's T5 length"
            )
        return lines
    if not policy.lora:
        return [f"transformer = diffusers.{transformer_cls}.from_pretrained({str(out)!r})"]
    if fmt == "diffusers":
        return [
            f"pipe.load_lora_weights({str(out)!r})  # pipe: a diffusers.{pipe_cls} ({DIFFUSERS_LORA_FILE})"
        ]
    if fmt == "kohya":
        return [f"copy {str(out / KOHYA_LORA_FILE)!r} into ComfyUI/models/loras/ and load it with LoraLoader"]
    return [f"model = peft.PeftModel.from_pretrained(transformer, {str(out)!r})  # a {transformer_cls}"]


def main(argv: list[str] | None = None) -> int:
    quiet_dependency_logs()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        policy = export(args)
    except ConfigError as error:
        print(f"export error: {error}", file=sys.stderr)
        return 2
    print(f"[digenrl] exported {policy.describe()} ({policy.checkpoint}) to {args.out}", flush=True)
    for line in usage_lines(policy, args.format, args.out, args.pipeline):
        print(f"[digenrl]   {line}", flush=True)
    return 0
