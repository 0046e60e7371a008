"""Model-zoo registry: the model families (`family.py`; one module each under `families/`) and their zoo
entries, the `model.name` values.

After torchtitan's `TrainSpec` registry: a family plugs in by registering one `ModelFamily`; every consumer
(`FlowModel`, `TextEncoder`, `LatentDecoder`, the trainer's LoRA defaults, start-up validation) asks
:func:`get_family` or :data:`MODEL_SPECS` and holds no per-family table of its own.
"""

from __future__ import annotations

from digenrl.models.families import flux, hunyuan_video, qwen_image, sd3, wan
from digenrl.models.family import ModelFamily
from digenrl.models.spec_types import (
    DynamicShiftSpec,
    EncoderComponentSpec,
    ModelSpec,
    TextEncoderSpec,
)

__all__ = [
    "MODEL_SPECS",
    "DynamicShiftSpec",
    "EncoderComponentSpec",
    "ModelFamily",
    "ModelSpec",
    "TextEncoderSpec",
    "family_names",
    "get_family",
    "get_model_spec",
    "register_family",
    "unregister_family",
]

_FAMILIES: dict[str, ModelFamily] = {}
#: every registered family's zoo entries by name (config key `model.name`)
MODEL_SPECS: dict[str, ModelSpec] = {}


def register_family(family: ModelFamily) -> ModelFamily:
    """Add ``family`` and its zoo entries; a family name or a model name may be registered once."""
    if family.name in _FAMILIES:
        raise ValueError(f"model family {family.name!r} is already registered")
    names = [spec.name for spec in family.specs]
    taken = sorted({n for n in names if n in MODEL_SPECS or names.count(n) > 1})
    if taken:
        raise ValueError(f"model family {family.name!r}: model names {taken} are already registered")
    _FAMILIES[family.name] = family
    MODEL_SPECS.update((spec.name, spec) for spec in family.specs)
    return family


def unregister_family(name: str) -> None:
    """Remove family ``name`` and its zoo entries (a plugin or test that registered one takes it back)."""
    family = get_family(name)
    for spec in family.specs:
        del MODEL_SPECS[spec.name]
    del _FAMILIES[name]


def get_family(name: str) -> ModelFamily:
    """The registered family ``name`` (a spec's ``family``, a text encoder's ``composition``)."""
    try:
        return _FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; registered: {sorted(_FAMILIES)}") from None


def family_names() -> tuple[str, ...]:
    """Registered family names, in registration order."""
    return tuple(_FAMILIES)


def get_model_spec(name: str) -> ModelSpec:
    """Look up a spec by name (config key `model.name`)."""
    try:
        return MODEL_SPECS[name]
    except KeyError:
        raise ValueError(f"unknown model.name {name!r}; allowed: {sorted(MODEL_SPECS)}") from None


for _family in (sd3.FAMILY, flux.FAMILY, qwen_image.FAMILY, wan.FAMILY, hunyuan_video.FAMILY):
    register_family(_family)
