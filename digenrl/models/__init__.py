"""Diffusers-based model zoo with one flow-matching velocity interface (see flow_model.py)."""

from digenrl.data.text_condition import TextCondition
from digenrl.models.bundle import ModelBundle, build_model_bundle, save_model_bundle
from digenrl.models.flow_model import (
    FlowModel,
    available_attention_backends,
    build_flow_model,
    set_attention_backend,
)
from digenrl.models.latent_packing import pack_2x2, unpack_2x2
from digenrl.models.specs import (
    MODEL_SPECS,
    DynamicShiftSpec,
    EncoderComponentSpec,
    ModelFamily,
    ModelSpec,
    TextEncoderSpec,
    family_names,
    get_family,
    get_model_spec,
    register_family,
)
from digenrl.models.text import TextEncoder
from digenrl.models.vae import LatentDecoder, latent_compression

__all__ = [
    "MODEL_SPECS",
    "DynamicShiftSpec",
    "EncoderComponentSpec",
    "FlowModel",
    "LatentDecoder",
    "ModelBundle",
    "ModelFamily",
    "ModelSpec",
    "TextCondition",
    "TextEncoder",
    "TextEncoderSpec",
    "available_attention_backends",
    "build_flow_model",
    "build_model_bundle",
    "family_names",
    "get_family",
    "get_model_spec",
    "latent_compression",
    "pack_2x2",
    "register_family",
    "save_model_bundle",
    "set_attention_backend",
    "unpack_2x2",
]
