"""CLIPScore reward (Hessel et al., "CLIPScore: A Reference-free Evaluation Metric for Image Captioning",
EMNLP 2021, arXiv 2104.08718): ``w · max(cos(text_emb, image_emb), 0)`` with ``w = 2.5``.

The formula and the weight are the paper's Eq. 1 and its reference implementation (jmhessel/clipscore,
clipscore.py ``get_clip_score``: L2-normalise both CLIP embeddings, ``w * np.clip(sum(images *
candidates), 0, None)`` with ``w=2.5``), so scores lie in ``[0, 2.5]``. The reference scores captions and
prefixes each with "A photo depicts"; a text-to-image reward scores the generation prompt itself, so the
prefix is empty by default (``prefix``).

Architecture: transformers' ``CLIPModel``; the real size is OpenAI CLIP ViT-L/14
(openai/clip-vit-large-patch14 config.json: text 12 × 768 with 12 heads, vision 24 × 1024 with 16 heads,
patch 14 at 224 px, projection 768, quick-GELU; 428 M parameters).

* ``reward.weights_path=/dir``: a LOCAL ``CLIPModel.save_pretrained`` directory with its tokenizer and
  ``preprocessor_config.json`` (the openai/clip-vit-large-patch14 snapshot is one), read by
  :meth:`digenrl.rewards.clip_backbone.LocalClip.load`;
* unset: random weights at that size (seeded, a warning that the scores are noise), for cost measurements;
* ``tiny-clipscore``: the same with a 2 + 2-layer CLIP for CPU tests.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from digenrl.rewards.base import RewardFunction
from digenrl.rewards.clip_backbone import ClipImageTransform, LocalClip
from digenrl.rewards.local_weights import FULL_LAYOUT, check_batch_size, warn_random_weights
from digenrl.rewards.registry import register_reward

CLIPSCORE_WEIGHT = 2.5  # Hessel et al. 2021, Eq. 1 (clipscore.py get_clip_score: w=2.5)

#: openai/clip-vit-large-patch14 (config.json of the public checkpoint).
CLIP_VIT_L_14: dict[str, Any] = {
    "text_config": {
        "vocab_size": 49408,
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "max_position_embeddings": 77,
        "hidden_act": "quick_gelu",
    },
    "vision_config": {
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "image_size": 224,
        "patch_size": 14,
        "hidden_act": "quick_gelu",
    },
    "projection_dim": 768,
}

#: The CPU twin: same classes and preprocessing, 2 + 2 layers of width 32 at 32 px.
TINY_CLIP: dict[str, Any] = {
    "text_config": {
        "vocab_size": None,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": 77,
    },
    "vision_config": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
    },
    "projection_dim": 16,
}


@register_reward("clipscore")
class ClipScore(RewardFunction):
    """CLIPScore of each image for its prompt: ``weight · max(cos, 0)``, in ``[0, weight]``.

    Args:
        weights_path: local ``save_pretrained`` directory, or ``None`` for random weights at
            :attr:`architecture`'s size (``seed``).
        weight: ``w`` (2.5, the paper's).
        prefix: text put before each prompt (the caption metric's "A photo depicts"; empty for prompts).
    """

    needs_weights = True
    weights_optional = True
    weights_layout = FULL_LAYOUT
    architecture: dict[str, Any] = CLIP_VIT_L_14

    def __init__(
        self,
        weights_path: str | os.PathLike[str] | None = None,
        device: torch.device | str = "cpu",
        *,
        dtype: torch.dtype = torch.float32,
        batch_size: int = 32,
        weight: float = CLIPSCORE_WEIGHT,
        prefix: str = "",
        seed: int = 0,
    ) -> None:
        super().__init__(device)
        self.batch_size = check_batch_size(batch_size)
        if not weight > 0:
            raise ValueError(f"weight must be positive (CLIPScore uses 2.5), got {weight!r}")
        self.weight = float(weight)
        self.prefix = prefix
        if weights_path is None:
            size = self.architecture["vision_config"]["image_size"]
            self.clip = LocalClip.random(
                self.architecture,
                ClipImageTransform.resize_and_crop(size),
                seed=seed,
                device=self.device,
                dtype=dtype,
            )
            warn_random_weights(self.name, self.num_parameters(), "a CLIP model (save_pretrained)")
        else:
            self.clip = LocalClip.load(weights_path, device=self.device, dtype=dtype)

    def save_pretrained(self, directory: str | os.PathLike[str]) -> Path:
        """Write model, tokenizer and image processor so ``weights_path=directory`` loads this reward."""
        return self.clip.save_pretrained(directory)

    @torch.no_grad()
    def score_images(self, images: Tensor, prompts: list[str]) -> Tensor:
        texts = [self.prefix + p for p in prompts]
        return self.weight * self.clip.cosine(images, texts, self.batch_size).clamp(min=0.0)


@register_reward("tiny-clipscore")
class TinyClipScore(ClipScore):
    """:class:`ClipScore` with a 2 + 2-layer CLIP (CPU tests); loads directories alike."""

    architecture = TINY_CLIP
