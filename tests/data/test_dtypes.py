"""The one dtype table: config names, transfer metadata names and weight-sync codes agree."""

from __future__ import annotations

import torch

from digenrl.config import MODEL_DTYPES
from digenrl.data.dtypes import DTYPES_BY_NAME, TORCH_DTYPES, WIRE_DTYPES, dtype_name


def test_every_model_dtype_is_a_wire_dtype_under_its_config_name():
    assert list(TORCH_DTYPES) == list(MODEL_DTYPES)
    assert all(
        TORCH_DTYPES[name] in WIRE_DTYPES and dtype_name(TORCH_DTYPES[name]) == name for name in MODEL_DTYPES
    )


def test_names_and_codes_are_one_to_one():
    assert len(set(WIRE_DTYPES)) == len(WIRE_DTYPES) == len(DTYPES_BY_NAME)
    assert all(DTYPES_BY_NAME[dtype_name(d)] is d for d in WIRE_DTYPES)
    assert DTYPES_BY_NAME["bfloat16"] is torch.bfloat16 and WIRE_DTYPES.index(torch.float32) == 0
