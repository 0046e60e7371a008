"""A generator's full set of modules (flow model, text encoder, VAE decoder), built or saved together.

Local directory layout is the diffusers one: `transformer/`, `vae/`, `text_encoder*/`, `tokenizer*/`, plus a
`digenrl_model.json` naming the zoo entry, so a saved tiny random bundle round-trips exactly.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from digenrl.models.flow_model import FlowModel, build_flow_model
from digenrl.models.spec_types import ModelSpec
from digenrl.models.specs import get_model_spec
from digenrl.models.text import TextEncoder
from digenrl.models.vae import LatentDecoder

BUNDLE_MARKER_FILE = "digenrl_model.json"


@dataclass
class ModelBundle:
    spec: ModelSpec
    flow_model: FlowModel
    text_encoder: TextEncoder
    decoder: LatentDecoder


def build_model_bundle(
    name: str,
    *,
    pretrained_path: str | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    text_cache_capacity: int | None = 4096,
    generation_device: str | torch.device | None = None,
) -> ModelBundle:
    """Build zoo entry `name` with random weights, or load every component from a local directory.

    ``generation_device``: where the transformer and the text encoder go (default ``device``); ``"meta"``
    gives a rank that only decodes and scores their shapes without their memory."""
    generation_device = device if generation_device is None else generation_device
    spec = get_model_spec(name)
    if pretrained_path is not None:
        if not os.path.isdir(pretrained_path):
            raise ValueError(f"pretrained_path={pretrained_path!r} is not a local directory")
        marker = os.path.join(pretrained_path, BUNDLE_MARKER_FILE)
        if os.path.isfile(marker):
            with open(marker) as f:
                saved = json.load(f).get("name")
            if saved != name:
                raise ValueError(f"pretrained_path holds model {saved!r}, but model.name is {name!r}")
    meta = torch.device(generation_device).type == "meta"
    flow_model = build_flow_model(
        spec, pretrained_path=None if meta else pretrained_path, dtype=dtype, device=generation_device
    )
    text_encoder = TextEncoder.build(
        spec.text_encoder,
        pretrained_path=None if meta else pretrained_path,
        device=generation_device,
        dtype=dtype,
        cache_capacity=text_cache_capacity,
    )
    decoder = LatentDecoder.build(spec, pretrained_path=pretrained_path, device=device, dtype=dtype)
    return ModelBundle(spec=spec, flow_model=flow_model, text_encoder=text_encoder, decoder=decoder)


def save_model_bundle(bundle: ModelBundle, directory: str) -> None:
    """Write the bundle in the diffusers layout (safetensors weights + configs + tokenizers)."""
    os.makedirs(directory, exist_ok=True)
    bundle.flow_model.transformer.save_pretrained(os.path.join(directory, "transformer"))
    bundle.decoder.vae.save_pretrained(os.path.join(directory, "vae"))
    bundle.text_encoder.save_pretrained(directory)
    with open(os.path.join(directory, BUNDLE_MARKER_FILE), "w") as f:
        json.dump({"name": bundle.spec.name, "family": bundle.spec.family}, f, indent=2)
