"""H200 cost models of the real model sizes, extrapolated from published step costs and FLOP counts.

Until a GPU run writes ``experiments/results/costs/h200-<model>.json`` (``experiments/run_profile.py`` on
an H200), the throughput / scaling / split tables need *some* per-operation costs for FLUX.1-dev,
Qwen-Image, Wan2.1-14B and HunyuanVideo. This module derives them, and marks every result
``extrapolated from h200-published-step-costs``:

* **FLOPs per forward** of each transformer at its default resolution (and frame count), counted with
  ``torch.utils.flop_counter.FlopCounterMode`` on the meta device (shape-only model built from the
  published config, ``digenrl/models/published_specs.py``); matmuls and SDPA attention are counted. If a
  model cannot run on meta, ``2·params·tokens + 4·layers·tokens²·width`` is used instead (the
  transformer-FLOPs rule of Kaplan et al. 2020, arXiv:2001.08361, §2.1, plus attention scores and values).
* **Seconds per FLOP** from the one large-batch H200 measurement we have (docs/design.md §1): SD3.5-medium,
  512², batch 16 = 147 ms → ``c = 0.147 / (16·F_sd3.5)``.
* **Per-forward floor**: a forward never takes less than the measured small-batch time (SD3.5-M 44 ms at
  batch 1 and 4; FLUX.1 123 ms at batch 1, docs/design.md §1). Other models' floor is a power law in the
  parameter count fitted through those two points. So ``t(B) = max(floor, B·F·c)``.
* **CFG** doubles the model batch (``Sampler.velocity``): ``t_cfg(B) = t(2B)``; guidance-distilled models
  (FLUX-dev, HunyuanVideo) have no CFG table.
* **Training** one micro-batch of m units: forward + backward of a LoRA policy ≈ 2 forwards (the
  backward computes activation gradients only, frozen weights get none; ``trainer.activation_checkpointing``
  is off by default so nothing is recomputed; ``algo.kl_beta`` = 0 by default so no reference forward).
* **VAE decode**: decoder FLOPs counted the same way (fallback: the SD3 decoder's FLOPs per output pixel),
  at half the transformer's efficiency (convolutions; an assumption). **Reward**: a CLIP-H-sized scorer
  (PickScore, ~1 B params, 257 tokens), one image per image sample, 8 frames per video.
* **Bytes**: bf16 latents and conditions; LoRA adapter (rank 32 on the family's default targets,
  ``digenrl.trainer.lora``) in fp32 for weight sync and gradients, two fp32 AdamW moments.

Every number here is a first-order estimate, not a measurement: replace the files with measured ones
(``python experiments/run_profile.py --model <m> --device cuda``) as soon as a GPU is available.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

from digenrl.sim.costs import CostModel

#: Published H200 step costs (docs/design.md §1): model → {batch: seconds}; random-weight real-size models,
#: bf16.
PUBLISHED_H200_STEPS: dict[str, dict[int, float]] = {
    "sd3.5-medium": {1: 0.044, 4: 0.044, 16: 0.147},
    "flux.1-dev": {1: 0.123},
}
SOURCE_NOTE = "h200-published-step-costs"
SOURCE = f"extrapolated from {SOURCE_NOTE}"
CALIBRATION_MODEL = "sd3.5-medium"
CALIBRATION_BATCH = 16
CONV_EFFICIENCY = 0.5  # VAE convolutions vs the DiT's matmul efficiency (assumption)
REWARD_PARAMS = 0.99e9  # CLIP ViT-H/14 (PickScore backbone), ~986 M params
REWARD_TOKENS = 257  # 16x16 patches of 224^2 + CLS
REWARD_FRAMES_PER_VIDEO = 8
LORA_RANK = 32
BATCHES = (1, 2, 4, 8, 16, 32, 64)
MICRO_BATCHES = (1, 2, 4, 8, 16)
HOST_DEVICE_GBPS = 51.0  # measured pinned host<->device copy on the H200 (docs/design.md §1)


@cache
def model_facts(model: str) -> dict[str, Any]:
    """Transformer / VAE FLOPs per sample, parameter counts, LoRA size and latent/condition shapes."""
    import torch

    from digenrl.models.construction import instantiate_diffusers_model
    from digenrl.models.flow_model import build_flow_model
    from digenrl.models.specs import get_model_spec
    from digenrl.models.text_condition import TextCondition
    from digenrl.trainer.lora import default_lora_targets

    spec = get_model_spec(model)
    flow = build_flow_model(spec, device="meta", dtype=torch.bfloat16)
    h, w = spec.default_height, spec.default_width
    frames = spec.default_frames if spec.is_video else None
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
    meta = torch.device("meta")
    cond = TextCondition(
        torch.empty(1, te.seq_len, te.embed_dim, device=meta, dtype=torch.bfloat16),
        pooled=None
        if te.pooled_dim is None
        else torch.empty(1, te.pooled_dim, device=meta, dtype=torch.bfloat16),
        mask=torch.ones(1, te.seq_len, device=meta, dtype=torch.bool) if te.uses_mask else None,
    )
    x = torch.empty(1, *latent_shape, device=meta, dtype=torch.bfloat16)
    method = "FlopCounterMode on meta"
    try:
        flops = _count_flops(lambda: flow(x, 0.5, cond))
    except Exception as error:
        layers = _count_blocks(flow.transformer)
        width = _model_width(flow.transformer)
        seq = tokens + te.seq_len
        flops = 2 * params * seq + 4 * layers * seq * seq * width
        method = f"2*N*S + 4*L*S^2*d (meta count failed: {type(error).__name__})"
    pixels = h * w * (frames or 1)
    try:
        vae = instantiate_diffusers_model(spec.vae_class, spec.vae_config, device=meta, dtype=torch.bfloat16)
        z = torch.empty(1, *latent_shape, device=meta, dtype=torch.bfloat16)
        vae_flops = _count_flops(lambda: vae.decode(z))
        vae_method = "FlopCounterMode on meta"
    except Exception as error:
        vae_flops = 0
        vae_method = f"SD3 decoder FLOPs per pixel (meta count failed: {type(error).__name__})"
    latent_numel = math.prod(latent_shape)
    return {
        "params": params,
        "lora_params": lora,
        "tokens": tokens,
        "text_tokens": te.seq_len,
        "forward_flops": int(flops),
        "flops_method": method,
        "vae_decode_flops": int(vae_flops),
        "vae_flops_method": vae_method,
        "pixels": pixels,
        "latent_shape": list(latent_shape),
        "latent_bytes": 2 * latent_numel,
        "cond_bytes": 2 * te.seq_len * te.embed_dim
        + 2 * (te.pooled_dim or 0)
        + (te.seq_len if te.uses_mask else 0),
        "is_video": spec.is_video,
        "guidance_embedded": spec.guidance_embedded,
        "height": h,
        "width": w,
        "frames": frames,
        "num_steps": spec.default_num_steps,
    }


def _count_flops(fn) -> int:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        fn()
    total = counter.get_total_flops()
    if total <= 0:
        raise RuntimeError("no FLOPs counted")
    return int(total)


def _count_blocks(module) -> int:
    import torch

    return sum(1 for m in module.modules() if isinstance(m, torch.nn.ModuleList) for _ in m) or 1


def _model_width(module) -> int:
    config = getattr(module, "config", {})
    heads = config.get("num_attention_heads", 24)
    head_dim = config.get("attention_head_dim", 128)
    return int(heads * head_dim)


def seconds_per_flop() -> float:
    """H200 seconds per DiT FLOP at large batch (SD3.5-M, 147 ms at batch 16, docs/design.md §1)."""
    f = model_facts(CALIBRATION_MODEL)["forward_flops"]
    return PUBLISHED_H200_STEPS[CALIBRATION_MODEL][CALIBRATION_BATCH] / (CALIBRATION_BATCH * f)


def forward_floor_s(model: str) -> float:
    """Smallest time of one forward: measured where published, else a power law in the parameter count
    through SD3.5-M (44 ms) and FLUX.1 (123 ms) at batch 1."""
    if model in PUBLISHED_H200_STEPS:
        return PUBLISHED_H200_STEPS[model][1]
    n0, t0 = model_facts("sd3.5-medium")["params"], PUBLISHED_H200_STEPS["sd3.5-medium"][1]
    n1, t1 = model_facts("flux.1-dev")["params"], PUBLISHED_H200_STEPS["flux.1-dev"][1]
    alpha = math.log(t1 / t0) / math.log(n1 / n0)
    return t0 * (model_facts(model)["params"] / n0) ** alpha


def forward_s(model: str, batch: int) -> float:
    """``max(floor, batch · F · c)`` (module docstring)."""
    facts = model_facts(model)
    return max(forward_floor_s(model), batch * facts["forward_flops"] * seconds_per_flop())


def vae_decode_flops(model: str) -> int:
    facts = model_facts(model)
    if facts["vae_decode_flops"] > 0:
        return facts["vae_decode_flops"]
    ref = model_facts("sd3.5-medium")
    return int(ref["vae_decode_flops"] / ref["pixels"] * facts["pixels"])


def extrapolated_cost_model(model: str, train_steps: int | None = None) -> CostModel:
    """The H200 :class:`CostModel` of ``model`` derived as the module docstring says."""
    facts = model_facts(model)
    c = seconds_per_flop()
    cfg_flags = (False,) if facts["guidance_embedded"] else (False, True)
    gen = {
        ("cfg" if flag else "no_cfg"): {b: forward_s(model, b * (2 if flag else 1)) for b in BATCHES}
        for flag in cfg_flags
    }
    train = {
        ("cfg" if flag else "no_cfg"): {
            m: 2 * forward_s(model, m * (2 if flag else 1)) for m in MICRO_BATCHES
        }
        for flag in cfg_flags
    }
    vae = {b: b * vae_decode_flops(model) * c / CONV_EFFICIENCY for b in BATCHES}
    frames = REWARD_FRAMES_PER_VIDEO if facts["is_video"] else 1
    reward = {b: max(0.005, b * frames * 2 * REWARD_PARAMS * REWARD_TOKENS * c) for b in BATCHES}
    k = train_steps or max(1, int(facts["num_steps"] * 0.99))
    lora_bytes = 4 * facts["lora_params"]
    latent, cond = facts["latent_bytes"], facts["cond_bytes"]
    return CostModel(
        device="h200",
        model=model,
        generator_step_points=gen,
        vae_decode_points=vae,
        reward_points=reward,
        train_points=train,
        optimizer_step_s=0.002 + 4 * lora_bytes / (4.8e12),  # AdamW over params + 2 moments + grads
        weight_sync_bytes=lora_bytes,
        grad_bytes=lora_bytes,
        fragment_bytes_per_sample=2 * k * latent + cond + 16 * k,
        unit_bytes=2 * latent + cond + 16,
        cond_bytes_per_sample=cond,
        latent_bytes_per_sample=latent,
        param_bytes=2 * facts["params"],
        optimizer_bytes=2 * lora_bytes,
        reward_param_bytes=0,
        helper_switch_s=0.001 + 2 * lora_bytes / (HOST_DEVICE_GBPS * 1e9),
        source=SOURCE,
        command="python experiments/run_throughput.py (experiments/extrapolated_costs.py)",
        meta={
            "calibration": (
                "docs/design.md §1 (H200 bf16): SD3.5-M 44 ms @1, 44 @4, 147 @16; FLUX.1 123 ms @1"
            ),
            "implied_dit_tflops": 1e-12 / c,
            "forward_floor_s": forward_floor_s(model),
            **{
                key: facts[key]
                for key in (
                    "params",
                    "lora_params",
                    "tokens",
                    "text_tokens",
                    "forward_flops",
                    "flops_method",
                    "vae_flops_method",
                    "latent_shape",
                    "height",
                    "width",
                    "frames",
                    "num_steps",
                )
            },
        },
    )
