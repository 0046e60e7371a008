"""ImageReward (Xu et al., "ImageReward: Learning and Evaluating Human Preferences for Text-to-Image
Generation", NeurIPS 2023, arXiv 2304.05977) on transformers' BLIP classes.

What ImageReward computes (THUDM/ImageReward, ImageReward/ImageReward.py ``ImageReward.score`` /
``inference_rank``; models/BLIP/blip_pretrain.py, blip.py, vit.py, med.py):

1. the image, resized (bicubic, shortest side) and center-cropped to 224 and normalised with OpenAI CLIP's
   mean/std, goes through BLIP's ViT-L/16 (``create_vit('large')``: 24 blocks of width 1024, 16 heads,
   fused qkv with bias, pre-LayerNorm with eps 1e-6, a final LayerNorm); all 197 token states are kept;
2. the prompt, BERT-tokenised (bert-base-uncased plus BLIP's ``[DEC]`` and ``[ENC]`` tokens: 30524 ids),
   padded to ``max_length=35``, goes through BLIP's BERT-base text encoder (med.py ``BertModel``, 12 layers
   of width 768) whose every layer cross-attends to the image states (``encoder_width`` 1024);
3. the ``[CLS]`` state (position 0) goes through an MLP 768 → 1024 → 128 → 64 → 16 → 1 (dropouts, no
   activations: the LAION aesthetic head's layout, :class:`digenrl.rewards.aesthetic.AestheticHead`), and
   the output is normalised: ``(r − 0.16717362830052426) / 1.0333394966054072``.

transformers ports those BLIP modules: ``BlipVisionModel`` is the same ViT (its ``last_hidden_state`` is
after the final LayerNorm) and ``BlipTextModel`` is med.py's BERT with cross-attention (called with
``is_decoder=False``: bidirectional self-attention, as ImageReward's ``mode='multimodal'`` forward).
:class:`BlipForImageTextRetrieval` holds both (plus BLIP's ``vision_proj``/``text_proj``, which
ImageReward's checkpoint has too, and an ``itm_head`` it does not use), so ``save_pretrained`` /
``from_pretrained`` work as for any transformers model. The MLP head and the two constants are in
``imagereward_head.safetensors`` beside it.

Checkpoint conversion (:func:`convert_imagereward_checkpoint`, from ``ImageReward.pt``'s state dict, keys
``blip.*`` and ``mlp.layers.*``): ``blip.text_encoder.*`` → ``text_encoder.*`` (same names: transformers
kept med.py's), ``blip.vision_proj``/``text_proj`` → ``vision_proj``/``text_proj``, ``mlp.layers.*`` →
the head, and the timm-style ViT names under ``blip.visual_encoder.`` → BLIP's under ``vision_model.``:
``cls_token`` → ``embeddings.class_embedding``, ``pos_embed`` → ``embeddings.position_embedding``,
``patch_embed.proj`` → ``embeddings.patch_embedding``, ``blocks.{i}.norm1/attn.qkv/attn.proj/norm2/mlp.fc1/
mlp.fc2`` → ``encoder.layers.{i}.layer_norm1/self_attn.qkv/self_attn.projection/layer_norm2/mlp.fc1/
mlp.fc2``, ``norm`` → ``post_layernorm``.

* ``reward.weights_path=/dir``: that directory (``config.json`` + weights, the BERT tokenizer with the two
  added tokens, ``imagereward_head.safetensors``);
* unset: random weights at ImageReward's size (seeded, a warning that the scores are noise);
* ``tiny-imagereward``: a 2 + 2-layer twin for CPU tests.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from digenrl.rewards.aesthetic import AestheticHead, head_from_state_dict
from digenrl.rewards.base import RewardFunction
from digenrl.rewards.clip_backbone import ClipImageTransform
from digenrl.rewards.local_weights import (
    PRETRAINED_LAYOUT,
    TOKENIZER_FILES,
    build_random,
    check_batch_size,
    offline_tokenizer,
    require_files,
    require_local_dir,
    save_pretrained_all,
    warn_random_weights,
)
from digenrl.rewards.registry import register_reward

IMAGEREWARD_MEAN = 0.16717362830052426  # ImageReward.py: self.mean
IMAGEREWARD_STD = 1.0333394966054072  # ImageReward.py: self.std
TEXT_MAX_LENGTH = 35  # ImageReward.py: tokenizer(..., padding='max_length', max_length=35)
IMAGE_SIZE = 224  # ImageReward.py: _transform(224)
HEAD_FILENAME = "imagereward_head.safetensors"
IMAGEREWARD_LAYOUT = {**PRETRAINED_LAYOUT, "tokenizer": TOKENIZER_FILES, "head": (HEAD_FILENAME,)}
BLIP_TOKENS = {"bos_token": "[DEC]", "additional_special_tokens": ["[ENC]"]}  # blip.py init_tokenizer

#: ImageReward-v1.0: BLIP ViT-L/16 at 224 px + BERT-base with cross-attention (med_config.json).
IMAGEREWARD_V1: dict[str, Any] = {
    "vision_config": {
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "image_size": IMAGE_SIZE,
        "patch_size": 16,
        "layer_norm_eps": 1e-6,
        "hidden_act": "gelu",
    },
    "text_config": {
        "vocab_size": 30524,
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "max_position_embeddings": 512,
        "encoder_hidden_size": 1024,
        "layer_norm_eps": 1e-12,
        "hidden_act": "gelu",
    },
    "image_text_hidden_size": 256,
}

TINY_IMAGEREWARD: dict[str, Any] = {
    "vision_config": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
        "layer_norm_eps": 1e-6,
        "hidden_act": "gelu",
    },
    "text_config": {
        "vocab_size": None,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": 64,
        "encoder_hidden_size": 32,
        "layer_norm_eps": 1e-12,
        "hidden_act": "gelu",
    },
    "image_text_hidden_size": 16,
}


def blip_config(architecture: dict[str, Any], tokenizer: Any) -> Any:
    """A ``BlipConfig`` of ``architecture`` whose text special ids are ``tokenizer``'s."""
    from transformers import BlipConfig

    text = dict(architecture["text_config"])
    text["vocab_size"] = max(text.get("vocab_size") or 0, len(tokenizer))
    text.update(
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        sep_token_id=tokenizer.sep_token_id,
    )
    return BlipConfig(
        vision_config=dict(architecture["vision_config"]),
        text_config=text,
        image_text_hidden_size=architecture["image_text_hidden_size"],
    )


def save_head(head: AestheticHead, directory: Path, mean: float, std: float) -> Path:
    """The MLP head and its normalisation (safetensors metadata) as ``imagereward_head.safetensors``."""
    from safetensors.torch import save_file

    path = directory / HEAD_FILENAME
    tensors = {k: v.detach().float().contiguous().cpu() for k, v in head.state_dict().items()}
    save_file(tensors, str(path), metadata={"mean": repr(float(mean)), "std": repr(float(std))})
    return path


def load_head(directory: str) -> tuple[AestheticHead, float, float]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = os.path.join(directory, HEAD_FILENAME)
    with safe_open(path, framework="pt") as handle:
        metadata = handle.metadata() or {}
    head = head_from_state_dict(load_file(path), path)
    return head, float(metadata.get("mean", IMAGEREWARD_MEAN)), float(metadata.get("std", IMAGEREWARD_STD))


_VIT_BLOCK = {
    "norm1": "layer_norm1",
    "norm2": "layer_norm2",
    "attn.qkv": "self_attn.qkv",
    "attn.proj": "self_attn.projection",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}
_VIT_TOP = {
    "cls_token": "embeddings.class_embedding",
    "pos_embed": "embeddings.position_embedding",
    "patch_embed.proj.weight": "embeddings.patch_embedding.weight",
    "patch_embed.proj.bias": "embeddings.patch_embedding.bias",
    "norm.weight": "post_layernorm.weight",
    "norm.bias": "post_layernorm.bias",
}
_VIT_BLOCK_KEY = re.compile(r"^blocks\.(\d+)\.(.+)\.(weight|bias)$")


def imagereward_to_transformers(
    state_dict: Mapping[str, Tensor],
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``ImageReward.pt``'s state dict → (``BlipForImageTextRetrieval`` state dict without ``itm_head``,
    head state dict); the mapping is the module docstring's. Unknown keys are an error naming them."""
    model: dict[str, Tensor] = {}
    head: dict[str, Tensor] = {}
    unknown = []
    for key, value in state_dict.items():
        if key.startswith("mlp."):
            head[key.removeprefix("mlp.")] = value
        elif key.startswith(("blip.text_encoder.", "blip.vision_proj.", "blip.text_proj.")):
            if not key.endswith("position_ids"):  # a buffer in med.py, recomputed by transformers
                model[key.removeprefix("blip.")] = value
        elif key.startswith("blip.visual_encoder."):
            name = key.removeprefix("blip.visual_encoder.")
            match = _VIT_BLOCK_KEY.match(name)
            if name in _VIT_TOP:
                model[f"vision_model.{_VIT_TOP[name]}"] = value
            elif match and match.group(2) in _VIT_BLOCK:
                block, kind = _VIT_BLOCK[match.group(2)], match.group(3)
                model[f"vision_model.encoder.layers.{match.group(1)}.{block}.{kind}"] = value
            else:
                unknown.append(key)
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(
            f"not an ImageReward state dict: unknown keys {unknown[:5]}"
            + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        )
    return model, head


def convert_imagereward_checkpoint(
    checkpoint: str | os.PathLike[str] | Mapping[str, Tensor],
    directory: str | os.PathLike[str],
    *,
    tokenizer_path: str | os.PathLike[str],
    architecture: dict[str, Any] = IMAGEREWARD_V1,
) -> Path:
    """Write ``ImageReward.pt`` (or its state dict) as the directory ``reward.weights_path`` reads, with the
    bert-base-uncased tokenizer from the LOCAL ``tokenizer_path`` (BLIP's two tokens are added if absent).
    ``itm_head``, which ImageReward does not have or use, is written as zeros."""
    from transformers import AutoTokenizer, BlipForImageTextRetrieval

    if isinstance(checkpoint, Mapping):
        state_dict = dict(checkpoint)
    else:
        state_dict = torch.load(checkpoint, map_location="cpu", weights_only=True)
    tokenizer = AutoTokenizer.from_pretrained(
        require_local_dir(tokenizer_path, "tokenizer_path"), local_files_only=True
    )
    if tokenizer.bos_token != BLIP_TOKENS["bos_token"]:
        tokenizer.add_special_tokens(BLIP_TOKENS)
    model = BlipForImageTextRetrieval(blip_config(architecture, tokenizer))
    weights, head_weights = imagereward_to_transformers(state_dict)
    weights |= {k: torch.zeros_like(v) for k, v in model.state_dict().items() if k.startswith("itm_head.")}
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as error:
        raise ValueError(
            f"the ImageReward weights do not fit the configured architecture: {error}"
        ) from error
    head = head_from_state_dict(head_weights, "the ImageReward checkpoint's mlp")
    path = save_pretrained_all(directory, model, tokenizer)
    save_head(head, path, IMAGEREWARD_MEAN, IMAGEREWARD_STD)
    return path


@register_reward("imagereward")
class ImageReward(RewardFunction):
    """ImageReward of each image for its prompt (roughly standard-normal over generated images)."""

    needs_weights = True
    weights_optional = True
    weights_layout = IMAGEREWARD_LAYOUT
    architecture: dict[str, Any] = IMAGEREWARD_V1

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
        self.dtype = dtype
        if weights_path is None:
            from transformers import BlipForImageTextRetrieval

            self.tokenizer = offline_tokenizer()
            self.tokenizer.add_special_tokens(BLIP_TOKENS)
            config = blip_config(self.architecture, self.tokenizer)
            self.model = build_random(
                BlipForImageTextRetrieval, config, seed=seed, device=self.device, dtype=dtype
            )
            width = self.architecture["text_config"]["hidden_size"]
            self.head = build_random(
                AestheticHead, width, seed=seed + 1, device=self.device, dtype=torch.float32
            )
            self.mean, self.std = IMAGEREWARD_MEAN, IMAGEREWARD_STD
            warn_random_weights(
                self.name, self.num_parameters(), "ImageReward (convert_imagereward_checkpoint)"
            )
        else:
            self._load(os.fspath(weights_path))
        self.model.eval().requires_grad_(False)
        self.head.eval().requires_grad_(False)
        self.transform = ClipImageTransform.resize_and_crop(self.model.config.vision_config.image_size)

    def _load(self, directory: str) -> None:
        from transformers import AutoTokenizer, BlipForImageTextRetrieval

        from digenrl.models.construction import realign_tensors

        require_files(directory, self.weights_layout, "ImageReward")
        model = BlipForImageTextRetrieval.from_pretrained(directory, local_files_only=True, dtype=self.dtype)
        self.model = realign_tensors(model.to(self.device))
        self.tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        head, self.mean, self.std = load_head(directory)
        self.head = realign_tensors(head.to(self.device))

    def save_pretrained(self, directory: str | os.PathLike[str]) -> Path:
        """Write model, tokenizer and head so ``weights_path=directory`` loads this reward."""
        path = save_pretrained_all(directory, self.model, self.tokenizer)
        save_head(self.head, path, self.mean, self.std)
        return path

    def text_features(self, images: Tensor, prompts: list[str]) -> Tensor:
        """The text encoder's ``[CLS]`` state after cross-attending to each image, float32 ``[N, 768]``."""
        device = self.model.text_proj.weight.device
        pixel_values = self.transform(images.to(device, torch.float32)).to(self.dtype)
        image_embeds = self.model.vision_model(pixel_values=pixel_values).last_hidden_state
        tokens = self.tokenizer(
            prompts, padding="max_length", truncation=True, max_length=TEXT_MAX_LENGTH, return_tensors="pt"
        )
        out = self.model.text_encoder(
            input_ids=tokens["input_ids"].to(device),
            attention_mask=tokens["attention_mask"].to(device),
            encoder_hidden_states=image_embeds,
            encoder_attention_mask=torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=device),
        )
        return out.last_hidden_state[:, 0].float()

    @torch.no_grad()
    def score_images(self, images: Tensor, prompts: list[str]) -> Tensor:
        scores = []
        for start in range(0, images.shape[0], self.batch_size):
            features = self.text_features(
                images[start : start + self.batch_size], prompts[start : start + self.batch_size]
            )
            scores.append((self.head(features) - self.mean) / self.std)
        return torch.cat(scores)


@register_reward("tiny-imagereward")
class TinyImageReward(ImageReward):
    """:class:`ImageReward` with a 2 + 2-layer BLIP (CPU tests); loads directories alike."""

    architecture = TINY_IMAGEREWARD
