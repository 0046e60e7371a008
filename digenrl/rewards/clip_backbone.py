"""A CLIP model loaded from a LOCAL directory, fed directly from ``[0, 1]`` image tensors.

Shared by the CLIP-based rewards (PickScore, LAION aesthetic). The architecture is transformers'
``CLIPModel``; weights, tokenizer and image-processor settings come from ``save_pretrained`` files in a
local directory (``from_pretrained(..., local_files_only=True)``; model hubs are never contacted).

Image preprocessing reproduces ``CLIPImageProcessor`` on tensors, avoiding the uint8 → PIL round trip
that the reference scorers do (flow_grpo/pickscore_scorer.py, ddpo_pytorch/aesthetic_scorer.py):
resize the shortest edge (bicubic, antialiased like PIL's; output size rule of
transformers ``image_transforms.get_resize_output_image_size``), center crop with
``top = (H − h) // 2`` (``image_transforms.center_crop``), normalize with the processor's mean/std. The
processor's ``rescale_factor`` (1/255) maps uint8 to ``[0, 1]``, which is the range our images already
have. Results match the PIL path up to uint8 quantization and resampling round-off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

CLIP_TEXT_MAX_TOKENS_FALLBACK = 77  # CLIP's context length (flow_grpo/pickscore_scorer.py: max_length=77)


def _size_field(size: Any, key: str) -> int | None:
    """Read ``key`` from a processor size spec (a dict in older transformers, ``SizeDict`` in newer)."""
    if size is None:
        return None
    value = size.get(key) if isinstance(size, dict) else getattr(size, key, None)
    return int(value) if value is not None else None


@dataclass(frozen=True)
class ClipImageTransform:
    """Tensor version of a ``CLIPImageProcessor``: ``[N, 3, H, W]`` in ``[0, 1]`` → ``pixel_values``."""

    shortest_edge: int | None
    resize_hw: tuple[int, int] | None
    crop_hw: tuple[int, int] | None
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @classmethod
    def from_image_processor(cls, processor: Any) -> ClipImageTransform:
        shortest_edge = resize_hw = crop_hw = None
        if getattr(processor, "do_resize", True):
            size = processor.size
            shortest_edge = _size_field(size, "shortest_edge")
            height, width = _size_field(size, "height"), _size_field(size, "width")
            if shortest_edge is None and height is not None and width is not None:
                resize_hw = (height, width)
            if shortest_edge is None and resize_hw is None:
                raise ValueError(f"image processor size {size!r} has neither shortest_edge nor height/width")
        if getattr(processor, "do_center_crop", False):
            crop = processor.crop_size
            crop_hw = (_size_field(crop, "height"), _size_field(crop, "width"))
            if None in crop_hw:
                raise ValueError(f"image processor crop_size {crop!r} lacks height/width")
        mean = tuple(float(v) for v in processor.image_mean) if processor.do_normalize else (0.0, 0.0, 0.0)
        std = tuple(float(v) for v in processor.image_std) if processor.do_normalize else (1.0, 1.0, 1.0)
        return cls(shortest_edge, resize_hw, crop_hw, mean, std)  # type: ignore[arg-type]

    def output_hw(self, height: int, width: int) -> tuple[int, int]:
        """Size after resizing (transformers ``get_resize_output_image_size``, default_to_square=False)."""
        if self.resize_hw is not None:
            return self.resize_hw
        if self.shortest_edge is None:
            return height, width
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = self.shortest_edge, int(self.shortest_edge * long / short)
        return (new_long, new_short) if width <= height else (new_short, new_long)

    def __call__(self, images: Tensor) -> Tensor:
        height, width = images.shape[-2:]
        target = self.output_hw(height, width)
        if target != (height, width):
            images = F.interpolate(images, size=target, mode="bicubic", align_corners=False, antialias=True)
            images = images.clamp(0.0, 1.0)  # PIL resamples into uint8, which clips bicubic overshoot
        if self.crop_hw is not None:
            images = center_crop(images, self.crop_hw)
        mean = torch.tensor(self.mean, dtype=images.dtype, device=images.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, dtype=images.dtype, device=images.device).view(1, 3, 1, 1)
        return (images - mean) / std


def center_crop(images: Tensor, crop_hw: tuple[int, int]) -> Tensor:
    """Center crop like transformers ``image_transforms.center_crop`` (zero-pads when the crop is larger)."""
    crop_h, crop_w = crop_hw
    height, width = images.shape[-2:]
    pad_h, pad_w = max(crop_h - height, 0), max(crop_w - width, 0)
    if pad_h or pad_w:
        images = F.pad(images, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))
        height, width = images.shape[-2:]
    top, left = (height - crop_h) // 2, (width - crop_w) // 2
    return images[..., top : top + crop_h, left : left + crop_w]


def pooled_features(output: Any) -> Tensor:
    """Projected embedding from ``get_image_features``/``get_text_features``.

    transformers < 5 returns the tensor; transformers 5 returns a ``BaseModelOutputWithPooling`` whose
    ``pooler_output`` holds the projected embedding (transformers/models/clip/modeling_clip.py).
    """
    return output if isinstance(output, Tensor) else output.pooler_output


def require_local_dir(path: str | os.PathLike[str], setting: str) -> str:
    """Fail early (and name the setting) when a weights path is not an existing local directory."""
    if not os.path.isdir(path):
        raise ValueError(
            f"{setting}={str(path)!r} is not an existing local directory (model hubs are not used)"
        )
    return os.fspath(path)


@dataclass
class LocalClip:
    """A ``CLIPModel`` in eval mode plus the tensor image transform and (optionally) the tokenizer."""

    model: Any
    transform: ClipImageTransform
    tokenizer: Any | None

    @classmethod
    def load(
        cls,
        weights_path: str | os.PathLike[str],
        *,
        processor_path: str | os.PathLike[str] | None = None,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        with_tokenizer: bool = True,
    ) -> LocalClip:
        from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

        model_dir = require_local_dir(weights_path, "reward.weights_path")
        proc_dir = model_dir
        if processor_path is not None:
            proc_dir = require_local_dir(processor_path, "processor_path")
        model = CLIPModel.from_pretrained(model_dir, local_files_only=True, dtype=dtype)
        model = model.eval().requires_grad_(False).to(device)
        image_processor = AutoImageProcessor.from_pretrained(proc_dir, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(proc_dir, local_files_only=True) if with_tokenizer else None
        return cls(model, ClipImageTransform.from_image_processor(image_processor), tokenizer)

    @property
    def device(self) -> torch.device:
        return self.model.logit_scale.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.logit_scale.dtype

    def to(self, device: torch.device | str) -> None:
        self.model.to(device)

    def image_embeddings(self, images: Tensor) -> Tensor:
        """Unit-norm float32 image embeddings of ``[N, 3, H, W]`` images in ``[0, 1]``."""
        pixel_values = self.transform(images.to(self.device, torch.float32)).to(self.dtype)
        embeds = pooled_features(self.model.get_image_features(pixel_values=pixel_values)).float()
        return embeds / torch.linalg.vector_norm(embeds, dim=-1, keepdim=True)

    def text_embeddings(self, prompts: list[str]) -> Tensor:
        """Unit-norm float32 text embeddings (truncated to the text tower's context length)."""
        if self.tokenizer is None:
            raise RuntimeError("this LocalClip was loaded with with_tokenizer=False")
        max_length = getattr(self.model.config.text_config, "max_position_embeddings", None)
        tokens = self.tokenizer(
            prompts,
            padding=True,
            truncation=True,
            max_length=max_length or CLIP_TEXT_MAX_TOKENS_FALLBACK,
            return_tensors="pt",
        )
        embeds = self.model.get_text_features(
            input_ids=tokens["input_ids"].to(self.device),
            attention_mask=tokens["attention_mask"].to(self.device),
        )
        embeds = pooled_features(embeds).float()
        return embeds / torch.linalg.vector_norm(embeds, dim=-1, keepdim=True)
