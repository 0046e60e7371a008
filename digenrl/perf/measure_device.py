"""Measure this machine's device for a hardware profile: the numbers a profile's ``gpu_types`` entry and
``links.host_device_gbps`` state as measured (digenrl/runtime/hardware/hardware_profiles/README.md).

    python experiments/measure.py device --out experiments/results/gpu/device-h100

Writes ``device-<family>.json`` (the device's name and family as a run's profile check reads them, memory,
the median bf16 n³ matmul rate, a device-to-device copy and pinned host<->device copies) and prints the YAML
lines of a profile's device type. On a CPU it measures the same (float32 matmul, no copies), for the record:
the CPU profiles' numbers stay planning placeholders.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from digenrl.perf.roofline import environment, matmul_ceiling, resolve_device, time_calls_ms
from digenrl.runtime.hardware.profiles import detect_device, known_device_type, load_profile


def copy_gbps(src: torch.Tensor, dst: torch.Tensor, device: torch.device, *, iters: int) -> float:
    """Median GB/s (1e9 B/s, bytes moved once) of ``dst.copy_(src)``."""
    ms = statistics.median(
        time_calls_ms(lambda: dst.copy_(src, non_blocking=True), device, warmup=3, iters=iters)
    )
    return src.numel() * src.element_size() / (ms / 1e3) / 1e9


def measure(device: torch.device, *, n: int, copy_mib: int, iters: int) -> dict:
    found = detect_device(device.type, device.index or 0)
    out: dict = {
        "device_name": found.name,
        "family": found.family,
        "memory_gib": found.memory_gib,
        "environment": environment(),
    }
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    out["matmul"] = matmul_ceiling(device, dtype, n=n, iters=iters)
    if device.type == "cuda":
        elements = copy_mib * 2**20 // 4
        host = torch.empty(elements, dtype=torch.float32, pin_memory=True)
        a = torch.empty(elements, dtype=torch.float32, device=device)
        b = torch.empty_like(a)
        out["copy_mib"] = copy_mib
        out["host_to_device_gbps"] = copy_gbps(host, a, device, iters=iters)
        out["device_to_host_gbps"] = copy_gbps(a, host, device, iters=iters)
        # bytes read once: the rate of one stream (read + write traffic is twice this)
        out["device_to_device_gbps"] = copy_gbps(a, b, device, iters=iters)
        del host, a, b
        torch.cuda.empty_cache()
    return out


def profile_lines(result: dict) -> str:
    """The measured lines of a profile's device type (the rest — speed relative to an H200, spec-sheet
    peaks — the profile's author states)."""
    memory = result["memory_gib"]
    matmul = result["matmul"]
    lines = [
        f"  {result['family']}:    # python experiments/measure.py device: {result['device_name']}",
        f"    memory_gib: {memory:.1f}    # torch total_memory" if memory else "    # memory: not measured",
        f"    measured_bf16_tflops: {matmul['tflops']:.0f}    # {matmul['n']}^3 {matmul['dtype']} matmul",
    ]
    if "host_to_device_gbps" in result:
        lines.append(
            f"  # links.host_device_gbps (pinned, one direction): {result['host_to_device_gbps']:.1f} "
            f"host->device, {result['device_to_host_gbps']:.1f} device->host"
        )
    return "\n".join(lines)


def write_profile(result: dict, path: Path) -> None:
    """A one-device hardware profile of this machine (name: ``path``'s stem): the measured memory, matmul
    rate and host copy, and — where a shipped profile describes the family — its stated speed, peaks and
    device links; each line says which."""
    known = known_device_type(result["family"])
    if result["memory_gib"] is None or known is None:
        raise SystemExit(
            f"--profile-out: a {result['device_name']} has no GPU memory or no shipped profile of its family "
            "to take the stated numbers from; write the profile by hand (hardware_profiles/README.md)"
        )
    gpu, links, source = known
    host = min(result["host_to_device_gbps"], result["device_to_host_gbps"])
    lines = [
        f"# One {result['device_name']}: measured lines from `python experiments/measure.py device "
        f"--profile-out {path.name}`",
        f"# ({result['environment'].get('torch')}); stated ones from profile {source}.",
        f"name: {path.stem}",
        f'description: "1 x {result["device_name"]} (single GPU; colocated runs and cost measurements)"',
        "backend: nccl",
        "nodes:",
        f"  - {{count: 1, gpus_per_node: 1, gpu: {result['family']}}}",
        "gpu_types:",
        f"  {result['family']}:",
        f"    relative_speed: {gpu.relative_speed:g}    # stated in profile {source}, not measured",
        f"    memory_gib: {result['memory_gib']:.1f}    # measured: torch total_memory",
        f"    bf16_tflops: {gpu.bf16_tflops:g}    # stated in profile {source} (spec sheet, dense)",
        f"    hbm_gbps: {gpu.hbm_gbps:g}    # stated in profile {source} (spec sheet)",
        f"    measured_bf16_tflops: {result['matmul']['tflops']:.0f}    # measured: "
        f"{result['matmul']['n']}^3 {result['matmul']['dtype']} torch.matmul, median",
        "links:",
        f"  intra_node_gbps: {links.intra_node_gbps:g}    # stated in profile {source}; unused on one GPU",
        f"  inter_node_gbps: {links.inter_node_gbps:g}    # stated in profile {source}; unused on one node",
        f"  host_device_gbps: {host:.1f}    # measured: pinned copy, slower direction",
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    load_profile(path)  # the file must load as written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="measure.py device", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--n", type=int, default=8192, help="n of the n³ matmul (default 8192)")
    p.add_argument("--copy-mib", type=int, default=1024, help="size of the timed copies (MiB)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--out", default="runs/device", help="folder for device-<family>.json")
    p.add_argument("--profile-out", default=None, help="also write a one-GPU hardware profile YAML here")
    args = p.parse_args(argv)
    if args.n < 1 or args.copy_mib < 1 or args.iters < 1:
        p.error(f"--n, --copy-mib and --iters must be >= 1, got {args.n}, {args.copy_mib}, {args.iters}")
    device = resolve_device(args.device)
    result = measure(device, n=args.n, copy_mib=args.copy_mib, iters=args.iters)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"device-{result['family']}.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(profile_lines(result))
    print(f"# wrote {path}")
    if args.profile_out:
        write_profile(result, Path(args.profile_out))
        print(f"# wrote {args.profile_out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
