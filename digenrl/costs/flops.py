"""The project's one FLOP count: model FLOPs of a run's iteration, per phase, against a matmul ceiling.

Counting: ``torch.utils.flop_counter.FlopCounterMode`` (matmuls, convolutions, SDPA), :func:`count_flops`,
which the benchmarks (``digenrl/perf/roofline.py``), the cost extrapolation
(``digenrl/costs/extrapolation.py``) and the runs use alike. A run's model counts, once per (model,
resolution): one transformer forward of one sample (``forward``) and one VAE decode of one sample
(``vae_decode``), on the ``meta`` device (shapes only, no memory, no time on the GPU).

An iteration's model FLOPs (:func:`iteration_flops`), by phase, in the model-FLOPs convention (PaLM,
Chowdhery et al. 2022, appendix B: a full backward costs two forwards, activation and weight gradients;
recomputation, optimiser and elementwise work are not model FLOPs):

* rollout: samples x ``sampler.num_steps`` forwards, twice with true CFG (the unconditional pass);
* score: samples x one VAE decode (the reward model is not counted: each reward is its own model);
* train: per trained unit (one sample at one trained step) a forward and its backward: 3 forwards for full
  fine-tuning, 2 for LoRA (its backward computes the activation gradients of the frozen layers, one
  forward of matmul work, and the adapters' weight gradients, negligible at rank r << width); plus, with
  true CFG, the unconditional pass: one no-graph forward (``algo.cfg_grad=cond``) or a second forward and
  backward (``both``);
* optimizer, sync: 0 (no matmul work; their seconds still count against the loop).

(Before issue 33 a LoRA backward was counted as two forwards too, so a LoRA training phase's fraction of
the bound read high by up to 4/3; loop reports written before then carry that count.)

The loop's fraction of its bound = model FLOPs / (seconds x ceiling): per iteration over ``wall_s`` and the
GPUs the run occupies, per phase over the device-seconds its spans took (``phase_seconds``, summed over
ranks; :func:`digenrl.runtime.observe.metrics.fractions_by_phase`). The ceiling is the profile's measured bf16
matmul rate (``gpu_types.<type>.measured_bf16_tflops``: an 8192³ ``torch.matmul``, as
:func:`digenrl.perf.roofline.matmul_ceiling` measures it); a device without a measured ceiling (every CPU
profile: their numbers are planning placeholders) gets FLOPs but no fraction, with the reason
(:func:`loop_ceiling`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any


def count_flops(fn: Callable[[], object], *, no_grad: bool = False) -> int:
    """FLOPs ``fn`` issues (forward and, if it runs one, backward), by ``FlopCounterMode``."""
    import contextlib

    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad() if no_grad else contextlib.nullcontext(), counter:
        fn()
    return int(counter.get_total_flops())


@cache
def model_flops(
    model: str, height: int, width: int, frames: int | None = None, text_tokens: int | None = None
) -> dict[str, int]:
    """FLOPs of one transformer forward and one VAE decode of one sample of ``model`` at that size (meta).
    ``text_tokens``: a forward of that many real text tokens with the padding cut and no mask (a masked
    encoder's row under ``model.text_padding=split``); default the encoder's full length."""
    import torch

    from digenrl.data.text_condition import TextCondition
    from digenrl.models.construction import instantiate_diffusers_model
    from digenrl.models.flow_model import build_flow_model
    from digenrl.models.specs import get_family, get_model_spec

    spec = get_model_spec(model)
    meta, dtype = torch.device("meta"), torch.bfloat16
    flow = build_flow_model(spec, device=meta, dtype=dtype)
    latent_shape = flow.latent_shape(height, width, frames)
    te = spec.text_encoder
    length = te.seq_len if text_tokens is None else text_tokens
    cond = TextCondition(
        torch.empty(1, length, te.embed_dim, device=meta, dtype=dtype),
        pooled=None if te.pooled_dim is None else torch.empty(1, te.pooled_dim, device=meta, dtype=dtype),
        mask=torch.ones(1, length, device=meta, dtype=torch.bool)
        if te.uses_mask and text_tokens is None
        else None,
    )
    x = torch.empty(1, *latent_shape, device=meta, dtype=dtype)
    forward = count_flops(lambda: flow(x, 0.5, cond), no_grad=True)
    vae = instantiate_diffusers_model(spec.vae_class, spec.vae_config, device=meta, dtype=dtype)
    # the family's decode call, as LatentDecoder makes it (Qwen-Image's 5-D VAE decodes an image as one frame)
    vae_decode = get_family(spec.family).vae_decode
    decode = count_flops(lambda: vae_decode(vae, x), no_grad=True)
    if forward <= 0:
        raise RuntimeError(f"no FLOPs counted for a forward of {model}")
    return {"forward": forward, "vae_decode": decode}


@cache
def text_forward_flops(model: str, height: int, width: int, frames: int | None = None) -> tuple[float, ...]:
    """``(a, b, c)`` with a forward of ``L`` real text tokens (padding cut) costing ``a + b·L + c·L²`` FLOPs:
    the linears and norms of the text stream are linear in ``L``, joint attention over image + text tokens
    quadratic, so three counted forwards (1, half and all of the encoder's length) give the curve exactly.
    A batch's mean forward then needs only the mean of ``L`` and of ``L²`` over its rows."""
    from digenrl.models.specs import get_model_spec

    n = get_model_spec(model).text_encoder.seq_len
    points = [1, max(2, n // 2), n]
    if len(set(points)) < 3:
        raise ValueError(f"{model}: a text length of {n} tokens gives no quadratic fit")
    ys = [float(model_flops(model, height, width, frames, text_tokens=x)["forward"]) for x in points]
    (x0, x1, x2), (y0, y1, y2) = points, ys
    # Newton's divided differences: y = y0 + d1 (x - x0) + d2 (x - x0)(x - x1)
    d1 = (y1 - y0) / (x1 - x0)
    d2 = ((y2 - y1) / (x2 - x1) - d1) / (x2 - x0)
    return (y0 - d1 * x0 + d2 * x0 * x1, d1 - d2 * (x0 + x1), d2)


def iteration_flops(
    counts: dict[str, int],
    *,
    samples: int,
    train_units: float,
    num_steps: int,
    true_cfg: bool,
    cfg_grad: str,
    trainer_mode: str,
) -> dict[str, float]:
    """Model FLOPs of one iteration by phase (module docstring) and their ``total``; ``trainer_mode``:
    ``lora`` or ``full`` (what a backward computes). ``counts["forward_uncond"]``, where given, is the
    unconditional pass's forward (the empty prompt's text with the padding cut), else ``forward``."""
    if trainer_mode not in ("lora", "full"):
        raise ValueError(f"trainer_mode must be 'lora' or 'full', got {trainer_mode!r}")
    forward = counts["forward"]
    uncond = counts.get("forward_uncond", forward)

    def backward(f: float) -> float:
        return 2 * f if trainer_mode == "full" else f

    rollout = samples * num_steps * (forward + (uncond if true_cfg else 0))
    unit = forward + backward(forward)
    if true_cfg:
        unit += uncond + backward(uncond) if cfg_grad == "both" else uncond
    out = {
        "rollout": float(rollout),
        "score": float(samples * counts["vae_decode"]),
        "train": float(train_units * unit),
        "optimizer": 0.0,
        "sync": 0.0,
    }
    out["total"] = sum(out.values())
    return out


def loop_ceiling(profile: Any, device_type: str, device: Any = None) -> tuple[float | None, str]:
    """(ceiling in TFLOP/s or None, where it comes from / why there is none) for a run on ``device_type``
    with hardware profile ``profile``. ``device`` (a
    :class:`~digenrl.runtime.hardware.profiles.DetectedDevice`): the real device, whose own measured ceiling
    counts where it is not the profile's (a run with ``runtime.allow_profile_mismatch``)."""
    from digenrl.runtime.hardware.profiles import known_device_type, type_matches

    gpu = profile.device_type(0)
    if device_type != "cuda":
        return None, (
            f"the run computes on a {device_type} device, which has no measured matmul ceiling (the CPU "
            "profiles' numbers are planning placeholders)"
        )
    if device is not None and not type_matches(gpu.name, device.family):
        known = known_device_type(device.family)
        if known is None or known[0].measured_bf16_tflops is None:
            return None, f"no shipped profile has a measured matmul ceiling for the run's {device.name}"
        real, _, source = known
        return float(real.measured_bf16_tflops), (
            f"profile {source}, {real.name} measured bf16 matmul (the run's device; profile {profile.name} "
            "describes another)"
        )
    if gpu.measured_bf16_tflops is None:
        return None, (
            f"profile {profile.name} has no measured matmul ceiling for {gpu.name} "
            "(gpu_types.<type>.measured_bf16_tflops)"
        )
    return float(gpu.measured_bf16_tflops), f"profile {profile.name}, {gpu.name} measured bf16 matmul"
