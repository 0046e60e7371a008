"""Local weights of reward models: directory checks, the offline tokenizer stand-in, random builds.

Every reward with a model reads a LOCAL ``save_pretrained`` directory (``reward.weights_path``; model hubs
are never contacted) and fails at start-up naming the directory and each missing file
(:func:`require_files`). Without one, rewards with ``weights_optional`` build their architecture with
random weights (:func:`build_random`) and the offline BERT WordPiece tokenizer stand-in
(:func:`offline_tokenizer`): the systems cost does not depend on weight values (docs/models.md, "The
zoo"), and a run built like this logs that its reward is noise (:func:`warn_random_weights`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


def require_local_dir(path: str | os.PathLike[str], setting: str) -> str:
    """Fail early (and name the setting) when a weights path is not an existing local directory."""
    if not os.path.isdir(path):
        raise ValueError(
            f"{setting}={str(path)!r} is not an existing local directory (model hubs are not used)"
        )
    return os.fspath(path)


def require_files(directory: str | os.PathLike[str], groups: dict[str, tuple[str, ...]], what: str) -> str:
    """Fail early, naming the directory and each missing file, unless ``directory`` holds, for every
    ``{description: (file, alternative, ...)}`` entry, one of the files (e.g. ``model.safetensors`` or a
    sharded index). ``what`` says which reward's layout this is."""
    path = Path(require_local_dir(directory, "reward.weights_path"))
    missing = [desc for desc, names in groups.items() if not any((path / n).is_file() for n in names)]
    if missing:
        raise ValueError(
            f"reward.weights_path={str(directory)!r} is not a complete {what} directory; missing: "
            + "; ".join(f"{desc} ({' or '.join(groups[desc])})" for desc in missing)
        )
    return os.fspath(path)


#: What ``save_pretrained`` of a transformers model writes (one of these) and of a tokenizer.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "tokenizer.model")
PRETRAINED_LAYOUT = {"model config": ("config.json",), "weights": WEIGHT_FILES}
IMAGE_PROCESSOR_FILES = ("preprocessor_config.json",)
#: A ``save_pretrained`` model with its tokenizer and image processor (CLIP, GOT-OCR 2.0, Qwen2.5-VL).
FULL_LAYOUT = {**PRETRAINED_LAYOUT, "tokenizer": TOKENIZER_FILES, "image processor": IMAGE_PROCESSOR_FILES}


def offline_tokenizer(extra_special_tokens: tuple[str, ...] = ()) -> Any:
    """The offline BERT WordPiece stand-in (digenrl/models/text.py) used by random-weight reward models,
    with ``extra_special_tokens`` added as one id each."""
    from transformers import AutoTokenizer

    from digenrl.models.text import fallback_tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(fallback_tokenizer_dir(), local_files_only=True)
    if extra_special_tokens:
        tokenizer.add_tokens(list(extra_special_tokens), special_tokens=True)
    return tokenizer


def warn_random_weights(name: str, parameters: int, real_weights: str) -> None:
    """The warning a reward built with random weights logs: its scores are noise."""
    log.warning(
        "reward %r has random weights (%s parameters): its scores are noise; set reward.weights_path to a "
        "local directory of %s for a real reward",
        name,
        f"{parameters:,}",
        real_weights,
    )


def build_random(
    model_class: Any, config: Any, *, seed: int, device: torch.device, dtype: torch.dtype
) -> Any:
    """``model_class(config)`` with weights drawn from ``seed``, built on ``device`` in ``dtype`` (no float32
    CPU copy of a large model), as digenrl/models/construction.py builds the generators."""
    from digenrl.models.construction import default_dtype

    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), torch.device(device), default_dtype(dtype):
        torch.manual_seed(seed)
        return model_class(config)


def check_batch_size(batch_size: int) -> int:
    """``batch_size`` (images per forward of a reward model) if it is a positive int."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    return batch_size


def save_pretrained_all(directory: str | os.PathLike[str], *parts: Any) -> Path:
    """``save_pretrained`` of each part (model, tokenizer, image processor, ...) into one directory, the
    layout ``from_pretrained`` reads back; creates it; returns its path."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    for part in parts:
        part.save_pretrained(path)
    return path
