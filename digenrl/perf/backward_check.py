"""Regression check: does a LoRA forward + backward through real-size attention blocks run and give finite
gradients with a given attention setting?

It exists because cuDNN's fused SDPA backward failed on FLUX-size blocks with torch 2.11 + cuDNN 9.19 (seen
on an H200; :data:`digenrl.models.attention_safety.KNOWN_BAD_ATTENTION`). A slice of the real architecture
(the first ``double`` dual-stream and ``single`` single-stream blocks at the real width, heads and token
counts) exercises the same kernels as the whole model at a fraction of the build and run time.

Attention settings:

* ``default``: diffusers' and torch's defaults, untouched (what a plain diffusers training script gets);
* ``safe``: :func:`~digenrl.models.attention_safety.select_attention_backend` for training (the project's
  trainer path);
* ``cudnn``: diffusers' ``_native_cudnn`` backend forced, bypassing the safety table (to see whether the
  bad combination still reproduces);
* ``no-cudnn``: ``native`` with cuDNN taken out of SDPA (flash / memory-efficient kernels): the reference a
  cuDNN result's ``grad_norm`` is compared with before a shape joins the table's verified head dims.

Each setting should run in its own process (:func:`run_in_subprocess`): a failing fused kernel can leave a
sticky CUDA error that poisons every later call in the process. ``python -m digenrl.perf.backward_check
--help`` lists the options; the last stdout line is the JSON result.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from digenrl.data.dtypes import TORCH_DTYPES
from digenrl.perf import bench_cli

SETTINGS = ("default", "safe", "cudnn", "no-cudnn")
_REPO_ROOT = Path(__file__).resolve().parents[2]


def sliced_spec(model: str, *, double: int, single: int):
    """The zoo entry ``model`` with only its first ``double`` (dual-stream) and ``single`` (single-stream)
    blocks; other families have one block kind, sliced to ``double``."""
    from digenrl.models import get_model_spec

    spec = get_model_spec(model)
    cfg = dict(spec.transformer_config)
    if double < 1 or single < 0:
        raise ValueError(f"double must be >= 1 and single >= 0, got {double}, {single}")
    cfg["num_layers"] = min(double, int(cfg.get("num_layers", double)))
    if "num_single_layers" in cfg:
        cfg["num_single_layers"] = min(single, int(cfg["num_single_layers"]))
    if "dual_attention_layers" in cfg:  # SD3.5: indices must exist in the slice
        cfg["dual_attention_layers"] = [i for i in cfg["dual_attention_layers"] if i < cfg["num_layers"]]
    return dataclasses.replace(spec, transformer_config=cfg)


def check_backward(
    model: str = "flux.1-dev",
    *,
    setting: str = "safe",
    double: int = 2,
    single: int = 2,
    heights: tuple[int, ...] = (512,),
    batch: int = 1,
    lora_rank: int = 32,
    device: str = "auto",
    dtype: str = "auto",
) -> dict:
    """Build the slice, apply ``setting``, run forward + backward at each height (square images)."""
    from digenrl.models import FlowModel, TextCondition, set_attention_backend
    from digenrl.models.attention_safety import (
        AttentionShape,
        apply_attention_backend,
        process_attention_backend,
        select_attention_backend,
    )
    from digenrl.models.construction import instantiate_diffusers_model
    from digenrl.models.flow_model import current_attention_backends
    from digenrl.perf.roofline import resolve_device
    from digenrl.trainer.lora import apply_lora

    if setting not in SETTINGS:
        raise ValueError(f"setting={setting!r}; allowed: {', '.join(SETTINGS)}")
    torch_device = resolve_device(device)
    dtype_name = bench_cli.resolve_dtype(dtype, torch_device)
    spec = sliced_spec(model, double=double, single=single)
    torch.manual_seed(0)
    transformer = instantiate_diffusers_model(
        spec.transformer_class, spec.transformer_config, device=torch_device, dtype=TORCH_DTYPES[dtype_name]
    )
    flow_model = FlowModel(spec, transformer)
    params = apply_lora(flow_model, rank=lora_rank, alpha=2 * lora_rank)
    choice = None
    process_default = process_attention_backend()
    attention_shape = AttentionShape.of(flow_model)
    if setting == "safe":
        choice = select_attention_backend(
            "native", needs_backward=True, device=torch_device, shape=attention_shape
        ).to_dict()
        apply_attention_backend(flow_model, choice["backend"])
    elif setting == "cudnn":
        set_attention_backend(flow_model, "_native_cudnn")
    elif setting == "no-cudnn":
        torch.backends.cuda.enable_cudnn_sdp(False)
        apply_attention_backend(flow_model, "native")
    result: dict = {
        "model": model,
        "setting": setting,
        "blocks": {
            "double": spec.transformer_config["num_layers"],
            "single": spec.transformer_config.get("num_single_layers", 0),
        },
        "device": str(torch_device),
        "dtype": dtype_name,
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cudnn_sdp_enabled": torch.backends.cuda.cudnn_sdp_enabled(),
        "attention_backends": sorted(current_attention_backends(flow_model)),
        "attention_choice": choice,
        "attention_shape": dataclasses.asdict(attention_shape) if attention_shape else None,
        "lora_params": sum(p.numel() for p in params),
        "runs": [],
    }
    for height in heights:
        run: dict = {"height": height, "width": height}
        try:
            shape = flow_model.latent_shape(height, height)
            run["tokens"] = flow_model.token_count(height, height) + spec.text_encoder.seq_len
            x = torch.randn(batch, *shape, device=torch_device)
            cond = TextCondition.random(
                flow_model.spec.text_encoder, batch, device=torch_device, dtype=flow_model.dtype
            )
            for p in params:
                p.grad = None
            if torch_device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(torch_device)
            t0 = time.perf_counter()
            v = flow_model(x, torch.rand(batch, device=torch_device), cond)
            loss = v.float().square().mean()
            loss.backward()
            if torch_device.type == "cuda":
                torch.cuda.synchronize(torch_device)
            grads = [p.grad for p in params if p.grad is not None]
            finite = bool(torch.isfinite(loss)) and all(bool(torch.isfinite(g).all()) for g in grads)
            nonzero = any(bool(g.abs().sum() > 0) for g in grads)
            # compared across settings (same seed, same inputs): another kernel must give the same gradient
            grad_norm = (
                float(torch.stack([g.double().square().sum() for g in grads]).sum().sqrt()) if grads else 0.0
            )
            run.update(
                seconds=time.perf_counter() - t0,
                loss=float(loss.detach()),
                grads=len(grads),
                grad_norm=grad_norm,
                finite=finite,
                nonzero_grad=nonzero,
                passed=finite and nonzero and len(grads) == len(params),
                peak_mem_gib=torch.cuda.max_memory_allocated(torch_device) / 2**30
                if torch_device.type == "cuda"
                else None,
            )
        except Exception as exc:  # the check reports failures, it does not raise them
            run.update(passed=False, error=f"{type(exc).__name__}: {str(exc)[:800]}")
            traceback.print_exc()
        result["runs"].append(run)
    result["passed"] = all(r.get("passed", False) for r in result["runs"])
    if process_default is not None and process_attention_backend() != process_default:
        transformer.set_attention_backend(process_default)  # run in-process: leave diffusers as found
    return result


def run_in_subprocess(
    model: str,
    *,
    setting: str,
    double: int,
    single: int,
    heights: tuple[int, ...],
    device: str,
    dtype: str,
    timeout_s: float,
) -> dict:
    """:func:`check_backward` in a fresh Python process; a crash or timeout is a failed result."""
    cmd = [
        sys.executable,
        "-m",
        "digenrl.perf.backward_check",
        "--model",
        model,
        "--setting",
        setting,
        "--double",
        str(double),
        "--single",
        str(single),
        "--heights",
        ",".join(str(h) for h in heights),
        "--device",
        device,
        "--dtype",
        dtype,
    ]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH")) if p)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=_REPO_ROOT)
    except subprocess.TimeoutExpired:
        return {
            "model": model,
            "setting": setting,
            "passed": False,
            "error": f"timed out after {timeout_s} s",
        }
    wall = time.perf_counter() - t0
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode == 0 and lines:
        result = json.loads(lines[-1])
    else:
        result = {
            "model": model,
            "setting": setting,
            "passed": False,
            "error": f"exit code {proc.returncode}: {proc.stderr.strip()[-1500:]}",
        }
    result["wall_s"] = wall
    if proc.stderr.strip() and not result.get("passed", False):
        result.setdefault("stderr_tail", proc.stderr.strip()[-1500:])
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="flux.1-dev", help="zoo entry to slice (model.name)")
    p.add_argument("--setting", default="safe", choices=SETTINGS)
    p.add_argument("--double", type=int, default=2, help="dual-stream blocks kept")
    p.add_argument("--single", type=int, default=2, help="single-stream blocks kept (FLUX)")
    p.add_argument("--heights", default="512", help="comma-separated square image sizes in pixels")
    p.add_argument("--batch", type=int, default=1)
    bench_cli.add_device_flags(p, threads=False)
    args = p.parse_args(argv)
    heights = tuple(bench_cli.int_list(args.heights, "--heights", p))
    result = check_backward(
        args.model,
        setting=args.setting,
        double=args.double,
        single=args.single,
        heights=heights,
        batch=args.batch,
        device=args.device,
        dtype=args.dtype,
    )
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
