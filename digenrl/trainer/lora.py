"""Which transformer parameters the policy update trains: a LoRA adapter, or everything.

LoRA is injected *in place* with diffusers' ``PeftAdapterMixin.add_adapter`` (peft ``LoraConfig``), so
``flow_model.transformer`` keeps its diffusers class, its ``forward`` signature and its parameter names;
the sampler, FSDP2 and the weight sync keep working on it unchanged. The KL reference policy of FlowGRPO is
the same transformer with the adapter switched off (docs/algorithm.md, "Loss"), so no second copy of the base
weights is held: :func:`reference_policy` disables the adapter for the duration of a ``with`` block.

Defaults follow flow_grpo ``scripts/train_sd3.py``: r = 32, alpha = 64, ``init_lora_weights="gaussian"``
(lora_B starts at zero, so the adapter starts as the identity edit); the default targets are the model
family's ``ModelFamily.lora_targets`` (e.g. the joint-attention projections
``attn.{to_q,to_k,to_v,to_out.0,add_q_proj,add_k_proj,add_v_proj,to_add_out}``, digenrl/models/families/).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import nn

from digenrl.models.fp8 import apply_fp8
from digenrl.models.specs import get_family
from digenrl.runtime.comm.weight_sync import resolve_sync_mode

if TYPE_CHECKING:
    from peft import LoraConfig

    from digenrl.config import Config


ADAPTER_NAME = "default"


def _matches(module_name: str, target: str) -> bool:
    # peft's rule for a list of target names: the full name, or a suffix starting at a dot.
    return module_name == target or module_name.endswith("." + target)


def default_lora_targets(family: str) -> list[str]:
    """The registered model family's default adapter targets (``trainer.lora_targets: null``)."""
    return list(get_family(family).lora_targets)


def check_lora_targets(transformer: nn.Module, targets: list[str], *, each: bool) -> None:
    """User-given targets must each match a Linear (a typo would silently train nothing); the family
    defaults need only match somewhere (a 1-block tiny model lacks e.g. SD3's ``to_add_out``).
    Reads module names only, so start-up validation runs it on a ``meta``-device transformer."""
    linear_names = [n for n, m in transformer.named_modules() if isinstance(m, nn.Linear)]
    hits = {t: any(_matches(n, t) for n in linear_names) for t in targets}
    missing = [t for t, hit in hits.items() if not hit]
    if (each and missing) or not any(hits.values()):
        sample = sorted({n.split(".", 2)[-1] for n in linear_names})[:40]
        raise ValueError(
            f"trainer.lora_targets {missing or targets} match no Linear module of "
            f"{type(transformer).__name__}; module names look like: {', '.join(sample)}"
        )


def lora_parameter_count(transformer: nn.Module, targets: list[str], rank: int) -> int:
    """Parameters of a rank-``rank`` adapter on the Linear modules ``targets`` match: r·(in + out) each
    (lora_A is r×in, lora_B out×r). Shapes only: works on a ``meta``-device transformer."""
    return sum(
        rank * (module.in_features + module.out_features)
        for name, module in transformer.named_modules()
        if isinstance(module, nn.Linear) and any(_matches(name, target) for target in targets)
    )


def lora_config(rank: int, alpha: float, targets: list[str] | tuple[str, ...]) -> LoraConfig:
    """The adapter's peft ``LoraConfig`` (flow_grpo's settings, module docstring): what :func:`apply_lora`
    injects and what an exported adapter declares (digenrl/trainer/lora_export.py)."""
    from peft import LoraConfig

    return LoraConfig(
        r=rank, lora_alpha=alpha, init_lora_weights="gaussian", target_modules=list(targets), lora_dropout=0.0
    )


def apply_lora(
    flow_model: nn.Module,
    *,
    rank: int,
    alpha: float,
    targets: list[str] | None = None,
    adapter_dtype: torch.dtype = torch.float32,
) -> list[nn.Parameter]:
    """Freeze ``flow_model`` and add a trainable LoRA adapter to ``flow_model.transformer`` in place.

    ``targets=None`` takes the family default (``flow_model.spec.family``). Adapter weights are kept in
    ``adapter_dtype`` (fp32) even when the base is bf16, so AdamW updates them at full precision; peft casts
    the adapter input to the adapter dtype and the result back (peft ``lora.Linear.forward``).
    Returns the trainable parameters (the adapter's lora_A / lora_B weights).
    """
    if rank <= 0:
        raise ValueError(f"trainer.lora_rank must be > 0, got {rank}")
    transformer = flow_model.transformer
    if getattr(transformer, "_hf_peft_config_loaded", False):
        raise ValueError(
            f"{type(transformer).__name__} already carries a LoRA adapter; apply_lora once per model"
        )
    if targets is None:
        targets = default_lora_targets(flow_model.spec.family)
        check_lora_targets(transformer, targets, each=False)
    else:
        if not targets:
            raise ValueError("trainer.lora_targets must be null (family default) or a non-empty list")
        check_lora_targets(transformer, list(targets), each=True)
    flow_model.requires_grad_(False)
    transformer.add_adapter(lora_config(rank, alpha, targets), adapter_name=ADAPTER_NAME)
    params = []
    for name, p in transformer.named_parameters():
        if "lora_" in name:
            p.data = p.data.to(adapter_dtype)
            p.requires_grad_(True)
            params.append(p)
        elif p.requires_grad:  # pragma: no cover - peft only ever unfreezes adapter weights
            p.requires_grad_(False)
    if getattr(flow_model, "autocast_dtype", None) is not None:
        flow_model.set_autocast(True)  # the new layers must not cast their input to fp32 under autocast
    return params


def enable_full_finetune(flow_model: nn.Module) -> list[nn.Parameter]:
    """Full fine-tune: every transformer parameter trains; anything else in ``flow_model`` is frozen."""
    flow_model.requires_grad_(False)
    flow_model.transformer.requires_grad_(True)
    return list(flow_model.transformer.parameters())


def has_lora(flow_model: nn.Module) -> bool:
    return bool(getattr(flow_model.transformer, "_hf_peft_config_loaded", False))


@contextmanager
def reference_policy(flow_model: nn.Module) -> Iterator[nn.Module]:
    """Inside the block ``flow_model`` computes the reference policy: the base model, adapter off.

    peft's ``enable_adapters`` re-marks the active adapter as trainable and ``disable`` freezes it
    (peft ``BaseTunerLayer.enable_adapters``), so the exact ``requires_grad`` flags are recorded and put
    back: leaving the block restores the trainer's state whatever it was.
    """
    if not has_lora(flow_model):
        raise ValueError("the KL reference is the adapter-disabled model; it needs trainer.mode=lora")
    transformer = flow_model.transformer
    flags = [(p, p.requires_grad) for p in transformer.parameters()]
    transformer.disable_adapters()
    try:
        yield flow_model
    finally:
        transformer.enable_adapters()
        for p, flag in flags:
            p.requires_grad_(flag)


def prepare_generator_model(flow_model: nn.Module, cfg: Config) -> nn.Module:
    """Give a generator's FlowModel the trainer's trainable structure, without any optimizer state.

    LoRA mode applies the same adapter as ``PolicyTrainer`` (``trainer.lora_rank`` / ``lora_alpha`` /
    ``lora_targets`` via :func:`apply_lora`), so parameter names and shapes match the trainer's by
    construction (what :class:`digenrl.runtime.comm.weight_sync.WeightSync` checks and writes into).
    Everything is frozen (generators never backpropagate) but stays in the module mode the trainer's model is
    in (train): a generator rank must run the forward a colocated rank runs, and it is built in the trainer's
    order (adapter first, then attention kernels / autocast / compile: digenrl/systems/components.py).
    """
    mode = resolve_sync_mode(cfg)
    if mode == "lora" and not has_lora(flow_model):
        tcfg = cfg.trainer
        apply_lora(flow_model, rank=tcfg.lora_rank, alpha=tcfg.lora_alpha, targets=tcfg.lora_targets)
        if cfg.model.fp8:  # as PolicyTrainer: these layers in FP8, so the rollout runs the trainer's forward
            apply_fp8(flow_model)
    flow_model.requires_grad_(False)
    return flow_model
