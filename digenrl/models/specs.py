"""Model-zoo registry: real published configurations plus a tiny CPU variant of each family."""

from __future__ import annotations

from digenrl.models.published_specs import published_specs
from digenrl.models.spec_types import (
    FAMILIES,
    DynamicShiftSpec,
    EncoderComponentSpec,
    ModelSpec,
    TextEncoderSpec,
)
from digenrl.models.tiny_specs import tiny_specs

__all__ = [
    "FAMILIES",
    "MODEL_SPECS",
    "DynamicShiftSpec",
    "EncoderComponentSpec",
    "ModelSpec",
    "TextEncoderSpec",
    "get_model_spec",
]

MODEL_SPECS: dict[str, ModelSpec] = {spec.name: spec for spec in (*published_specs(), *tiny_specs())}


def get_model_spec(name: str) -> ModelSpec:
    """Look up a spec by name (config key `model.name`)."""
    try:
        return MODEL_SPECS[name]
    except KeyError:
        raise ValueError(f"unknown model.name {name!r}; allowed: {sorted(MODEL_SPECS)}") from None
