"""Cost models for what nothing measured, carried from a measured cost file (docs/design.md §5, "Simulator
and planner").

Every table row rests on a measured H200 cost file (``experiments/results/costs/h200-<model>.json``). Where
the table needs a configuration nobody measured, the file is carried there by one of the steps below,
each recorded in ``meta["derivation"]`` and marking ``source = "extrapolated from <device>"``:

* :func:`reshape` — the same model at another shape (Wan2.1-14B measured on a 33-frame clip, the workload
  runs 81 frames): compute-bound times × the ratio of FLOPs per sample counted on the meta device
  (:func:`model_facts`), so the model's *measured* efficiency (fraction of the matmul ceiling) carries
  over; VAE decode × the pixel ratio; activations in the memory peaks × the token ratio; latent bytes
  from the new shape;
* :func:`carry_to_model` — another model with no measurement of its own (HunyuanVideo from Wan2.1-14B):
  the reference's times × the FLOPs ratio (the reference model's efficiency and its measured
  training/forward ratio), the target's parameter, LoRA, text-encoder, VAE and condition sizes;
* :func:`with_cfg_training` — CFG training points derived from the no-CFG ones where only the latter were
  measured: ``algo.cfg_grad=cond`` below ``CFG_SPLIT_MIN_BATCH`` adds one unconditional forward, i.e.
  train_cfg(m) = train(m) + (forward_cfg(m) − forward(m)) with the measured forwards;
* :func:`full_finetune` — full fine-tuning from a LoRA file: the backward also computes every weight
  gradient (one more forward-equivalent of matmuls: train_full(m) = train_lora(m) + forward(m)), gradients
  and AdamW moments in the weights' dtype (16-bit: ``grad_bytes = param_bytes``, ``optimizer_bytes = 2 ×``),
  the whole weights synced, AdamW streaming weights, gradients and moments (≈ 7 × param_bytes over HBM);
* :func:`with_reward_model` — a heavy reward model (a 7 B-parameter vision-language scorer) instead of the
  file's: its weights and a forward of its prompt + image tokens priced at the measured efficiency of the
  file's own transformer.

Times beyond the measured batches follow :meth:`CostModel.train_micro_batch_s` (the measured
training/forward ratio times the measured forward). FLOP counts take seconds per model on the meta
device (cached).
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache
from typing import Any

from digenrl.costs.cost_model import CFG_KEYS, CostModel

LORA_RANK = 32
#: A 7 B-class vision-language reward model (Qwen2.5-VL-7B size: 8.3 B parameters with its vision tower),
#: scoring one image from its vision tokens plus the prompt and template.
HEAVY_REWARD_PARAMS = 8.3e9
HEAVY_REWARD_TOKENS = 600
#: AdamW reads weights, gradients and two moments and writes weights and moments: ≈ 7 passes of the
#: weights' bytes (16-bit states), at the H200's HBM bandwidth (spec sheet,
#: digenrl/runtime/hardware/hardware_profiles/h200-1.yaml).
ADAMW_PASSES = 7
H200_HBM_BYTES_PER_S = 4.8e12


@cache
def component_bytes(model: str) -> dict[str, int]:
    """Bytes of the text encoders and the VAE every rank of a run holds (16-bit, counted on meta)."""
    import torch

    from digenrl.models.construction import instantiate_diffusers_model
    from digenrl.models.specs import get_model_spec
    from digenrl.models.text import TextEncoder

    spec = get_model_spec(model)
    te = TextEncoder.build(spec.text_encoder, device="meta", dtype=torch.bfloat16)
    vae = instantiate_diffusers_model(spec.vae_class, spec.vae_config, device="meta", dtype=torch.bfloat16)

    def nbytes(module: torch.nn.Module) -> int:
        return sum(p.numel() * p.element_size() for p in module.parameters())

    return {"text_encoder_bytes": nbytes(te), "vae_bytes": nbytes(vae)}


@cache
def model_facts(model: str, frames: int | None = None) -> dict[str, Any]:
    """Transformer / VAE FLOPs per sample, parameter counts, LoRA size and latent / condition shapes at the
    model's default resolution (and ``frames``, default the model's), plus :func:`component_bytes`."""
    import torch

    from digenrl.costs.flops import model_flops
    from digenrl.models.flow_model import build_flow_model
    from digenrl.models.specs import get_model_spec
    from digenrl.trainer.lora import default_lora_targets

    spec = get_model_spec(model)
    flow = build_flow_model(spec, device="meta", dtype=torch.bfloat16)
    h, w = spec.default_height, spec.default_width
    frames = (frames or spec.default_frames) if spec.is_video else None
    latent_shape = flow.latent_shape(h, w, frames)
    tokens = flow.token_count(h, w, frames)
    te = spec.text_encoder
    params = sum(p.numel() for p in flow.transformer.parameters())
    targets = default_lora_targets(spec.family)
    lora = sum(
        LORA_RANK * (m.in_features + m.out_features)
        for name, m in flow.transformer.named_modules()
        if isinstance(m, torch.nn.Linear) and any(name == t or name.endswith("." + t) for t in targets)
    )
    counted = model_flops(model, h, w, frames)  # the project's one FLOP count (digenrl/costs/flops.py)
    flops, vae_flops = counted["forward"], counted["vae_decode"]
    latent_numel = math.prod(latent_shape)
    return {
        "params": params,
        "lora_params": lora,
        "tokens": tokens,
        "text_tokens": te.seq_len,
        "forward_flops": int(flops),
        "vae_decode_flops": int(vae_flops),
        "pixels": h * w * (frames or 1),
        "latent_shape": list(latent_shape),
        "latent_bytes": 2 * latent_numel,
        "cond_bytes": 2 * te.seq_len * te.embed_dim
        + 2 * (te.pooled_dim or 0)
        + (te.seq_len if te.uses_mask else 0),
        "guidance_embedded": spec.guidance_embedded,
        "height": h,
        "width": w,
        "frames": frames,
        **component_bytes(model),
    }


def _derived(costs: CostModel, step: str, **changes: Any) -> CostModel:
    """``costs`` with ``changes``, marked extrapolated, ``step`` appended to ``meta["derivation"]``."""
    origin = costs.source.removeprefix("extrapolated from ") if costs.source != "measured" else costs.device
    meta = {**costs.meta, **changes.pop("meta", {})}
    meta["derivation"] = [*costs.meta.get("derivation", []), step]
    return replace(costs, source=f"extrapolated from {origin}", meta=meta, **changes)


def _scale(points: dict[str, dict[int, float]], factor: float) -> dict[str, dict[int, float]]:
    return {flag: {b: t * factor for b, t in pts.items()} for flag, pts in points.items()}


def _activations(peaks: dict[str, dict[int, int]], static: float, new_static: float, factor: float) -> dict:
    """Peaks with the static part replaced and the activations (peak − static) scaled by ``factor``."""
    return {
        flag: {b: int(new_static + max(0.0, v - static) * factor) for b, v in pts.items()}
        for flag, pts in peaks.items()
    }


def _trajectory_bytes(latent: int, cond: int, train_steps: int) -> dict[str, int]:
    """Wire bytes of a sample record and of a unit row (``digenrl.runtime.comm.transfer`` encoding: bf16
    latents, the condition, 4-byte log-prob / sigma / step index / advantage entries)."""
    return {
        "fragment_bytes_per_sample": 2 * train_steps * latent + cond + 16 * train_steps,
        "unit_bytes": 2 * latent + cond + 16,
        "cond_bytes_per_sample": cond,
        "latent_bytes_per_sample": latent,
    }


def reshape(costs: CostModel, frames: int) -> CostModel:
    """``costs`` of a video model measured at ``meta["frames"]`` carried to ``frames`` (module docstring)."""
    measured = model_facts(costs.model, costs.meta.get("frames"))
    target = model_facts(costs.model, frames)
    flops = target["forward_flops"] / measured["forward_flops"]
    pixels = target["pixels"] / measured["pixels"]
    tokens = target["tokens"] / measured["tokens"]
    k = costs.meta.get("train_steps_per_sample") or 1
    return _derived(
        costs,
        f"reshape: {measured['frames']} -> {frames} frames (FLOPs x{flops:.3g}, pixels x{pixels:.3g}, "
        f"tokens x{tokens:.3g})",
        generator_step_points=_scale(costs.generator_step_points, flops),
        train_points=_scale(costs.train_points, flops),
        vae_decode_points={b: t * pixels for b, t in costs.vae_decode_points.items()},
        train_peak_bytes=_activations(costs.train_peak_bytes, costs.param_bytes, costs.param_bytes, tokens),
        generator_peak_bytes=_activations(
            costs.generator_peak_bytes, costs.param_bytes, costs.param_bytes, tokens
        ),
        **_trajectory_bytes(target["latent_bytes"], costs.cond_bytes_per_sample, k),
        meta={
            "frames": frames,
            "latent_shape": target["latent_shape"],
            "forward_flops": target["forward_flops"],
        },
    )


def carry_to_model(reference: CostModel, model: str, frames: int | None = None) -> CostModel:
    """``reference`` (another, measured model) carried to ``model`` at its default resolution and ``frames``
    (None: its default) (module docstring)."""
    ref = model_facts(reference.model, reference.meta.get("frames"))
    target = model_facts(model, frames)
    flops = target["forward_flops"] / ref["forward_flops"]
    pixels = target["pixels"] / ref["pixels"]
    tokens = target["tokens"] / ref["tokens"]
    lora_bytes = 4 * target["lora_params"]  # fp32 adapter
    params = 2 * target["params"]
    cfg_flags = [CFG_KEYS[False]] if target["guidance_embedded"] else list(CFG_KEYS.values())

    def keep(points: dict) -> dict:
        return {flag: pts for flag, pts in points.items() if flag in cfg_flags}

    ref_static = reference.param_bytes
    state = lora_bytes * 4  # adapter + gradients + two AdamW moments
    k = reference.meta.get("train_steps_per_sample") or 1
    return _derived(
        reference,
        f"carry {reference.model} -> {model} (FLOPs x{flops:.3g}, pixels x{pixels:.3g}, "
        f"tokens x{tokens:.3g}; {reference.model}'s measured efficiency and training/forward ratio)",
        model=model,
        generator_step_points=keep(_scale(reference.generator_step_points, flops)),
        train_points=keep(_scale(reference.train_points, flops)),
        vae_decode_points={b: t * pixels for b, t in reference.vae_decode_points.items()},
        train_peak_bytes=keep(_activations(reference.train_peak_bytes, ref_static, params + state, tokens)),
        generator_peak_bytes=keep(_activations(reference.generator_peak_bytes, ref_static, params, tokens)),
        param_bytes=params,
        weight_sync_bytes=lora_bytes,
        grad_bytes=lora_bytes,
        optimizer_bytes=2 * lora_bytes,
        text_encoder_bytes=target["text_encoder_bytes"],
        vae_param_bytes=target["vae_bytes"],
        **_trajectory_bytes(target["latent_bytes"], target["cond_bytes"], k),
        meta={
            "height": target["height"],
            "width": target["width"],
            "frames": target["frames"],
            "latent_shape": target["latent_shape"],
            "forward_flops": target["forward_flops"],
            "reference_model": reference.model,
        },
    )


def with_cfg_training(costs: CostModel) -> CostModel:
    """CFG points derived from the no-CFG ones where only those were measured (module docstring): a CFG
    generator step is one forward of 2B (``Sampler.velocity``), so forward_cfg(B) = forward(2B) and its
    peak that of 2B; CFG training adds one unconditional forward, train_cfg(m) = train(m) +
    (forward_cfg(m) − forward(m)). The file unchanged where it has them."""
    cfg, no_cfg = CFG_KEYS[True], CFG_KEYS[False]
    if (cfg in costs.train_points and costs.has_forward(True)) or no_cfg not in costs.train_points:
        return costs
    steps = []
    changes: dict[str, Any] = {}
    if not costs.has_forward(True):
        forward = {b: costs.generator_step_s(2 * b, False) for b in costs.generator_step_points[no_cfg]}
        changes["generator_step_points"] = {**costs.generator_step_points, cfg: forward}
        if no_cfg in costs.generator_peak_bytes:
            peaks = {b: int(costs.generator_peak(2 * b, False)) for b in costs.generator_peak_bytes[no_cfg]}
            changes["generator_peak_bytes"] = {**costs.generator_peak_bytes, cfg: peaks}
        steps.append("CFG generator step = the no-CFG forward of 2B")
    probe = replace(costs, **changes)
    if cfg not in costs.train_points:
        points = {
            m: t + max(0.0, probe.generator_step_s(m, True) - probe.generator_step_s(m, False))
            for m, t in costs.train_points[no_cfg].items()
        }
        changes["train_points"] = {**costs.train_points, cfg: points}
        if no_cfg in costs.train_peak_bytes:  # the unconditional pass keeps no graph
            changes["train_peak_bytes"] = {**costs.train_peak_bytes, cfg: costs.train_peak_bytes[no_cfg]}
        steps.append("CFG training = no-CFG training + the unconditional forward (cfg_grad=cond)")
    return _derived(costs, "; ".join(steps), **changes)


def full_finetune(costs: CostModel) -> CostModel:
    """A LoRA cost file carried to full fine-tuning of the same model (module docstring)."""
    if costs.meta.get("trainer_mode", "lora") == "full":
        return costs
    weights = costs.param_bytes
    lora_state = costs.weight_sync_bytes + costs.grad_bytes + costs.optimizer_bytes
    full_state = weights + 2 * weights  # gradients + two AdamW moments, 16-bit like the weights
    train = {
        flag: {m: t + costs.generator_step_s(m, flag == CFG_KEYS[True]) for m, t in pts.items()}
        for flag, pts in costs.train_points.items()
    }
    peaks = {
        flag: {m: int(v - lora_state + full_state) for m, v in pts.items()}
        for flag, pts in costs.train_peak_bytes.items()
    }
    return _derived(
        costs,
        "full fine-tune: + one forward of weight gradients per micro-batch, 16-bit gradients and moments",
        train_points=train,
        train_peak_bytes=peaks,
        weight_sync_bytes=weights,
        grad_bytes=weights,
        optimizer_bytes=2 * weights,
        optimizer_step_s=ADAMW_PASSES * weights / H200_HBM_BYTES_PER_S,
        meta={"trainer_mode": "full"},
    )


def efficiency(costs: CostModel) -> float:
    """Measured FLOP/s of the file's transformer forward at its largest measured batch (no CFG)."""
    flag = CFG_KEYS[False]
    batch = max(costs.generator_step_points[flag])
    facts = model_facts(costs.model, costs.meta.get("frames"))
    return batch * facts["forward_flops"] / costs.generator_step_points[flag][batch]


def with_reward_model(costs: CostModel, params: float = HEAVY_REWARD_PARAMS) -> CostModel:
    """``costs`` scored by a VLM-sized reward model of ``params`` parameters (module docstring): the
    registry's ``vlm-judge`` (Qwen2.5-VL-7B) size, priced by FLOPs until ``experiments/gpu/h200_vlm_judge.sh``
    measures it (``measure.py reward --apply-to`` then writes the measured points the same way)."""
    flops_per_image = 2 * params * HEAVY_REWARD_TOKENS
    rate = efficiency(costs)
    points = {b: b * flops_per_image / rate for b in costs.reward_points}
    provenance = {"estimate": f"{params / 1e9:.1f} B parameters, {HEAVY_REWARD_TOKENS} tokens per image"}
    judged = costs.with_reward("vlm-judge (FLOP estimate)", points, int(2 * params), provenance)
    return _derived(
        judged,
        f"reward: a {params / 1e9:.1f} B-parameter VLM judge, {HEAVY_REWARD_TOKENS} tokens per image at "
        f"{rate / 1e12:.0f} TFLOP/s (the transformer's measured rate)",
    )
