"""Achieved throughput against what the chip can do: timings, counted FLOPs, a measured matmul ceiling.

Method (/work/.library/device/METHOD.md and the usual GPU benchmarking practice): warm up first, time with
device events (CUDA) or a host clock after a synchronise (CPU), repeat and take the median, and compare with a
ceiling *measured in the same run* (a large bf16 matrix product on random data, rotating input sets so the
L2 cache does not serve it) rather than the datasheet. FLOPs are counted by
``torch.utils.flop_counter.FlopCounterMode`` (matmuls, convolutions and SDPA, forward and backward), so a
model's achieved TFLOP/s = counted FLOPs / median time.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable

import torch

from digenrl.costs.flops import count_flops  # the project's one FLOP count, re-exported for the benchmarks
from digenrl.data.dtypes import dtype_name

__all__ = ["count_flops"]


def resolve_device(name: str) -> torch.device:
    """``auto``: CUDA if available, else CPU; anything else as torch spells it (``cpu``, ``cuda:1``)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def tensor_bytes(tensors) -> int:
    """Bytes held by ``tensors`` (an iterable), as the cost model counts weights, grads and payloads."""
    return int(sum(t.numel() * t.element_size() for t in tensors))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls_ms(fn: Callable[[], object], device: torch.device, *, warmup: int, iters: int) -> list[float]:
    """Milliseconds of ``iters`` calls of ``fn`` after ``warmup`` untimed ones (CUDA events on a GPU)."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(float(start.elapsed_time(end)))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return times


def summarize_ms(times: list[float]) -> dict[str, float]:
    return {"ms": statistics.median(times), "ms_min": min(times), "ms_max": max(times)}


def timed_first_call_s(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of one call, synchronised (the first call of a compiled path: it includes compilation)."""
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0


def matmul_ceiling(
    device: torch.device,
    dtype: torch.dtype,
    *,
    n: int = 8192,
    warmup: int = 3,
    iters: int = 10,
    sets: int = 3,
) -> dict[str, float | int | str]:
    """Median rate of an n×n×n matrix product on random data (2n³ FLOPs), rotating ``sets`` input pairs."""
    if n < 1 or iters < 1 or sets < 1:
        raise ValueError(f"n, iters and sets must be >= 1, got {n}, {iters}, {sets}")
    ms = statistics.median(_time_matmuls(device, dtype, n, warmup=warmup, iters=iters, sets=sets))
    if device.type == "cuda":  # give the 3 GB of inputs back before the model is built
        torch.cuda.empty_cache()
    return {
        "n": n,
        "dtype": dtype_name(dtype),
        "ms": ms,
        "tflops": 2 * n**3 / (ms / 1e3) / 1e12,
        "iters": iters,
    }


def _time_matmuls(
    device: torch.device, dtype: torch.dtype, n: int, *, warmup: int, iters: int, sets: int
) -> list[float]:
    pairs = [
        (torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype))
        for _ in range(sets)
    ]
    out = torch.empty(n, n, device=device, dtype=dtype)
    calls = iter(range(1 << 62))

    def product() -> None:
        a, b = pairs[next(calls) % sets]
        torch.matmul(a, b, out=out)

    return time_calls_ms(product, device, warmup=warmup, iters=iters)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.machine()} CPU, {torch.get_num_threads()} threads"


def environment() -> dict[str, object]:
    """Versions that decide kernel choices (torch, CUDA, cuDNN, diffusers)."""
    try:
        import diffusers

        diffusers_version = diffusers.__version__
    except ImportError:  # pragma: no cover
        diffusers_version = None
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "diffusers": diffusers_version,
        "python": platform.python_version(),
        "cudnn_sdp_enabled": torch.backends.cuda.cudnn_sdp_enabled(),
    }
