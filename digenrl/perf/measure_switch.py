"""Measure the hybrid engine's switch on this device: offload, onload and re-shard of ``colocated-engine``.

    python experiments/measure.py switch --model flux.1-dev --modes lora,full --out runs/switch

Builds ``--model``'s transformer with random weights (the zoo's published config, ``model.dtype``), the
trainer's side as the runtime's single-rank trainer has it (LoRA adapter in fp32 or every weight trainable,
AdamW state created by one step, gradients freed by it) and a generation copy, then runs the runtime's own
switch (:class:`digenrl.systems.engine_switch.EngineSwitch`: ``to_generation`` then ``to_training``)
``--iters`` times after one warm-up (which pins the host buffers). Writes ``switch-<device>-<model>.json``:
per mode every step's median seconds, bytes and GB/s, and the summary the simulator reads from a cost file's
``meta["engine_switch"][mode]`` (``offload_gbps`` / ``onload_gbps``: bytes over seconds of all offloads /
onloads; ``reshard_s``: the median re-shard; digenrl/sim/schedules/colocated_engine.py). A mode whose two
copies and optimizer state do not fit the device's free memory is skipped with the reason in the file.
``--cost-file PATH`` also writes each measured mode's summary (with the command and the device) into that
cost file's ``meta["engine_switch"]``, where the simulator prices ``colocated-engine`` from it.
Runs on a CPU too (tiny models, tests): host copies are then memory copies and say nothing of a GPU.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch

from digenrl.data.dtypes import TORCH_DTYPES
from digenrl.models.bundle import meta_transformer
from digenrl.models.flow_model import build_flow_model
from digenrl.models.specs import get_model_spec
from digenrl.perf.roofline import environment, resolve_device
from digenrl.runtime.hardware.profiles import detect_device
from digenrl.systems.engine_switch import EngineSwitch
from digenrl.trainer.lora import apply_lora, enable_full_finetune

GIB = 2**30
MODES = ("lora", "full")


def _trainer_side(flow_model: torch.nn.Module, mode: str, lora_rank: int) -> torch.optim.Optimizer:
    """Make ``flow_model`` the trainer's (adapter or all weights trainable) with AdamW state in place."""
    if mode == "lora":
        params = apply_lora(flow_model, rank=lora_rank, alpha=float(lora_rank))
    else:
        params = enable_full_finetune(flow_model)
    optimizer = torch.optim.AdamW(params, lr=1e-6)
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()  # creates exp_avg / exp_avg_sq, as the trainer's first step does
    optimizer.zero_grad(set_to_none=True)
    return optimizer


def fits(model: str, mode: str, dtype: torch.dtype, device: torch.device) -> str:
    """ "" or why the mode does not fit: the trainer's weights, the generation copy and (full fine-tuning) two
    AdamW states of the weights, against the device's free memory (the peak of the first switch)."""
    if device.type != "cuda":
        return ""
    weights = sum(p.numel() for p in meta_transformer(get_model_spec(model)).parameters()) * dtype.itemsize
    need = weights * (4 if mode == "full" else 2)
    free, _ = torch.cuda.mem_get_info(device)
    if need > 0.92 * free:
        return (
            f"needs about {need / GIB:.1f} GiB (trainer, generation copy, optimizer), {free / GIB:.1f} free"
        )
    return ""


def measure_mode(
    model: str, mode: str, *, dtype: torch.dtype, device: torch.device, iters: int, lora_rank: int
):
    """One mode's switch timings (module docstring)."""
    torch.manual_seed(0)
    flow_model = build_flow_model(get_model_spec(model), pretrained_path=None, dtype=dtype, device=device)
    generation = copy.deepcopy(flow_model)
    optimizer = _trainer_side(flow_model, mode, lora_rank)
    if mode == "lora":
        apply_lora(generation, rank=lora_rank, alpha=float(lora_rank))
    generation.requires_grad_(False)
    spans: list[tuple[str, str, float, int]] = []
    transformer = flow_model.transformer
    switch = EngineSwitch(
        trainer_module=transformer,
        trainer_named=[(n, p) for n, p in transformer.named_parameters() if p.requires_grad],
        optimizer=optimizer,
        generation_model=generation,
        device=device,
        mode=mode,
        offload=True,
        on_span=lambda phase, start, end, extra: spans.append(
            (phase, extra["what"], end - start, int(extra["bytes"] or 0))
        ),
    )
    switch.to_training()  # park the generation copy first: the peak is then one copy beside the trainer
    for _ in range(iters + 1):
        switch.to_generation()
        switch.to_training()
    timed: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    for phase, what, seconds, nbytes in spans:
        timed[(phase, what)].append((seconds, nbytes))
    steps = {}
    totals: dict[str, list[float]] = {"offload": [0.0, 0.0], "onload": [0.0, 0.0]}
    for (phase, what), runs in timed.items():
        runs = runs[1:] if len(runs) > 1 else runs  # the first of each pinned its host buffers
        seconds = statistics.median(s for s, _ in runs)
        nbytes = runs[-1][1]
        steps[f"{phase} {what}"] = {
            "seconds": seconds,
            "bytes": nbytes,
            "gbps": nbytes / seconds / 1e9 if seconds > 0 else None,
        }
        if phase in totals:
            totals[phase][0] += nbytes
            totals[phase][1] += seconds
    reshard = steps["reshard trainer weights into generation copy"]
    summary = {
        "offload_gbps": totals["offload"][0] / totals["offload"][1] / 1e9,
        "onload_gbps": totals["onload"][0] / totals["onload"][1] / 1e9,
        "reshard_s": reshard["seconds"],
        "reshard_bytes": reshard["bytes"],
    }
    return {"steps": steps, "engine_switch": summary}


def record_in_cost_file(path: Path, result: dict) -> None:
    """Put every measured mode's summary into the cost file at ``path`` (``meta["engine_switch"][mode]``);
    the file must load as a cost model before and after."""
    from digenrl.costs.cost_model import CostModel

    costs = CostModel.load(path)  # a clear error for a file that is not a cost file
    if costs.device != result["family"]:
        # a switch measured on one kind must not price another (a device call may land on either kind)
        raise SystemExit(
            f"--cost-file {path} is the cost file of a {costs.device}, but this switch was measured on a "
            f"{result['device_name']} ({result['family']}); record it in the {result['family']} cost file"
        )
    data = json.loads(path.read_text())
    switch = data.setdefault("meta", {}).setdefault("engine_switch", {})
    for mode, measured in result["modes"].items():
        switch[mode] = {
            **measured["engine_switch"],
            "device_name": result["device_name"],
            "dtype": result["dtype"],
            "command": result["command"],
        }
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    CostModel.load(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="measure.py switch", description=__doc__.splitlines()[0])
    p.add_argument(
        "--model", default="tiny-sd3", help="zoo entry (sd3.5-medium, flux.1-dev, qwen-image, ...)"
    )
    p.add_argument("--modes", default="lora,full", help="comma-separated: lora, full")
    p.add_argument("--dtype", default=None, help="model dtype (default bfloat16 on a GPU, float32 on a CPU)")
    p.add_argument("--device", default="auto")
    p.add_argument("--iters", type=int, default=3, help="timed switches after one warm-up")
    p.add_argument("--lora-rank", type=int, default=32)
    p.add_argument("--out", default="runs/switch", help="folder for switch-<device>-<model>.json")
    p.add_argument("--cost-file", default=None, help="also record the summary in this cost file's meta")
    args = p.parse_args(argv)
    if args.cost_file is not None and not Path(args.cost_file).is_file():
        p.error(f"--cost-file {args.cost_file}: no such file")
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        p.error(f"--modes: {bad or 'none given'}; choose from {', '.join(MODES)}")
    if args.iters < 1 or args.lora_rank < 1:
        p.error(f"--iters and --lora-rank must be >= 1, got {args.iters}, {args.lora_rank}")
    device = resolve_device(args.device)
    dtype_name = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    if dtype_name not in TORCH_DTYPES:
        p.error(f"--dtype={dtype_name!r}; choose one of: {', '.join(TORCH_DTYPES)}")
    try:
        get_model_spec(args.model)
    except (KeyError, ValueError) as error:
        p.error(f"--model: {error}")
    dtype = TORCH_DTYPES[dtype_name]
    found = detect_device(device.type, device.index or 0)
    result: dict = {
        "model": args.model,
        "dtype": dtype_name,
        "device_name": found.name,
        "family": found.family,
        "iters": args.iters,
        "command": "python experiments/measure.py switch "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "environment": environment(),
        "modes": {},
        "skipped": {},
    }
    for mode in modes:
        reason = fits(args.model, mode, dtype, device)
        if reason:
            result["skipped"][mode] = reason
            print(f"# {mode}: skipped, {reason}")
            continue
        result["modes"][mode] = measure_mode(
            args.model, mode, dtype=dtype, device=device, iters=args.iters, lora_rank=args.lora_rank
        )
        s = result["modes"][mode]["engine_switch"]
        print(
            f"{args.model} {mode}: offload {s['offload_gbps']:.1f} GB/s, onload {s['onload_gbps']:.1f} GB/s, "
            f"reshard {s['reshard_s'] * 1e3:.2f} ms ({s['reshard_bytes'] / 2**20:.1f} MiB)"
        )
        if device.type == "cuda":
            torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"switch-{found.family}-{args.model}.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"# wrote {path}")
    if args.cost_file is not None:
        record_in_cost_file(Path(args.cost_file), result)
        print(f"# recorded meta.engine_switch in {args.cost_file}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
