"""A trained LoRA adapter in the formats other tools load: diffusers', peft's and kohya's (docs/export.md).

The trainer's adapter (digenrl/trainer/lora.py) is a peft adapter named ``default`` injected into the
diffusers transformer; its state is keyed by transformer parameter name with the adapter name inside
(``transformer_blocks.0.attn.to_q.lora_A.default.weight``). Loading those tensors by hand into a pipeline
loses the adapter's config: diffusers then takes ``lora_alpha = r``, so a run trained with r=8, alpha=16
comes back at half strength without any error. The formats here carry the config with the weights:

* diffusers: ``pytorch_lora_weights.safetensors`` written by the family pipeline's own ``save_lora_weights``
  with ``transformer_lora_adapter_metadata`` = peft's ``LoraConfig.to_dict()``, as diffusers' training
  scripts pass it (diffusers training_utils ``_collate_lora_metadata``); ``Pipeline.load_lora_weights(dir)``
  builds the adapter from that config, so rank and alpha load as trained.
* peft: ``adapter_config.json`` + ``adapter_model.safetensors`` as ``PeftModel.save_pretrained`` writes
  them (peft peft_model.py: keys ``base_model.model.<module>.lora_A.weight``, safetensors metadata
  ``format: pt``), loadable with ``PeftModel.from_pretrained(transformer, dir)``.

* kohya (ComfyUI): one safetensors file of ``lora_transformer_<module path, dots as underscores>`` keys
  with ``.lora_down.weight`` (= lora_A), ``.lora_up.weight`` (= lora_B) and ``.alpha`` (a 0-d tensor):
  kohya's LoRA tensor layout (sd-scripts networks/lora.py) under the prefix ComfyUI maps onto the
  diffusers module names of SD3 and FLUX (comfy/lora.py ``model_lora_keys_unet``: ``lora_transformer_``
  + the diffusers key with dots replaced, "OneTrainer lora"). kohya's own ``lora_unet_`` prefix names
  the original checkpoints' modules (SAI's ``joint_blocks``, BFL's fused ``img_attn.qkv``), which the
  diffusers transformer we train does not have. diffusers reads this file for FLUX
  (``FluxPipeline.load_lora_weights``, lora_conversion_utils ``_convert_mixture_state_dict_to_diffusers``,
  which folds ``alpha / r`` into the weights); its SD3 loader reads no kohya keys.

``checkpoint.export_lora=true`` writes the diffusers format into every checkpoint
(:func:`checkpoint_lora_writer`); ``experiments/export.py`` writes either from any checkpoint
(digenrl/export/).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from digenrl.models.specs import family_names, get_family
from digenrl.trainer.lora import ADAPTER_NAME, default_lora_targets, lora_config

if TYPE_CHECKING:
    from peft import LoraConfig

    from digenrl.config import Config

#: The file ``save_lora_weights`` writes (diffusers' default weight name, what ``load_lora_weights`` reads).
DIFFUSERS_LORA_FILE = "pytorch_lora_weights.safetensors"
KOHYA_LORA_FILE = "lora_kohya.safetensors"
KOHYA_PREFIX = "lora_transformer_"
PEFT_CONFIG_FILE = "adapter_config.json"
PEFT_WEIGHTS_FILE = "adapter_model.safetensors"
#: ``checkpoint.export_lora``: the sub-directories of a checkpoint step directory it writes.
CHECKPOINT_LORA_DIR = "lora_diffusers"
CHECKPOINT_LORA_EMA_DIR = "lora_diffusers_ema"


def run_lora_config(cfg: Config) -> LoraConfig:
    """The ``LoraConfig`` the run's trainer injected (``trainer.lora_*``; null targets = the family's)."""
    from digenrl.models.specs import get_model_spec

    family = get_model_spec(cfg.model.name).family
    targets = (
        cfg.trainer.lora_targets if cfg.trainer.lora_targets is not None else default_lora_targets(family)
    )
    return lora_config(cfg.trainer.lora_rank, cfg.trainer.lora_alpha, targets)


def adapter_layers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The trainable state of a LoRA run keyed as the adapter formats key it: the adapter name dropped
    (``….lora_A.default.weight`` → ``….lora_A.weight``, peft ``get_peft_model_state_dict``'s rename)."""
    other = sorted(name for name in state if "lora_" not in name)
    if other or not state:
        raise ValueError(
            f"not a LoRA adapter state: {'it is empty' if not state else f'it holds {other[:4]}'} "
            "(a full fine-tuning run exports its transformer instead)"
        )
    return {
        name.replace(f".{ADAPTER_NAME}", ""): tensor.detach().cpu().contiguous()
        for name, tensor in state.items()
    }


def save_diffusers_lora(
    directory: str | Path, state: dict[str, torch.Tensor], config: LoraConfig, family: str
) -> Path:
    """Write ``state`` (a LoRA run's trainable state) in diffusers' format into ``directory``; returns the
    weights file. ``family`` picks the pipeline whose ``save_lora_weights`` writes it."""
    from digenrl.models.construction import resolve_class

    pipeline = resolve_class("diffusers", get_family(family).pipeline_class)
    pipeline.save_lora_weights(
        save_directory=str(directory),
        transformer_lora_layers=adapter_layers(state),
        transformer_lora_adapter_metadata=config.to_dict(),
        weight_name=DIFFUSERS_LORA_FILE,
    )
    return Path(directory) / DIFFUSERS_LORA_FILE


def kohya_lora_state(state: dict[str, torch.Tensor], config: LoraConfig) -> dict[str, torch.Tensor]:
    """``state`` (a LoRA run's trainable state) keyed as kohya / ComfyUI key it (module docstring): per
    adapted module ``lora_down``, ``lora_up`` and its ``alpha`` (``lora_alpha``; the rank is lora_down's
    first dimension, so the scale ``alpha / r`` is the one peft applies)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in adapter_layers(state).items():
        module, _, part = name.rpartition(".lora_")  # "<module>", "A.weight" / "B.weight"
        if part not in ("A.weight", "B.weight"):
            raise ValueError(f"not a LoRA weight of a Linear: {name!r} (kohya keys hold lora_A/lora_B only)")
        key = KOHYA_PREFIX + module.replace(".", "_")
        out[f"{key}.lora_{'down' if part == 'A.weight' else 'up'}.weight"] = tensor
        out[f"{key}.alpha"] = torch.tensor(float(config.lora_alpha), dtype=tensor.dtype)
    return out


def check_kohya_family(family: str) -> None:
    """Refuse (``ValueError`` naming ``--format``) a family whose modules ComfyUI does not map from
    ``lora_transformer_`` keys."""
    if not get_family(family).kohya_lora:
        kohya = [name for name in family_names() if get_family(name).kohya_lora]
        raise ValueError(
            f"--format kohya: ComfyUI maps lora_transformer_ keys onto the diffusers modules of "
            f"{' and '.join(kohya)} models only, not {family!r}; use --format diffusers or peft"
        )


def save_kohya_lora(
    directory: str | Path, state: dict[str, torch.Tensor], config: LoraConfig, family: str
) -> Path:
    """Write ``state`` in the kohya / ComfyUI layout into ``directory`` (:data:`KOHYA_LORA_FILE`); returns
    the file. ``family``: the model's (:func:`check_kohya_family`)."""
    from safetensors.torch import save_file

    check_kohya_family(family)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    metadata = {
        "format": "pt",
        "ss_network_module": "networks.lora",  # what kohya's sd-scripts records for a LoRA
        "ss_network_dim": str(config.r),
        "ss_network_alpha": str(config.lora_alpha),
    }
    path = directory / KOHYA_LORA_FILE
    save_file(kohya_lora_state(state, config), path, metadata=metadata)
    return path


def save_peft_lora(
    directory: str | Path, state: dict[str, torch.Tensor], config: LoraConfig, base_model: str | None = None
) -> None:
    """Write ``state`` in peft's format into ``directory``; ``base_model``: the base model's local path,
    recorded as ``base_model_name_or_path`` (peft reads it only when asked to load the base itself)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    weights = {f"base_model.model.{name}": tensor for name, tensor in adapter_layers(state).items()}
    save_file(weights, directory / PEFT_WEIGHTS_FILE, metadata={"format": "pt"})
    saved = copy.deepcopy(config)
    saved.base_model_name_or_path = base_model
    saved.inference_mode = True  # as PeftModel.save_pretrained records it
    saved.save_pretrained(str(directory))


def checkpoint_lora_writer(cfg: Config, trainer_state: dict | None) -> Callable[[Path], None] | None:
    """``checkpoint.export_lora``: what :func:`digenrl.trainer.checkpoint.save_checkpoint` calls on the
    writer rank with the step directory: the adapter in diffusers' format in ``lora_diffusers/`` (and its
    EMA in ``lora_diffusers_ema/``). ``trainer_state``: the writer's full-format trainer state (a LoRA
    run's checkpoints always are, digenrl/validation.py ``check_checkpoint_format``); ``None`` when the
    run is not a LoRA run or the key is off."""
    if not cfg.checkpoint.export_lora or cfg.trainer.mode != "lora" or not trainer_state:
        return None
    from digenrl.models.specs import get_model_spec

    config, family = run_lora_config(cfg), get_model_spec(cfg.model.name).family

    def write(step_dir: Path) -> None:
        save_diffusers_lora(step_dir / CHECKPOINT_LORA_DIR, trainer_state["model"], config, family)
        if "ema" in trainer_state:
            save_diffusers_lora(
                step_dir / CHECKPOINT_LORA_EMA_DIR, trainer_state["ema"]["weights"], config, family
            )

    return write
