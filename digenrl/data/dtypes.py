"""The tensor dtypes digenrl names, in one table: the ``model.dtype`` names a model is built in, the dtype
names in a trajectory transfer's metadata, and the codes weight sync's handshake broadcasts."""

from __future__ import annotations

import torch

from digenrl.config import MODEL_DTYPES

#: every dtype a trajectory transfer or a weight sync carries; a dtype's position is its wire code
WIRE_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the name configs and transfer metadata use)."""
    return str(dtype).removeprefix("torch.")


#: wire dtypes by name
DTYPES_BY_NAME: dict[str, torch.dtype] = {dtype_name(d): d for d in WIRE_DTYPES}
#: ``model.dtype`` names (and the benchmarks' ``--dtype``) -> the torch dtype a model is built in
TORCH_DTYPES: dict[str, torch.dtype] = {name: DTYPES_BY_NAME[name] for name in MODEL_DTYPES}
