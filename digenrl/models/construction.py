"""Instantiate diffusers / transformers modules from a config dict or a local directory.

Random init constructs the module directly on the target device with the target default dtype, so a
20 B-parameter transformer never exists as a float32 CPU copy (the alternative, meta + `to_empty`, would
leave computed buffers such as SD3's sin-cos position table uninitialised). `device="meta"` gives a
shape-only model for parameter counting. Hub ids are never resolved: only local directories load.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

_CONFIG_BOOKKEEPING_KEYS = ("_class_name", "_diffusers_version", "_name_or_path")


def resolve_class(library: str, class_name: str) -> type:
    """The class `class_name` exported by `library` ("diffusers" or "transformers")."""
    if library == "diffusers":
        import diffusers as lib
    elif library == "transformers":
        import transformers as lib
    else:
        raise ValueError(f"library={library!r}; allowed: 'diffusers', 'transformers'")
    cls = getattr(lib, class_name, None)
    if cls is None:
        raise ValueError(f"{library} has no class {class_name!r}")
    return cls


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Temporarily construct floating tensors in `dtype` (restored even on error)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def clean_config(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in _CONFIG_BOOKKEEPING_KEYS}


def cast_floating(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast floating parameters/buffers to `dtype`, keeping the class's `_keep_in_fp32_modules` in float32
    for half dtypes, as diffusers' `from_pretrained(torch_dtype=...)` does (a module path component must
    equal one of the names, diffusers modeling_utils / model_loading_utils).

    Buffers are replaced, not given new ``.data``: a buffer registered as a view (diffusers' ``PatchEmbed``
    registers ``pos_embed.float().unsqueeze(0)``) would keep its float32 ``_base`` under a bf16 ``.data``,
    and ``torch.compile`` of a module reading it then fails (fake-tensor metadata check: "torch.float32 !=
    torch.bfloat16"; seen compiling SD3.5-medium whole, issue 37)."""
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    half = dtype in (torch.float16, torch.bfloat16)

    def target(name: str) -> torch.dtype:
        return torch.float32 if half and keep.intersection(name.split(".")) else dtype

    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if tensor.is_floating_point() and tensor.dtype != target(name):
                tensor.data = tensor.data.to(target(name))
        for module_name, module in model.named_modules():
            for name, buffer in list(module._buffers.items()):
                full = f"{module_name}.{name}" if module_name else name
                if buffer is not None and buffer.is_floating_point() and buffer.dtype != target(full):
                    module._buffers[name] = buffer.to(target(full))
    return model


def instantiate_diffusers_model(
    class_name: str, config: dict[str, Any], *, device: str | torch.device, dtype: torch.dtype
) -> nn.Module:
    """Random-init a diffusers model from its config dict on `device` in `dtype`."""
    cls = resolve_class("diffusers", class_name)
    with torch.device(device), default_dtype(dtype):
        model = cls.from_config(clean_config(config))
    if torch.device(device).type != "meta":
        cast_floating(model, dtype)
    return model


def build_transformers_config(config: dict[str, Any]) -> Any:
    """A transformers `PretrainedConfig` from a dict carrying `model_type`."""
    from transformers import AutoConfig

    if "model_type" not in config:
        raise ValueError(f"transformers config needs a 'model_type' key; got keys {sorted(config)}")
    kwargs = dict(config)
    return AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)


def instantiate_transformers_model(
    class_name: str, config: Any, *, device: str | torch.device, dtype: torch.dtype
) -> nn.Module:
    """Random-init a transformers model (config dict or `PretrainedConfig`) on `device` in `dtype`."""
    cls = resolve_class("transformers", class_name)
    if isinstance(config, dict):
        config = build_transformers_config(config)
    with torch.device(device), default_dtype(dtype):
        model = cls(config)
    if torch.device(device).type != "meta":
        cast_floating(model, dtype)
    return model


def require_local_dir(path: str, what: str) -> str:
    """Refuse anything that is not an existing local directory (hubs are unreachable by design)."""
    if not os.path.isdir(path):
        raise ValueError(f"{what}={path!r} is not a local directory (hub ids are not resolved)")
    return path


def realign_tensors(model: nn.Module) -> nn.Module:
    """Copy parameters and buffers that a file load left at unaligned addresses into fresh storage.

    safetensors loads can hand back tensors at addresses that are not 64-byte aligned; CPU BLAS then
    takes a different kernel path and results differ in the last bits from a freshly built model
    (seen: 1e-7 in CLIP's pooled output). Bit-reproducibility across save/load and resume needs the
    same path, so realign once at load time (cheap next to reading the file).
    """
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.device.type == "cpu" and tensor.data_ptr() % 64:
                tensor.data = tensor.data.clone()
    return model


def load_diffusers_model(
    class_name: str, directory: str, *, device: str | torch.device, dtype: torch.dtype
) -> nn.Module:
    cls = resolve_class("diffusers", class_name)
    model = cls.from_pretrained(require_local_dir(directory, "pretrained_path"), torch_dtype=dtype)
    return realign_tensors(nn.Module.to(model, device=device))


def load_transformers_model(
    class_name: str, directory: str, *, device: str | torch.device, dtype: torch.dtype
) -> nn.Module:
    cls = resolve_class("transformers", class_name)
    model = cls.from_pretrained(require_local_dir(directory, "pretrained_path"), dtype=dtype)
    return realign_tensors(model.to(device=device))


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def freeze(module: nn.Module) -> nn.Module:
    """Eval mode, no gradients: text encoders and VAEs are never trained here."""
    module.eval()
    module.requires_grad_(False)
    return module
