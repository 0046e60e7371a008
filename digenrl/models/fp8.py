"""FP8 matmuls for the frozen base weights of a LoRA-trained transformer (``model.fp8``).

A LoRA run never updates the base weights, so their matmuls can run in float8 on Hopper-class tensor cores
while the adapter (lora_A / lora_B, fp32 master weights) and everything outside the repeated blocks stays
in 16-bit. The conversion is torchao's float8 *training* path, :func:`torchao.float8.
convert_to_float8_training` (``Float8Linear``: dynamic scaling, differentiable, built for ``torch.compile``),
so the backward through a frozen base layer (the activation gradient the adapters below it need) is FP8 too.
torchao's backward also computes the weight's gradient, unused for a frozen weight: eager mode computes and
discards it; compiled, AOTAutograd traces gradients only for inputs that require them, so that GEMM is
expected to be dead code (not verified in a profile). FP8 is a compiled-GPU feature.

Why the *rowwise* recipe (``Float8LinearConfig.from_recipe_name("rowwise")``, torchao float8 README): each
activation row (one token of one sample) gets its own scale, and each weight row its own. A token's result
then does not depend on which other samples share its batch, exactly as in bf16. With tensorwise scaling one
outlier token would rescale every token of the batch, and the rollout (CFG rows batched, 32 rows) and the
trainer (conditional rows, micro-batches of 16) would quantise the same token differently: the on-policy
ratio would drift from 1 by the quantisation noise. Rollout and training run the same converted modules
(a separate generator converts its copy in the same order, :func:`digenrl.trainer.lora.
prepare_generator_model`), so their log-probs agree as in bf16.

What is converted: every ``nn.Linear`` inside the transformer's repeated blocks whose dimensions are
multiples of 16 (``torch._scaled_mm``'s requirement), except the adapter's own layers and the modulation
projections (AdaLN ``norm*.linear`` of any ``*AdaLayerNorm*`` class, Qwen-Image's ``img_mod`` / ``txt_mod``:
one vector per sample, no speed to gain, and their output scales every token of the sample). Parameter
names are unchanged (``Float8Linear`` keeps ``weight`` / ``bias``), so checkpoints, weight sync and LoRA
export see the same state dict.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING

from torch import nn

from digenrl.models.optimize import repeated_blocks

if TYPE_CHECKING:
    from digenrl.models.flow_model import FlowModel

log = logging.getLogger(__name__)

#: torchao's float8 recipe: per-row scales for activations, weights and gradients (see the module docstring)
FP8_RECIPE = "rowwise"
_ADAPTER_PARTS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector")


def require_torchao(key: str = "model.fp8") -> None:
    """Fail at startup, naming the key, when torchao's float8 training path cannot be imported."""
    try:
        importlib.import_module("torchao.float8")
    except ImportError as exc:
        raise ImportError(
            f"{key}=true needs torchao's float8 training (torchao.float8): pip install -e '.[fp8]' "
            f"(torchao>=0.18); import failed: {exc}"
        ) from exc


def _is_modulation(path: list[nn.Module], names: list[str]) -> bool:
    """An adaptive-norm / modulation projection: inside an ``*AdaLayerNorm*`` module (diffusers'
    ``AdaLayerNormZero``, SD3.5's ``SD35AdaLayerNormZeroX``, ...) or a ``*_mod`` container (Qwen-Image)."""
    return any("AdaLayerNorm" in type(m).__name__ for m in path) or any(n.endswith("_mod") for n in names)


def fp8_targets(transformer: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute, linear) of every layer :func:`apply_fp8` converts (the module docstring's rule)."""
    targets = []
    for block in repeated_blocks(transformer):
        stack: list[tuple[nn.Module, list[nn.Module], list[str]]] = [(block, [], [])]
        while stack:
            module, path, names = stack.pop()
            for name, child in module.named_children():
                if name in _ADAPTER_PARTS:
                    continue
                child_path, child_names = [*path, module], [*names, name]
                if type(child) is nn.Linear:  # exact type: a Float8Linear (a subclass) is converted already
                    fits = child.in_features % 16 == 0 and child.out_features % 16 == 0
                    if fits and not _is_modulation(child_path, child_names):
                        targets.append((module, name, child))
                else:
                    stack.append((child, child_path, child_names))
    return targets


def apply_fp8(flow_model: FlowModel) -> int:
    """Swap the frozen base linears of ``flow_model``'s repeated blocks for torchao ``Float8Linear`` (rowwise)
    in place; returns how many were swapped. Call after the LoRA adapter is injected and before compile;
    calling it again converts nothing more."""
    require_torchao()
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    transformer = flow_model.transformer
    linears = [linear for _, _, linear in fp8_targets(transformer)]
    if any(linear.weight.requires_grad for linear in linears):
        raise ValueError("model.fp8 converts frozen base weights only (trainer.mode=lora); a linear trains")
    chosen = {id(linear) for linear in linears}
    if not chosen:
        if count_fp8_layers(transformer):  # converted by an earlier call
            return 0
        raise ValueError(
            f"model.fp8: no linear layer in {type(transformer).__name__}'s repeated blocks has both "
            "dimensions divisible by 16 (torch._scaled_mm's requirement); this model cannot run FP8"
        )
    convert_to_float8_training(
        transformer,
        module_filter_fn=lambda module, _fqn: id(module) in chosen,
        config=Float8LinearConfig.from_recipe_name(FP8_RECIPE),
    )
    log.info(
        "model.fp8: %d linear layers of %s run FP8 (torchao, %s scales)",
        len(chosen),
        type(transformer).__name__,
        FP8_RECIPE,
    )
    return len(chosen)


def count_fp8_layers(module: nn.Module) -> int:
    """How many of ``module``'s layers run FP8 (torchao ``Float8Linear``)."""
    return sum(type(m).__name__ == "Float8Linear" for m in module.modules())
