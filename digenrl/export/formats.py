"""Writing a trained policy (:class:`~digenrl.export.trained.TrainedPolicy`) where diffusers and peft load it.

* a LoRA run: the adapter in diffusers', peft's or kohya's (ComfyUI) format (digenrl/trainer/lora_export.py);
* a full fine-tuning run: the transformer with diffusers' ``save_pretrained``;
* ``pipeline=True``: a whole diffusers pipeline directory (``Pipeline.from_pretrained(dir)``): the base
  components from ``model.pretrained_path``, or the run's random base rebuilt from its seed exactly as a
  training rank built it (``build_model_bundle(..., seed=cfg.seed)``, digenrl/models/bundle.py), with the
  trained transformer (full fine-tuning) or the adapter beside the components (LoRA: loaded with
  ``pipe.load_lora_weights(dir)`` or ``PeftModel.from_pretrained(pipe.transformer, dir)``, kept separate
  so the pipeline computes exactly what the run trained; diffusers' ``pipe.fuse_lora()`` merges it).

The pipeline's scheduler is diffusers' ``FlowMatchEulerDiscreteScheduler`` with the shift the run sampled
with (``sampler.shift``, else the model's static or resolution-dependent shift), the deterministic sampler
whose latents the project's rollout reproduces with its noise off (tests/models/test_pipeline_equivalence.py).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch

from digenrl.config import ConfigError
from digenrl.data.dtypes import TORCH_DTYPES
from digenrl.export.trained import TrainedPolicy
from digenrl.models.bundle import ModelBundle, build_model_bundle
from digenrl.models.construction import resolve_class
from digenrl.models.flow_model import FlowModel, build_flow_model
from digenrl.models.specs import get_family
from digenrl.trainer.lora import enable_full_finetune
from digenrl.trainer.lora_export import run_lora_config, save_diffusers_lora, save_kohya_lora, save_peft_lora
from digenrl.trainer.parallel import wrap_for_training

FORMATS = ("diffusers", "peft", "kohya")


def write_adapter(policy: TrainedPolicy, out: Path, fmt: str) -> None:
    """A LoRA run's adapter in ``fmt`` (diffusers | peft | kohya) into ``out``."""
    config = run_lora_config(policy.cfg)
    if fmt == "diffusers":
        save_diffusers_lora(out, policy.weights, config, policy.spec.family)
    elif fmt == "kohya":
        save_kohya_lora(out, policy.weights, config, policy.spec.family)
    else:
        save_peft_lora(out, policy.weights, config, base_model=policy.cfg.model.pretrained_path)


def load_trained_transformer(policy: TrainedPolicy, flow_model: FlowModel, device: str) -> None:
    """Put a full fine-tuning run's weights into ``flow_model``'s transformer through the loader a trainer
    resumes with (names and shapes checked; cast to the model's dtype)."""
    enable_full_finetune(flow_model)
    try:
        wrap_for_training(flow_model, "none", device=device, mode="full").load_full_state(policy.weights)
    except ValueError as error:
        raise ConfigError(f"{policy.checkpoint}: {error}") from None
    flow_model.requires_grad_(False)


def write_transformer(policy: TrainedPolicy, out: Path, device: str) -> None:
    """A full fine-tuning run's transformer, ``save_pretrained`` into ``out`` (its buffers, e.g. position
    tables, are rebuilt with the model; every parameter comes from the checkpoint)."""
    cfg = policy.cfg
    flow_model = build_flow_model(
        policy.spec,
        pretrained_path=cfg.model.pretrained_path,
        dtype=TORCH_DTYPES[cfg.model.dtype],
        device=device,
    )
    load_trained_transformer(policy, flow_model, device)
    flow_model.transformer.save_pretrained(str(out))


def rebuild_base(policy: TrainedPolicy, device: str) -> ModelBundle:
    """The run's base model (every component), from ``model.pretrained_path`` or rebuilt from its seed.

    Random weights depend on the device that draws them, so a random base is rebuilt only on the device
    type the run built it on (a GPU run's: ``device="cuda"``, on the same kind of GPU)."""
    cfg = policy.cfg
    if cfg.model.pretrained_path is None:
        trained_on = run_device_type(policy)
        if torch.device(device).type != trained_on:
            raise ConfigError(
                f"the run built its random base weights on {trained_on} (profile={cfg.profile!r}) and random "
                f"initialisation differs between devices; rebuild them there: --device {trained_on}"
            )
    return build_model_bundle(
        cfg.model.name,
        pretrained_path=cfg.model.pretrained_path,
        dtype=TORCH_DTYPES[cfg.model.dtype],
        device=device,
        seed=cfg.seed,
    )


def run_device_type(policy: TrainedPolicy) -> str:
    """``cuda`` for a run whose ranks talk NCCL (its profile's or ``runtime.backend``), else ``cpu``."""
    from digenrl.runtime.hardware.profiles import load_profile

    cfg = policy.cfg
    backend = cfg.runtime.backend
    if backend is None:
        try:
            backend = load_profile(cfg.profile).backend
        except ValueError as error:
            raise ConfigError(f"the run's profile={cfg.profile!r} does not load here ({error})") from None
    return "cuda" if backend == "nccl" else "cpu"


def scheduler_for(policy: TrainedPolicy) -> Any:
    """diffusers' flow-matching Euler scheduler with the run's shift (the module docstring)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    spec, shift = policy.spec, policy.cfg.sampler.shift
    if shift is not None or spec.dynamic_shift is None:
        return FlowMatchEulerDiscreteScheduler(shift=spec.shift if shift is None else shift)
    dyn = spec.dynamic_shift
    return FlowMatchEulerDiscreteScheduler(
        shift=spec.shift,
        use_dynamic_shifting=True,
        base_shift=dyn.base_shift,
        max_shift=dyn.max_shift,
        base_image_seq_len=dyn.base_seq_len,
        max_image_seq_len=dyn.max_seq_len,
        shift_terminal=spec.shift_terminal,
    )


def assemble_pipeline(bundle: ModelBundle, scheduler: Any) -> Any:
    """The family's diffusers pipeline over ``bundle``'s modules (text encoders and tokenizers under their
    diffusers names, ``text_encoder*`` / ``tokenizer*``)."""
    cls = resolve_class("diffusers", get_family(bundle.spec.family).pipeline_class)
    components: dict[str, Any] = {
        "transformer": bundle.flow_model.transformer,
        "vae": bundle.decoder.vae,
        "scheduler": scheduler,
    }
    for component in bundle.text_encoder.components:
        components[component.spec.subfolder] = component.model
        components[component.spec.tokenizer_subfolder] = component.tokenizer
        # the saved tokenizer reads what the run's encoder read (digenrl/models/text.py pads and truncates
        # to this length): a stand-in tokenizer's own 512 would overflow a tiny encoder's 16 positions
        drop = component.spec.template_drop_tokens if component.spec.prompt_template else 0
        component.tokenizer.model_max_length = component.spec.max_length + drop
    accepted = inspect.signature(cls.__init__).parameters
    unknown = sorted(set(components) - set(accepted))
    if unknown:  # pragma: no cover - a spec whose folder names the pipeline does not have
        raise ValueError(f"{cls.__name__} has no component(s) {unknown}; it takes {sorted(accepted)}")
    return cls(**components)


def write_pipeline(policy: TrainedPolicy, out: Path, fmt: str, device: str) -> None:
    """A whole diffusers pipeline directory for ``policy`` (module docstring)."""
    bundle = rebuild_base(policy, device)
    if not policy.lora:
        load_trained_transformer(policy, bundle.flow_model, device)
    assemble_pipeline(bundle, scheduler_for(policy)).save_pretrained(str(out))
    if policy.lora:
        write_adapter(policy, out, fmt)
