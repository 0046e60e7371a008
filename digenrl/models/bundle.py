"""A generator's full set of modules (flow model, text encoder, VAE decoder), built or saved together.

Local directory layout is the diffusers one: `transformer/`, `vae/`, `text_encoder*/`, `tokenizer*/`, plus a
`digenrl_model.json` naming the zoo entry, so a saved tiny random bundle round-trips exactly.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from digenrl.models.construction import instantiate_diffusers_model, instantiate_transformers_model
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


def check_pretrained_dir(spec: ModelSpec, path: str) -> None:
    """A local diffusers-style directory ``build_model_bundle`` can load for ``spec``, or a ValueError
    naming ``model.pretrained_path``, the missing sub-folders and what belongs there. Cheap (no weights
    read), so start-up validation runs it before any process group exists."""
    key = f"model.pretrained_path={path!r}"
    if not os.path.isdir(path):
        raise ValueError(f"{key} is not an existing local directory (hub ids are never resolved)")
    marker = os.path.join(path, BUNDLE_MARKER_FILE)
    if os.path.isfile(marker):
        with open(marker) as f:
            saved = json.load(f).get("name")
        if saved != spec.name:
            raise ValueError(f"{key} holds model {saved!r}, but model.name is {spec.name!r}")
    needed = ["transformer", "vae", *(component.subfolder for component in spec.text_encoder.components)]
    missing = [sub for sub in needed if not os.path.isdir(os.path.join(path, sub))]
    if missing:
        raise ValueError(
            f"{key} lacks the sub-folder(s) {', '.join(f'{sub}/' for sub in missing)}; a {spec.name} "
            f"directory needs {', '.join(f'{sub}/' for sub in needed)} (diffusers layout, plus the "
            "matching tokenizer*/ folders)"
        )


def build_model_bundle(
    name: str,
    *,
    pretrained_path: str | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    text_cache_capacity: int | None = 4096,
    generation_device: str | torch.device | None = None,
    seed: int | None = None,
) -> ModelBundle:
    """Build zoo entry `name` with random weights, or load every component from a local directory.

    ``generation_device``: where the transformer and the text encoder go (default ``device``); ``"meta"``
    gives a rank that only decodes and scores their shapes without their memory. ``seed``: seed torch's
    generators first (``torch.manual_seed``), so random weights are a function of the seed and the device
    type: every rank of a run builds the same ones, and an export rebuilds them (digenrl/export/)."""
    if seed is not None:
        torch.manual_seed(seed)
    generation_device = device if generation_device is None else generation_device
    spec = get_model_spec(name)
    if pretrained_path is not None:
        check_pretrained_dir(spec, pretrained_path)
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


def meta_transformer(spec: ModelSpec, pretrained_path: str | None = None) -> torch.nn.Module:
    """``spec``'s transformer on the ``meta`` device: its module names and shapes, no memory. With a
    ``pretrained_path`` the module tree comes from that directory's ``transformer/config.json``."""
    config = spec.transformer_config
    saved = os.path.join(pretrained_path or "", "transformer", "config.json")
    if pretrained_path is not None and os.path.isfile(saved):
        with open(saved) as f:
            config = json.load(f)
    return instantiate_diffusers_model(spec.transformer_class, config, device="meta", dtype=torch.float32)


def bundle_parameter_counts(spec: ModelSpec) -> dict[str, int]:
    """Parameters of every module a rank holds for ``spec`` (transformer, text encoders, VAE), counted on
    the ``meta`` device from the published configs."""
    encoders = [
        instantiate_transformers_model(c.model_class, c.config, device="meta", dtype=torch.float32)
        for c in spec.text_encoder.components
    ]
    vae = instantiate_diffusers_model(spec.vae_class, spec.vae_config, device="meta", dtype=torch.float32)
    return {
        "transformer": sum(p.numel() for p in meta_transformer(spec).parameters()),
        "text encoders": sum(p.numel() for e in encoders for p in e.parameters()),
        "VAE": sum(p.numel() for p in vae.parameters()),
    }


def save_model_bundle(bundle: ModelBundle, directory: str) -> None:
    """Write the bundle in the diffusers layout (safetensors weights + configs + tokenizers)."""
    os.makedirs(directory, exist_ok=True)
    bundle.flow_model.transformer.save_pretrained(os.path.join(directory, "transformer"))
    bundle.decoder.vae.save_pretrained(os.path.join(directory, "vae"))
    bundle.text_encoder.save_pretrained(directory)
    with open(os.path.join(directory, BUNDLE_MARKER_FILE), "w") as f:
        json.dump({"name": bundle.spec.name, "family": bundle.spec.family}, f, indent=2)
