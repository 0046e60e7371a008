"""One training iteration under the kernel profiler: where its device time goes, per phase and per kind of
kernel (``runtime.profile_iteration``; docs/operations.md, "Profiling an iteration").

A loop that runs at a fraction of its matmul bound (the closing summary's ``fraction_of_bound``) loses the
rest somewhere: slow kernels of one kind (attention backward, GEMMs at awkward shapes, the VAE's
convolutions), many small element-wise kernels, or a device that idles while the host prepares the next
step. This answers which, for the phases a run's event log already names (``generate``, ``score``,
``train``, ``optimizer``, ``sync``, …): every :meth:`~digenrl.runtime.observe.events.EventLogger.span` is also
a ``torch.profiler.record_function`` range, so in the profiler's trace each kernel's launch call lies in the
host range of the phase that launched it (``user_annotation``; matched by the launch's ``correlation``,
else the phase's GPU-side range, ``gpu_user_annotation``, holds the kernel), and the host range gives the
phase's wall time. Phases nest (a ``transfer`` inside ``generate``): a kernel counts for the innermost, and
a phase's wall time is its own, without the phases nested in it.
Per phase: wall seconds, device-busy seconds, idle = wall − busy, and the busy seconds by kernel kind
(:func:`kernel_kind`); the slowest kernels overall. The trace format is Kineto's Chrome-trace JSON as
``torch.profiler.profile.export_chrome_trace`` writes it (PyTorch docs, "PyTorch Profiler").

Outputs, per rank: ``out_dir/profile/rank<r>.json`` (the summary), ``rank<r>.md`` (its tables) and the
full trace ``rank<r>.trace.json`` (open it in https://ui.perfetto.dev).
"""

from __future__ import annotations

import gc
import json
import re
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from digenrl.runtime.observe.idle_gaps import analyse_idle, format_idle
from digenrl.runtime.observe.sync_sites import format_sync_sites, recorded_sync_sites
from digenrl.runtime.observe.trace_ranges import Range, by_thread, innermost_at
from digenrl.runtime.run_folder.run_files import ensure_dir, open_new, publish, temporary_name, write_atomic

#: the prefix of the profiler ranges the event log opens (digenrl/runtime/observe/events.py,
#: ``EventLogger.span``)
RANGE_PREFIX = "digenrl/"

#: device-side event categories of a Kineto trace that occupy the GPU
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")

#: (kind, pattern on the lower-cased kernel name), first match wins. Convolutions before GEMMs: cuDNN names
#: its convolution kernels "...fprop_implicit_gemm...". Attention before GEMMs for the same reason.
KERNEL_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("communication", re.compile(r"nccl")),
    ("attention backward", re.compile(r"(flash|fmha|sdpa|attention|mha).*(bwd|backward|bprop|dgrad)")),
    ("attention forward", re.compile(r"flash|fmha|sdpa|attention|mha")),
    ("convolution", re.compile(r"conv|implicit_gemm|winograd|cudnn")),
    ("matmul", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|splitk|matmul|wgmma")),
    ("fused (inductor)", re.compile(r"^triton")),
    ("element-wise / reduction", re.compile(r"elementwise|vectorized|reduce|unrolled|at::native")),
)


def kernel_kind(name: str, category: str = "kernel") -> str:
    """The kind of a device event: copies and memsets by their category, kernels by their name."""
    if category == "gpu_memcpy":
        return "memcpy"
    if category == "gpu_memset":
        return "memset"
    lowered = name.lower()
    for kind, pattern in KERNEL_KINDS:
        if pattern.search(lowered):
            return kind
    return "other"


def _ranges(events: list[dict], category: str) -> list[Range]:
    """The project's profiler ranges of ``category``, shortest first (so the first range that contains a
    point is the innermost)."""
    found = [
        (
            e["name"][len(RANGE_PREFIX) :],
            float(e["ts"]),
            float(e["ts"]) + float(e.get("dur", 0.0)),
            e.get("tid"),
        )
        for e in events
        if e.get("cat") == category and str(e.get("name", "")).startswith(RANGE_PREFIX)
    ]
    return sorted(found, key=lambda r: r[2] - r[1])


OUTSIDE = "(outside any phase)"


def _phase_of(start_us: float, ranges: list[Range]) -> str:
    """The innermost of ``ranges`` (shortest first, any thread) holding ``start_us``."""
    for phase, lo, hi, _ in ranges:
        if lo <= start_us < hi:
            return phase
    return OUTSIDE


def _exclusive_walls(ranges: list[Range]) -> dict[str, float]:
    """Seconds per phase spent in its own code: each range's duration less its direct children's (ranges
    of the same thread inside it), so a nested phase (a ``transfer`` inside ``generate``) counts once."""
    walls: dict[str, float] = defaultdict(float)
    for phase, lo, hi, tid in ranges:
        inner = [r for r in ranges if r[3] == tid and lo <= r[1] and r[2] <= hi and r[2] - r[1] < hi - lo]
        direct = [r for r in inner if not any(o is not r and o[1] <= r[1] and r[2] <= o[2] for o in inner)]
        walls[phase] += (hi - lo - sum(r[2] - r[1] for r in direct)) / 1e6
    return walls


def summarise_trace(trace: dict[str, Any], *, wall_s: float, top: int = 20) -> dict[str, Any]:
    """The iteration's device time per phase and kind of kernel, from a Kineto Chrome trace (``trace``)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES]
    gpu_ranges = _ranges(events, "gpu_user_annotation")
    host_ranges = _ranges(events, "user_annotation")
    # a kernel belongs to the phase that launched it: its launch call (same ``correlation``) lies in a host
    # range of the launching thread; without the launch, the phase's GPU-side range holds the kernel itself
    launched_at = {
        e["args"]["correlation"]: (float(e["ts"]), e.get("tid"))
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }

    threads = by_thread(host_ranges)
    # a launch from a thread that holds no range of its own at that moment (autograd's device thread runs the
    # backward that the training phase's loss.backward() waits for, and with activation checkpointing the
    # recomputed forward too) belongs to the innermost range open on any thread then
    anywhere = by_thread([(phase, lo, hi, None) for phase, lo, hi, _ in host_ranges]).get(None)

    def host_range(t_us: float, tid: Any) -> Range | None:
        """The range open on thread ``tid`` at ``t_us``, else the innermost open on any thread."""
        found = innermost_at(t_us, threads[tid]) if tid in threads else None
        if found is None and anywhere is not None:
            found = innermost_at(t_us, anywhere)
        return found

    def launch_range(e: dict) -> tuple[str, tuple[float, float] | None]:
        """A device event's phase and the host range that launched it (None without its launch)."""
        launch = launched_at.get(e.get("args", {}).get("correlation"))
        if launch is not None:
            found = host_range(*launch)
            return (OUTSIDE, None) if found is None else (found[0], (found[1], found[2]))
        return _phase_of(float(e["ts"]), gpu_ranges or host_ranges), None

    def phase_of(e: dict) -> str:
        return launch_range(e)[0]

    def host_phase(t_us: float, tid: Any) -> str:
        found = host_range(t_us, tid)
        return OUTSIDE if found is None else found[0]

    busy: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    by_kernel: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for e in device:
        seconds = float(e.get("dur", 0.0)) / 1e6
        kind = kernel_kind(str(e.get("name", "")), str(e["cat"]))
        busy[phase_of(e)][kind] += seconds
        entry = by_kernel[(str(e.get("name", ""))[:160], kind)]
        entry[0] += seconds
        entry[1] += 1
    wall_by_phase = _exclusive_walls(host_ranges)
    phases = {}
    for phase in sorted(set(wall_by_phase) | set(busy), key=lambda p: -wall_by_phase.get(p, 0.0)):
        kinds = dict(sorted(busy[phase].items(), key=lambda kv: -kv[1])) if phase in busy else {}
        busy_s = sum(kinds.values())
        wall = wall_by_phase.get(phase)
        phases[phase] = {
            "wall_s": wall,
            "device_busy_s": busy_s,
            "idle_s": None if wall is None else max(wall - busy_s, 0.0),
            "busy_by_kind_s": kinds,
        }
    idle = analyse_idle(events, device, launch_range, host_phase)
    for phase, found in idle.items():  # a host sync between phases has a row of its own
        row = phases.setdefault(
            phase, {"wall_s": None, "device_busy_s": 0.0, "idle_s": None, "busy_by_kind_s": {}}
        )
        row.update(found)
    total_busy = sum(sum(k.values()) for k in busy.values())
    kernels = sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "wall_s": wall_s,
        "device_busy_s": total_busy,
        "busy_fraction": total_busy / wall_s if wall_s > 0 else None,
        "device_events": len(device),
        "phases": phases,
        "top_kernels": [
            {"name": name, "kind": kind, "seconds": s, "calls": int(n)} for (name, kind), (s, n) in kernels
        ],
    }


def format_summary(summary: dict[str, Any], title: str) -> str:
    """Markdown: per phase wall / busy / idle and the busy seconds by kind; then the slowest kernels."""
    busy = summary["busy_fraction"]
    lines = [
        f"# {title}",
        "",
        f"Wall {summary['wall_s']:.3f} s, device busy {summary['device_busy_s']:.3f} s"
        + (f" ({busy:.0%})" if busy is not None else "")
        + f", {summary['device_events']} device events.",
        "",
        "| phase | wall s | busy s | idle s | busy by kind (s) |",
        "|---|---:|---:|---:|---|",
    ]
    for phase, row in summary["phases"].items():
        kinds = ", ".join(f"{k} {s:.3f}" for k, s in row["busy_by_kind_s"].items() if s >= 5e-4) or "-"
        wall = "-" if row["wall_s"] is None else f"{row['wall_s']:.3f}"
        idle = "-" if row["idle_s"] is None else f"{row['idle_s']:.3f}"
        lines.append(f"| {phase} | {wall} | {row['device_busy_s']:.3f} | {idle} | {kinds} |")
    if any("idle_gaps" in row for row in summary["phases"].values()):
        lines += format_idle({p: r for p, r in summary["phases"].items() if "idle_gaps" in r})
    lines += format_sync_sites(summary.get("sync_sites") or [])
    if summary["top_kernels"]:
        lines += ["", "| kernel | kind | s | calls |", "|:---|---|---:|---:|"]
        for k in summary["top_kernels"]:
            name = k["name"].replace("|", "/")[:100]
            lines.append(f"| `{name}` | {k['kind']} | {k['seconds']:.4f} | {k['calls']} |")
    return "\n".join(lines) + "\n"


@contextmanager
def profiled_iteration(
    out_dir: str | Path, rank: int, device: torch.device, iteration: int
) -> Iterator[None]:
    """Profile the body (one iteration on this rank): ``out_dir/profile/rank<r>.{json,md,trace.json}``."""
    activities = [ProfilerActivity.CPU]
    on_gpu = device.type == "cuda"
    if on_gpu:
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    folder = ensure_dir(Path(out_dir) / "profile")
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        with recorded_sync_sites(device) as syncs:  # the wait below is the profile's, not the iteration's
            yield
        if on_gpu:
            torch.cuda.synchronize(device)
        wall_s = time.perf_counter() - t0
    trace_path = folder / f"rank{rank}.trace.json"
    tmp = temporary_name(trace_path)
    open_new(tmp).close()  # a fresh regular file: the exporter's open cannot write through a link
    prof.export_chrome_trace(str(tmp))
    publish(tmp, trace_path)
    # Free the profiler's state now, while the process is whole: left to the interpreter's last garbage
    # collection it crashed a 2-rank gloo run at exit (SIGSEGV, torch 2.13 CPU)
    del prof
    gc.collect()
    summary = summarise_trace(json.loads(trace_path.read_text()), wall_s=wall_s)
    summary |= {"rank": rank, "iteration": iteration, "device": str(device), "sync_sites": syncs.rows()}
    write_atomic(folder / f"rank{rank}.json", json.dumps(summary, indent=1) + "\n")
    title = f"Iteration {iteration} on rank {rank} ({device})"
    write_atomic(folder / f"rank{rank}.md", format_summary(summary, title))
