"""Attention kernels side by side at the zoo models' joint-attention shapes: every diffusers attention backend
this machine can run, forward and forward + backward, against a matmul ceiling measured in the same run.

    python experiments/measure.py attention --device cpu                 # tiny shapes, CPU kernels (a check)
    python experiments/measure.py attention --out runs/attention          # on a GPU: the models' shapes

Why: the loops' profiles (experiments/results/gpu/loops/) put a fifth to a third of the device time in
attention, and the backend is a setting (``model.attention_backend`` and the safety table of
:mod:`digenrl.models.attention_safety`), so the choice should come from a measurement at the shapes the
models run, not from a kernel's reputation.

Cases (``--cases``; on a CPU the ``tiny*`` ones): the joint (text ++ image) self-attention of one block at
512², diffusers' (batch, sequence, heads, head dim) layout, bf16 on a GPU:

* ``sd35``: SD3.5-medium, 24 heads of 64, 1024 image + 333 text tokens, no mask;
* ``flux``: FLUX.1-dev, 24 heads of 128, 1024 + 512 tokens, no mask;
* ``qwen-padded``: Qwen-Image as the zoo runs it: the text padded to 512 tokens and masked (key padding,
  prompt lengths drawn in [16, 128]);
* ``qwen-bucketed``: the same prompts with the text cut to the batch's longest prompt (128 tokens, still
  masked): what bucketing prompts by length would run;
* ``qwen-packed``: the same length without a mask: what equal-length buckets (or packing) would run.

Backends (``--backends``, default every one diffusers knows that can run here): ``native`` (torch SDPA with
torch's own kernel choice: cuDNN first on Hopper since torch 2.11), ``_native_cudnn``, ``_native_flash``,
``_native_efficient``, ``_native_math`` (CPU only by default), ``flex`` (diffusers' FlexAttention backend
under ``torch.compile``, a key-padding ``BlockMask`` for masked cases, so fully padded key blocks are
skipped), the kernel-package backends (``flash``, ``_flash_3``, ``sage``, ``xformers``: reported as
unavailable with diffusers' reason when their package is missing), and ``current``: ``native`` with cuDNN
SDPA on or off as :func:`~digenrl.models.attention_safety.select_attention_backend` decides for this shape
and direction (what a run executes today).

Per row: median ms over ``--iters`` after ``--warmup`` (CUDA events), the dense FLOPs of the shape
(4·B·H·Sq·Skv·D forward; forward + backward 3.5× that, the FlashAttention papers' convention of a backward
of 2.5 forwards), TFLOP/s and the fraction of the measured matmul ceiling, and the numerics: relative L2
error ‖x − ref‖ / ‖ref‖ of the output (and of dq, dk, dv) against float32 math attention on upcast copies
of the first two samples. A row is ``ok`` when every error is under ``--tolerance`` (bf16 kernels land
between 1e-3 and 1e-2; NaN never passes). The fastest ok row per case and direction is the winner.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
import traceback
from dataclasses import asdict, dataclass

import torch

from digenrl.data.dtypes import TORCH_DTYPES
from digenrl.models.attention_safety import AttentionShape, select_attention_backend
from digenrl.perf import bench_cli, roofline
from digenrl.perf.bench_cli import fmt, name_list, output_paths

DIRECTIONS = ("forward", "forward+backward")
#: forward + backward FLOPs over forward FLOPs (FlashAttention-2 paper, section 4: backward = 2.5 forwards)
FWD_BWD_FACTOR = 3.5
CURRENT = "current"
#: samples whose output and gradients are checked against float32 math attention
REF_SAMPLES = 2
#: backends tried by default, in this order (``current`` first: the reference every other row is read against)
GPU_BACKENDS = (
    CURRENT,
    "native",
    "_native_cudnn",
    "_native_flash",
    "_native_efficient",
    "flex",
    "flash",
    "_flash_3",
    "sage",
    "xformers",
)
CPU_BACKENDS = (CURRENT, "native", "_native_math", "flex")
#: backends that take no attention mask (diffusers raises for one)
NO_MASK_BACKENDS = frozenset({"_native_flash", "flash", "_flash_3", "sage"})


@dataclass(frozen=True)
class AttentionCase:
    """One joint-attention call: ``text`` tokens (the first ``text_lengths`` of each sample valid when
    ``masked``) before ``image`` tokens, ``heads`` heads of ``head_dim``."""

    name: str
    model: str
    batch: int
    heads: int
    head_dim: int
    image: int
    text: int
    masked: bool = False
    max_prompt: int = 0  # masked: prompt lengths are drawn in [min(16, max_prompt), max_prompt]

    @property
    def seq(self) -> int:
        return self.image + self.text

    def forward_flops(self) -> int:
        return 4 * self.batch * self.heads * self.seq * self.seq * self.head_dim


CASES = {
    c.name: c
    for c in (
        AttentionCase("sd35", "sd3.5-medium", 16, 24, 64, 1024, 333),
        AttentionCase("flux", "flux.1-dev", 8, 24, 128, 1024, 512),
        AttentionCase("qwen-padded", "qwen-image", 8, 24, 128, 1024, 512, masked=True, max_prompt=128),
        AttentionCase("qwen-bucketed", "qwen-image", 8, 24, 128, 1024, 128, masked=True, max_prompt=128),
        AttentionCase("qwen-packed", "qwen-image", 8, 24, 128, 1024, 128),
        AttentionCase("tiny", "tiny-sd3", 2, 2, 8, 16, 8),
        AttentionCase("tiny-masked", "tiny-qwen", 2, 2, 8, 16, 8, masked=True, max_prompt=6),
    )
}
GPU_CASES = ("sd35", "flux", "qwen-padded", "qwen-bucketed", "qwen-packed")
CPU_CASES = ("tiny", "tiny-masked")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="experiments/measure.py attention",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--cases", default="auto", help=f"comma-separated of {','.join(CASES)}; auto: by device")
    p.add_argument("--backends", default="auto", help="comma-separated diffusers backend names or 'current'")
    p.add_argument("--directions", default=",".join(DIRECTIONS), help="forward, forward+backward or both")
    p.add_argument("--batch", type=int, default=None, help="override every case's batch")
    p.add_argument("--tolerance", type=float, default=2e-2, help="largest relative error of an ok row")
    bench_cli.add_device_flags(p, dtype_help="auto: bfloat16 on cuda else float32")
    bench_cli.add_timing_flags(
        p, warmup=3, iters=10, warmup_help="untimed calls per row", iters_help="timed calls per row (median)"
    )
    bench_cli.add_report_flags(p, skipped="rows")
    args = p.parse_args(argv)
    bench_cli.check_timing(args, p)
    args.directions = name_list(args.directions, "--directions", DIRECTIONS, p)
    if args.cases != "auto":
        args.cases = name_list(args.cases, "--cases", tuple(CASES), p)
    if args.backends != "auto":
        from digenrl.models.flow_model import available_attention_backends

        args.backends = name_list(args.backends, "--backends", (CURRENT, *available_attention_backends()), p)
    if args.batch is not None and args.batch < 1:
        p.error("--batch must be >= 1")
    if not args.tolerance > 0:
        p.error("--tolerance must be > 0")
    return args


class Inputs:
    """q, k, v (and the output gradient) of a case, drawn once; the key-padding mask of a masked case as a
    (batch, 1, 1, seq) bool tensor (SDPA backends; diffusers' math backend takes no 2-D mask) and as
    FlexAttention ``BlockMask`` objects (:meth:`block_mask`)."""

    def __init__(self, case: AttentionCase, device: torch.device, dtype: torch.dtype, seed: int = 0) -> None:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        shape = (case.batch, case.seq, case.heads, case.head_dim)
        self.q, self.k, self.v, self.grad = (
            torch.randn(shape, generator=gen).to(device=device, dtype=dtype) for _ in range(4)
        )
        self.case, self.device = case, device
        self.mask: torch.Tensor | None = None
        self.lengths: torch.Tensor | None = None
        self._block_masks: dict[int, object] = {}
        if case.masked:
            low = min(16, case.max_prompt)
            self.lengths = torch.randint(low, case.max_prompt + 1, (case.batch,), generator=gen).to(device)
            positions = torch.arange(case.seq, device=device)
            # text first (the padded tail of each prompt masked), then every image token
            keys = (positions[None, :] < self.lengths[:, None]) | (positions[None, :] >= case.text)
            self.mask = keys[:, None, None, :]

    def block_mask(self, samples: int | None = None):
        """The key-padding ``BlockMask`` of the first ``samples`` samples (all by default); built once."""
        samples = samples or self.case.batch
        if samples not in self._block_masks:
            from torch.nn.attention.flex_attention import create_block_mask

            lengths, text = self.lengths[:samples], self.case.text

            def key_padding(b, h, q_idx, kv_idx):
                return (kv_idx < lengths[b]) | (kv_idx >= text)

            seq = self.case.seq
            self._block_masks[samples] = create_block_mask(
                key_padding, samples, None, seq, seq, device=str(self.device)
            )
        return self._block_masks[samples]


def attention_fn(backend: str, inputs: Inputs, *, compiled: bool, samples: int | None = None):
    """``f(q, k, v) -> out`` through diffusers' dispatcher with ``backend`` over the first ``samples`` samples
    (the mask is cut to them; all by default). ``flex`` is compiled: eager FlexAttention is a slow reference
    path, and the models run it inside compiled blocks."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    mask = None
    if inputs.mask is not None:
        mask = inputs.block_mask(samples) if backend == "flex" else inputs.mask[:samples]

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return dispatch_attention_fn(q, k, v, attn_mask=mask, backend=backend)

    return torch.compile(fn, dynamic=False) if compiled else fn


def current_choice(case: AttentionCase, device: torch.device, needs_backward: bool) -> dict:
    """What a run does today for this shape: ``native`` and whether cuDNN SDPA stays on (the safety table);
    the process-wide cuDNN switch the selection may flip is restored."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        choice = select_attention_backend(
            "native",
            needs_backward=needs_backward,
            device=device,
            shape=AttentionShape(case.head_dim, case.masked),
        )
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
    on_gpu = device.type == "cuda"
    return {"backend": choice.backend, "cudnn_sdp": not choice.disable_cudnn_sdp if on_gpu else None}


@contextlib.contextmanager
def cudnn_sdp(enabled: bool):
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(enabled)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def reference(inputs: Inputs, samples: int = REF_SAMPLES) -> dict[str, torch.Tensor]:
    """Float32 math attention on upcast copies of the first ``samples`` samples: output and q/k/v grads."""
    q, k, v, grad = (t[:samples].detach().float().requires_grad_(t is not inputs.grad) for t in _qkvg(inputs))
    mask = None if inputs.mask is None else inputs.mask[:samples]
    out = torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask
    ).transpose(1, 2)
    out.backward(grad)
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _qkvg(inputs: Inputs) -> tuple[torch.Tensor, ...]:
    return inputs.q, inputs.k, inputs.v, inputs.grad


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """‖x − ref‖ / ‖ref‖ in float64 (NaN when x has a NaN or inf)."""
    x, ref = x.double(), ref.double()
    if not torch.isfinite(x).all():
        return math.nan
    return float(torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30))


def check_numerics(
    fn, inputs: Inputs, ref: dict[str, torch.Tensor], samples: int = REF_SAMPLES
) -> dict[str, float]:
    """Relative errors of ``fn`` (built for the first ``samples`` samples) against ``ref``: its output, and
    with gradients in ``ref`` its dq, dk, dv. A NaN anywhere gives a NaN error, which never passes."""
    grads = "dq" in ref
    q, k, v = (t[:samples].detach().clone().requires_grad_(grads) for t in (inputs.q, inputs.k, inputs.v))
    out = fn(q, k, v)
    errors = {"out": relative_error(out.detach(), ref["out"])}
    if grads:
        out.backward(inputs.grad[:samples])
        errors.update(
            {name: relative_error(t.grad, ref[name]) for name, t in (("dq", q), ("dk", k), ("dv", v))}
        )
    return errors


def run_row(
    case: AttentionCase,
    backend: str,
    direction: str,
    inputs: Inputs,
    ref: dict[str, torch.Tensor],
    device: torch.device,
    args: argparse.Namespace,
    ceiling_tflops: float | None,
) -> dict:
    row: dict = {"case": case.name, "backend": backend, "direction": direction}
    needs_backward = direction == "forward+backward"
    kernel = backend
    cudnn_on = torch.backends.cuda.cudnn_sdp_enabled()
    if backend == CURRENT:
        choice = current_choice(case, device, needs_backward)
        kernel, cudnn_on = choice["backend"], choice["cudnn_sdp"]
        row["current"] = choice
    if case.masked and kernel in NO_MASK_BACKENDS:
        row["skipped"] = "takes no attention mask"
        return row
    problem = _unavailable(kernel, device)
    if problem:
        row["skipped"] = problem
        return row
    compiled = kernel == "flex"
    fn = attention_fn(kernel, inputs, compiled=compiled)
    q, k, v = (t.detach().clone().requires_grad_(needs_backward) for t in (inputs.q, inputs.k, inputs.v))

    def call() -> None:
        out = fn(q, k, v)
        if needs_backward:
            out.backward(inputs.grad)

    with cudnn_sdp(cudnn_on) if device.type == "cuda" else contextlib.nullcontext():
        head = attention_fn(kernel, inputs, compiled=compiled, samples=REF_SAMPLES)
        row["errors"] = check_numerics(head, inputs, ref if needs_backward else {"out": ref["out"]})
        roofline.reset_peak_memory(device)
        row["first_call_s"] = roofline.timed_first_call_s(call, device)
        times = roofline.time_calls_ms(call, device, warmup=args.warmup, iters=args.iters)
    stats = roofline.summarize_ms(times)
    flops = case.forward_flops() * (FWD_BWD_FACTOR if needs_backward else 1)
    row.update(
        ms=stats["ms"],
        ms_min=stats["ms_min"],
        ms_max=stats["ms_max"],
        flops=flops,
        tflops=flops / (stats["ms"] / 1e3) / 1e12,
        peak_mem_gib=roofline.peak_memory_gib(device),
        cudnn_sdp=cudnn_on if device.type == "cuda" else None,
    )
    if ceiling_tflops:
        row["fraction_of_ceiling"] = row["tflops"] / ceiling_tflops
    worst = max(row["errors"].values())
    row["ok"] = bool(worst < args.tolerance)  # NaN compares False
    return row


def _unavailable(backend: str, device: torch.device) -> str | None:
    """Why ``backend`` cannot run here (None: it can): a GPU-only backend on a CPU, or diffusers' own
    requirement check (its kernel package missing: flash-attn, flash-attn 3, sageattention, xformers)."""
    from digenrl.models.attention_safety import CPU_BACKENDS as CPU_OK
    from digenrl.models.attention_safety import _requirement_problem

    if device.type != "cuda" and backend not in CPU_OK and backend != "flex":
        return f"needs a CUDA device, this is {device.type}"
    if backend == "_native_math" and device.type == "cuda":
        return None
    problem = _requirement_problem(backend)
    if problem and backend in ("_flash_3", "_flash_varlen_3"):
        problem += " (FlashAttention 3 has no PyPI wheel for torch 2.11 / CUDA 13; building it was not tried)"
    return problem


def winners(rows: list[dict]) -> dict[str, dict[str, str]]:
    """Per case and direction: the fastest ``ok`` row's backend and its speed-up over ``current``."""
    out: dict[str, dict[str, str]] = {}
    for row in rows:
        if not row.get("ok"):
            continue
        best = out.setdefault(row["case"], {}).get(row["direction"])
        if best is None or row["ms"] < best["ms"]:
            out[row["case"]][row["direction"]] = {"backend": row["backend"], "ms": row["ms"]}
    for case, by_direction in out.items():
        for direction, best in by_direction.items():
            current = next(
                (r for r in rows if (r["case"], r["direction"], r["backend"]) == (case, direction, CURRENT)),
                None,
            )
            if current and current.get("ms"):
                best["speedup_over_current"] = current["ms"] / best["ms"]
    return out


def run(args: argparse.Namespace) -> dict:
    device = roofline.resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype_name = bench_cli.resolve_dtype(args.dtype, device)
    dtype = TORCH_DTYPES[dtype_name]
    cases = args.cases if args.cases != "auto" else (GPU_CASES if device.type == "cuda" else CPU_CASES)
    backends = (
        args.backends
        if args.backends != "auto"
        else (GPU_BACKENDS if device.type == "cuda" else CPU_BACKENDS)
    )
    report: dict = {
        "device": str(device),
        "device_name": roofline.device_description(device),
        "dtype": dtype_name,
        "environment": roofline.environment(),
        "argv": sys.argv[1:] if args.out else [],
        "warmup": args.warmup,
        "iters": args.iters,
        "tolerance": args.tolerance,
        "fwd_bwd_factor": FWD_BWD_FACTOR,
        "cases": {},
        "results": [],
    }
    ceiling_n = (
        args.ceiling_size if args.ceiling_size is not None else (8192 if device.type == "cuda" else 256)
    )
    ceiling = None
    if ceiling_n > 0 and not args.no_flops:
        report["ceiling"] = roofline.matmul_ceiling(device, dtype, n=ceiling_n)
        ceiling = report["ceiling"]["tflops"]
        print(f"# matmul ceiling {ceiling_n}^3 {dtype_name}: {ceiling:.1f} TFLOP/s", flush=True)
    t_start = time.perf_counter()
    prepared: dict[str, tuple[AttentionCase, Inputs, dict[str, torch.Tensor]]] = {}
    for name in cases:
        case = CASES[name]
        if args.batch is not None:
            case = AttentionCase(**{**asdict(case), "batch": args.batch})
        report["cases"][name] = {**asdict(case), "seq": case.seq, "forward_flops": case.forward_flops()}
        inputs = Inputs(case, device, dtype)
        prepared[name] = (case, inputs, reference(inputs))
    # compiled backends (flex) last: their compilation per shape and direction costs tens of seconds, and a
    # time budget should cut those rows, not the plain kernels of the later cases
    tasks = [(n, d, b) for n in cases for d in args.directions for b in backends]
    tasks.sort(key=lambda task: task[2] == "flex")
    for name, direction, backend in tasks:
        case, inputs, ref = prepared[name]
        if args.time_budget_s and time.perf_counter() - t_start > args.time_budget_s:
            row = {"case": name, "backend": backend, "direction": direction, "skipped": "time budget"}
        else:
            try:
                row = run_row(case, backend, direction, inputs, ref, device, args, ceiling)
            except Exception as exc:  # one kernel failing must not lose the others' rows
                traceback.print_exc()
                row = {"case": name, "backend": backend, "direction": direction}
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        report["results"].append(row)
        print(format_row(row), flush=True)
        report["winners"] = winners(report["results"])
        _write(report, args)
    report["total_s"] = time.perf_counter() - t_start
    _write(report, args)
    return report


def format_row(row: dict) -> str:
    head = f"{row['case']:<14} {row['direction']:<17} {row['backend']:<18}"
    if "ms" not in row:
        return head + " " + str(row.get("skipped", row.get("error", "-")))[:100]
    errors = " ".join(f"{k}={v:.1e}" for k, v in row["errors"].items())
    frac = fmt(row.get("fraction_of_ceiling"), ".2f")
    verdict = "ok" if row["ok"] else "BAD"
    return f"{head} {row['ms']:8.3f} ms {row['tflops']:7.1f} TFLOP/s ({frac}) {verdict} {errors}"


def format_markdown(report: dict) -> str:
    ceiling = report.get("ceiling", {}).get("tflops")
    lines = [
        f"# Attention kernels on {report['device_name']} ({report['dtype']})",
        "",
        f"Versions: {report['environment']}. Matmul ceiling: {fmt(ceiling, '.1f')} TFLOP/s. "
        f"FLOPs: 4·B·H·S²·D forward, ×{report['fwd_bwd_factor']} forward + backward. Errors: relative L2 "
        f"against float32 math attention (first 2 samples), ok under {report['tolerance']}.",
        "",
        "| case | B × S × H × D | direction | backend | ms | TFLOP/s | of ceiling | max rel. error | ok |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["results"]:
        c = report["cases"][row["case"]]
        shape = (
            f"{c['batch']} × {c['seq']}{' (masked)' if c['masked'] else ''} × {c['heads']} × {c['head_dim']}"
        )
        name = row["backend"]
        if "current" in row and row["current"]["cudnn_sdp"] is not None:
            name += f" (native, cuDNN {'on' if row['current']['cudnn_sdp'] else 'off'})"
        if "ms" not in row:
            why = str(row.get("skipped", row.get("error", "-")))[:90].replace("|", "/")
            lines.append(f"| {row['case']} | {shape} | {row['direction']} | {name} | {why} | | | | |")
            continue
        worst = max(row["errors"].values())
        lines.append(
            f"| {row['case']} | {shape} | {row['direction']} | {name} | {row['ms']:.3f} | "
            f"{row['tflops']:.1f} | {fmt(row.get('fraction_of_ceiling'), '.2f')} | {worst:.1e} | "
            f"{'yes' if row['ok'] else '**no**'} |"
        )
    lines += ["", "| case | direction | fastest ok backend | ms | × current |", "|---|---|---|---|---|"]
    for case, by_direction in report.get("winners", {}).items():
        for direction, best in by_direction.items():
            lines.append(
                f"| {case} | {direction} | {best['backend']} | {best['ms']:.3f} | "
                f"{fmt(best.get('speedup_over_current'), '.2f')} |"
            )
    return "\n".join(lines)


def _write(report: dict, args: argparse.Namespace) -> None:
    if not args.out:
        return
    json_path, md_path = output_paths(args.out, "attention", "kernels")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2, default=str))
    md_path.write_text(format_markdown(report) + "\n")


def main(argv: list[str] | None = None) -> int:
    report = run(parse_args(argv))
    print(format_markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
