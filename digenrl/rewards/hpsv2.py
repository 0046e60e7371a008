"""HPSv2.1 reward (Wu et al., "Human Preference Score v2", arXiv 2306.09341): cosine between the CLIP
image and text embeddings of an open_clip ViT-H-14 fine-tuned on human preferences.

Score: HPSv2's ``hpsv2/img_score.py`` ``score`` (and flow_grpo/hpsv2_scorer.py) runs open_clip's
``CLIP.forward``, which L2-normalises both embeddings (``encode_image/encode_text(normalize=True)``), and
takes the diagonal of ``image_features @ text_features.T``: the cosine, no logit scale (≈ 0.2–0.35 for the
public checkpoint).

Preprocessing: HPSv2 builds its model with ``light_augmentation=True``, so its ``preprocess_val`` is
``ResizeMaxSize(224)`` (hpsv2/src/open_clip/transform.py: scale the longer side to 224, bicubic on the
float tensor, zero-pad to a square) then OpenAI CLIP's normalisation; :class:`ResizeMaxSize` does that on
tensors (it pads every non-square image, where HPSv2 skips the padding when no resize is needed).

Architecture without open_clip: open_clip's ViT-H-14 (model_configs/ViT-H-14.json: embed 1024; vision 32 ×
1280, head width 80 → 16 heads, patch 14 at 224 px; text 24 × 1024 with 16 heads, context 77; GELU) is a
CLIP that transformers' ``CLIPModel`` computes with renamed parameters, so the reward runs
``CLIPModel`` (986 M parameters) and a checkpoint in open_clip's layout is converted once
(:func:`convert_open_clip_checkpoint`). Mapping, from open_clip src/open_clip/model.py ``CLIP`` (text tower
attributes kept at top level) and transformer.py (``VisionTransformer``, ``ResidualAttentionBlock`` with
``nn.MultiheadAttention``):

=====================================================  ======================================================
open_clip                                              transformers ``CLIPModel``
=====================================================  ======================================================
``token_embedding.weight``                             ``text_model.embeddings.token_embedding.weight``
``positional_embedding``                               ``text_model.embeddings.position_embedding.weight``
``transformer.resblocks.{i}.…``                        ``text_model.encoder.layers.{i}.…`` (block, below)
``ln_final.*``                                         ``text_model.final_layer_norm.*``
``text_projection`` ``[width, embed]``                 ``text_projection.weight`` (transposed)
``visual.conv1.weight``                                ``vision_model.embeddings.patch_embedding.weight``
``visual.class_embedding``                             ``vision_model.embeddings.class_embedding``
``visual.positional_embedding``                        ``vision_model.embeddings.position_embedding.weight``
``visual.ln_pre.*`` / ``visual.ln_post.*``             ``vision_model.pre_layrnorm.*`` / ``post_layernorm.*``
``visual.transformer.resblocks.{i}.…``                 ``vision_model.encoder.layers.{i}.…`` (block, below)
``visual.proj`` ``[width, embed]``                     ``visual_projection.weight`` (transposed)
``logit_scale``                                        ``logit_scale``
block ``ln_1.*`` / ``ln_2.*``                          ``layer_norm1.*`` / ``layer_norm2.*``
block ``attn.in_proj_weight`` / ``in_proj_bias``       ``self_attn.{q,k,v}_proj.weight`` / ``.bias`` (thirds)
block ``attn.out_proj.*``                              ``self_attn.out_proj.*``
block ``mlp.c_fc.*`` / ``mlp.c_proj.*``                ``mlp.fc1.*`` / ``mlp.fc2.*``
=====================================================  ======================================================

open_clip pools the text at ``argmax(token ids)`` (the end-of-text token has the largest id in CLIP's BPE
vocabulary); ``CLIPModel`` pools at the first ``eos_token_id``, the same position with CLIP's tokenizer.
``attn_mask`` (the causal mask buffer) is not a weight and is dropped.

* ``reward.weights_path=/dir``: a LOCAL ``CLIPModel.save_pretrained`` directory with a CLIP tokenizer
  (e.g. written by :func:`convert_open_clip_checkpoint` from ``HPS_v2.1_compressed.pt`` and the
  laion/CLIP-ViT-H-14-laion2B-s32B-b79K tokenizer files);
* unset: random weights at ViT-H-14 size (seeded, a warning that the scores are noise);
* ``tiny-hpsv2.1``: a 2 + 2-layer twin for CPU tests.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from digenrl.rewards.base import RewardFunction
from digenrl.rewards.clip_backbone import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, LocalClip, clip_config
from digenrl.rewards.local_weights import (
    PRETRAINED_LAYOUT,
    TOKENIZER_FILES,
    check_batch_size,
    require_files,
    require_local_dir,
    save_pretrained_all,
    warn_random_weights,
)
from digenrl.rewards.registry import register_reward

#: open_clip model_configs/ViT-H-14.json as a transformers CLIPConfig (GELU, not quick-GELU).
OPEN_CLIP_VIT_H_14: dict[str, Any] = {
    "text_config": {
        "vocab_size": 49408,
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "max_position_embeddings": 77,
        "hidden_act": "gelu",
    },
    "vision_config": {
        "hidden_size": 1280,
        "intermediate_size": 5120,
        "num_hidden_layers": 32,
        "num_attention_heads": 16,
        "image_size": 224,
        "patch_size": 14,
        "hidden_act": "gelu",
    },
    "projection_dim": 1024,
}

TINY_OPEN_CLIP: dict[str, Any] = {
    "text_config": {
        "vocab_size": None,
        "hidden_size": 32,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": 77,
        "hidden_act": "gelu",
    },
    "vision_config": {
        "hidden_size": 32,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
        "hidden_act": "gelu",
    },
    "projection_dim": 16,
}

#: A ``CLIPModel.save_pretrained`` directory with its tokenizer (the preprocessing is HPSv2's, fixed).
HPS_LAYOUT = {**PRETRAINED_LAYOUT, "tokenizer": TOKENIZER_FILES}


@dataclass(frozen=True)
class ResizeMaxSize:
    """HPSv2's evaluation preprocessing on tensors: longer side to ``size`` (bicubic, antialiased, no clamp:
    torchvision resizes the float tensor), zero-pad to ``size``², normalise."""

    size: int
    mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    std: tuple[float, float, float] = OPENAI_CLIP_STD

    def __call__(self, images: Tensor) -> Tensor:
        height, width = images.shape[-2:]
        scale = self.size / max(height, width)
        new_h, new_w = round(height * scale), round(width * scale)
        if (new_h, new_w) != (height, width):
            images = F.interpolate(
                images, size=(new_h, new_w), mode="bicubic", align_corners=False, antialias=True
            )
        pad_h, pad_w = self.size - new_h, self.size - new_w
        images = F.pad(images, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))
        mean = torch.tensor(self.mean, dtype=images.dtype, device=images.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, dtype=images.dtype, device=images.device).view(1, 3, 1, 1)
        return (images - mean) / std


_BLOCK = {
    "ln_1": "layer_norm1",
    "ln_2": "layer_norm2",
    "attn.out_proj": "self_attn.out_proj",
    "mlp.c_fc": "mlp.fc1",
    "mlp.c_proj": "mlp.fc2",
}
_TOP = {
    "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
    "positional_embedding": "text_model.embeddings.position_embedding.weight",
    "ln_final.weight": "text_model.final_layer_norm.weight",
    "ln_final.bias": "text_model.final_layer_norm.bias",
    "visual.conv1.weight": "vision_model.embeddings.patch_embedding.weight",
    "visual.class_embedding": "vision_model.embeddings.class_embedding",
    "visual.positional_embedding": "vision_model.embeddings.position_embedding.weight",
    "visual.ln_pre.weight": "vision_model.pre_layrnorm.weight",
    "visual.ln_pre.bias": "vision_model.pre_layrnorm.bias",
    "visual.ln_post.weight": "vision_model.post_layernorm.weight",
    "visual.ln_post.bias": "vision_model.post_layernorm.bias",
    "logit_scale": "logit_scale",
}
_TRANSPOSED = {"text_projection": "text_projection.weight", "visual.proj": "visual_projection.weight"}
_DROPPED = {"attn_mask"}
_RESBLOCK = re.compile(r"^(visual\.)?transformer\.resblocks\.(\d+)\.(.+)$")


def open_clip_to_transformers(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """An open_clip ``CLIP`` state dict (ViT towers, the layout of ``HPS_v2.1_compressed.pt``) renamed to
    transformers' ``CLIPModel`` (module docstring's table). Unknown keys are an error naming them."""
    out: dict[str, Tensor] = {}
    unknown = []
    for key, value in state_dict.items():
        if key in _DROPPED:
            continue
        if key in _TOP:
            out[_TOP[key]] = value
            continue
        if key in _TRANSPOSED:
            out[_TRANSPOSED[key]] = value.t().contiguous()
            continue
        match = _RESBLOCK.match(key)
        if match is None:
            unknown.append(key)
            continue
        tower = "vision_model" if match.group(1) else "text_model"
        prefix, rest = f"{tower}.encoder.layers.{match.group(2)}.", match.group(3)
        if rest in ("attn.in_proj_weight", "attn.in_proj_bias"):
            kind = "weight" if rest.endswith("weight") else "bias"
            for name, part in zip(("q", "k", "v"), value.chunk(3, dim=0), strict=True):
                out[f"{prefix}self_attn.{name}_proj.{kind}"] = part.contiguous()
            continue
        module, _, leaf = rest.rpartition(".")
        if module not in _BLOCK:
            unknown.append(key)
            continue
        out[f"{prefix}{_BLOCK[module]}.{leaf}"] = value
    if unknown:
        raise ValueError(
            f"not an open_clip ViT CLIP state dict: unknown keys {unknown[:5]}"
            + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        )
    return out


def read_open_clip_state_dict(path: str | os.PathLike[str]) -> dict[str, Tensor]:
    """The state dict of an open_clip checkpoint file (``{"state_dict": ...}`` as HPSv2 saves it, or a bare
    state dict), without a DDP ``module.`` prefix; tensors only (``weights_only``)."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    state_dict = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state_dict, dict) or not all(isinstance(v, Tensor) for v in state_dict.values()):
        raise ValueError(f"{path}: not an open_clip checkpoint (expected a state dict of tensors)")
    if state_dict and all(k.startswith("module.") for k in state_dict):
        state_dict = {k.removeprefix("module."): v for k, v in state_dict.items()}
    return state_dict


def convert_open_clip_checkpoint(
    checkpoint: str | os.PathLike[str] | Mapping[str, Tensor],
    directory: str | os.PathLike[str],
    *,
    tokenizer_path: str | os.PathLike[str],
    architecture: dict[str, Any] = OPEN_CLIP_VIT_H_14,
) -> Path:
    """Write an open_clip checkpoint (a file such as ``HPS_v2.1_compressed.pt``, or its state dict) as the
    ``save_pretrained`` directory ``reward.weights_path`` reads: ``CLIPModel`` of ``architecture`` (the
    head counts are not in the weights) loaded strictly from the renamed tensors, plus the CLIP tokenizer
    found in the LOCAL ``tokenizer_path``."""
    from transformers import AutoTokenizer, CLIPModel

    state_dict = checkpoint if isinstance(checkpoint, Mapping) else read_open_clip_state_dict(checkpoint)
    tokenizer_dir = require_local_dir(tokenizer_path, "tokenizer_path")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    model = CLIPModel(clip_config(architecture, tokenizer))
    converted = open_clip_to_transformers(state_dict)
    try:
        model.load_state_dict(converted, strict=True)
    except RuntimeError as error:
        raise ValueError(f"the open_clip weights do not fit the configured architecture: {error}") from error
    return save_pretrained_all(directory, model, tokenizer)


@register_reward("hpsv2.1")
class HPSv21(RewardFunction):
    """HPSv2.1 score of each image for its prompt (cosine of the normalised embeddings), batched, no grad."""

    needs_weights = True
    weights_optional = True
    weights_layout = HPS_LAYOUT
    architecture: dict[str, Any] = OPEN_CLIP_VIT_H_14

    def __init__(
        self,
        weights_path: str | os.PathLike[str] | None = None,
        device: torch.device | str = "cpu",
        *,
        dtype: torch.dtype = torch.float32,
        batch_size: int = 32,
        seed: int = 0,
    ) -> None:
        super().__init__(device)
        self.batch_size = check_batch_size(batch_size)
        if weights_path is None:
            transform = ResizeMaxSize(self.architecture["vision_config"]["image_size"])
            self.clip = LocalClip.random(
                self.architecture, transform, seed=seed, device=self.device, dtype=dtype
            )
            warn_random_weights(self.name, self.num_parameters(), "HPSv2.1 (convert_open_clip_checkpoint)")
        else:
            from transformers import CLIPConfig

            directory = require_files(
                weights_path, self.weights_layout, "HPSv2.1 (CLIPModel save_pretrained)"
            )
            size = CLIPConfig.from_pretrained(directory, local_files_only=True).vision_config.image_size
            self.clip = LocalClip.load(
                directory, device=self.device, dtype=dtype, transform=ResizeMaxSize(size)
            )

    def save_pretrained(self, directory: str | os.PathLike[str]) -> Path:
        """Write model and tokenizer so ``weights_path=directory`` loads this reward."""
        return self.clip.save_pretrained(directory)

    @torch.no_grad()
    def score_images(self, images: Tensor, prompts: list[str]) -> Tensor:
        return self.clip.cosine(images, prompts, self.batch_size)


@register_reward("tiny-hpsv2.1")
class TinyHPSv21(HPSv21):
    """:class:`HPSv21` with a 2 + 2-layer CLIP (CPU tests); loads directories alike."""

    architecture = TINY_OPEN_CLIP
