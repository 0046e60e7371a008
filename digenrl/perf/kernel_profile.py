"""Where one call's time goes: device-busy time against wall time, kernel launches, the top operators.

A step that runs at a small fraction of the matmul ceiling is either *launch-bound* (the GPU idles between
many small kernels; the device is busy for a small part of the wall time, and ``torch.compile`` / CUDA graphs
help) or *kernel-bound* (the GPU is busy but its kernels are slow; a better kernel or a larger batch helps).
:func:`profile_call` tells the two apart with ``torch.profiler`` (PyTorch docs, "PyTorch Profiler"): the
sum of the device kernels' self time over the synchronised wall time is the busy fraction, and the
runtime's kernel-launch calls are counted on the host side.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")
"""CUDA runtime/driver entry points of a kernel launch as the profiler names them (CUPTI); a CUDA-graph
replay launches its kernels without them."""


def _device_self_us(event) -> float:
    # torch >= 2.4 names it self_device_time_total; older releases self_cuda_time_total
    value = getattr(event, "self_device_time_total", None)
    if value is None:
        value = getattr(event, "self_cuda_time_total", 0.0)
    return float(value)


def profile_call(fn: Callable[[], object], device: torch.device, *, top: int = 15) -> dict[str, object]:
    """Run ``fn`` once under the profiler and summarise it.

    Returns ``wall_ms`` (host clock, synchronised), ``device_busy_ms`` (sum of the kernels' time; kernels
    of overlapping streams would count twice, the trainer and sampler use one stream), ``busy_fraction``,
    ``kernel_launches``, ``top_ops``: the ``top`` host operators by the device time of the kernels they
    launched (by self CPU time on a CPU), and ``top_kernels``, each with its share and call count. Call
    ``fn`` a few times before profiling: compilation and autotuning are not what this measures.
    """
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top}")
    activities = [ProfilerActivity.CPU]
    on_gpu = device.type == "cuda"
    if on_gpu:
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        fn()
        if on_gpu:
            torch.cuda.synchronize(device)
        wall_ms = 1e3 * (time.perf_counter() - t0)
    averages = prof.key_averages()
    launches = sum(int(e.count) for e in averages if e.key in LAUNCH_CALLS)
    if on_gpu:
        # kernels (and copies) are the device-side events; a host operator's self device time is that of
        # the kernels it launched, so summing both would count every kernel twice
        kernels = [e for e in averages if e.device_type != DeviceType.CPU]
        host_ops = [e for e in averages if e.device_type == DeviceType.CPU]
        busy_ms = sum(_device_self_us(e) for e in kernels) / 1e3
        ops = _ranked(host_ops, lambda e: _device_self_us(e) / 1e3, busy_ms, top)
        top_kernels = _ranked(kernels, lambda e: _device_self_us(e) / 1e3, busy_ms, top)
    else:
        busy_ms = None
        cpu_ms = sum(float(e.self_cpu_time_total) for e in averages) / 1e3
        ops = _ranked(list(averages), lambda e: float(e.self_cpu_time_total) / 1e3, cpu_ms, top)
        top_kernels = []
    return {
        "wall_ms": wall_ms,
        "device_busy_ms": busy_ms,
        "busy_fraction": None if busy_ms is None else busy_ms / wall_ms,
        "kernel_launches": launches if on_gpu else None,
        "top_ops": ops,
        "top_kernels": top_kernels,
    }


def _ranked(events, ms_of, basis_ms: float, top: int) -> list[dict[str, object]]:
    rows = sorted(((e.key, ms_of(e), int(e.count)) for e in events), key=lambda r: r[1], reverse=True)
    return [
        {"name": name[:120], "self_ms": ms, "share": ms / basis_ms if basis_ms else 0.0, "calls": calls}
        for name, ms, calls in rows[:top]
        if ms > 0
    ]


def format_profile(summary: dict[str, object], title: str, kernels: int = 6) -> str:
    """A markdown block: the busy line, the top operators and the ``kernels`` slowest kernels."""
    busy = summary["busy_fraction"]
    head = f"**{title}**: wall {summary['wall_ms']:.1f} ms"
    if busy is not None:
        head += (
            f", device busy {summary['device_busy_ms']:.1f} ms ({busy:.0%}), "
            f"{summary['kernel_launches']} kernel launches"
        )
    lines = [head, "", "| op / kernel | ms | share | calls |", "|:---|---:|---:|---:|"]
    for op in summary["top_ops"]:
        name = str(op["name"]).replace("|", "/")
        lines.append(f"| `{name[:80]}` | {op['self_ms']:.2f} | {op['share']:.1%} | {op['calls']} |")
    for kernel in summary.get("top_kernels", [])[:kernels]:
        name = str(kernel["name"]).replace("|", "/")
        lines.append(
            f"| kernel `{name[:72]}` | {kernel['self_ms']:.2f} | {kernel['share']:.1%} | {kernel['calls']} |"
        )
    return "\n".join(lines)
