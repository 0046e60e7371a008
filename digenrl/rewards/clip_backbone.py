"""A CLIP model loaded from a LOCAL directory (or built with random weights), fed directly from ``[0, 1]``
image tensors.

Shared by the CLIP-based rewards (PickScore, LAION aesthetic, CLIPScore, HPSv2.1). The architecture is
transformers' ``CLIPModel``; weights, tokenizer and image-processor settings come from ``save_pretrained``
files in a local directory (``from_pretrained(..., local_files_only=True)``; model hubs are never
contacted). :meth:`LocalClip.random` builds one at a given size with random weights and the offline
tokenizer stand-in (for cost measurements and CPU tests); :meth:`LocalClip.save_pretrained` writes the
directory :meth:`LocalClip.load` reads.

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from digenrl.rewards.local_weights import (
    IMAGE_PROCESSOR_FILES,
    PRETRAINED_LAYOUT,
    TOKENIZER_FILES,
    build_random,
    offline_tokenizer,
    require_files,
    require_local_dir,
    save_pretrained_all,
)

CLIP_TEXT_MAX_TOKENS_FALLBACK = 77  # CLIP's context length (flow_grpo/pickscore_scorer.py: max_length=77)
#: OpenAI CLIP's image normalisation (CLIPImageProcessor defaults; open_clip OPENAI_DATASET_MEAN/STD).
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


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

    @classmethod
    def resize_and_crop(
        cls,
        size: int,
        mean: tuple[float, float, float] = OPENAI_CLIP_MEAN,
        std: tuple[float, float, float] = OPENAI_CLIP_STD,
    ) -> ClipImageTransform:
        """Shortest edge to ``size``, center crop ``size``², normalise: OpenAI CLIP's preprocessing."""
        return cls(size, None, (size, size), mean, std)

    def image_processor(self) -> Any:
        """The ``CLIPImageProcessor`` this transform reproduces (what :meth:`from_image_processor` reads)."""
        from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

        size = {"shortest_edge": self.shortest_edge} if self.shortest_edge is not None else None
        if size is None and self.resize_hw is not None:
            size = {"height": self.resize_hw[0], "width": self.resize_hw[1]}
        crop = {"height": self.crop_hw[0], "width": self.crop_hw[1]} if self.crop_hw is not None else None
        return CLIPImageProcessorPil(
            do_resize=size is not None,
            size=size or {"shortest_edge": 1},
            do_center_crop=crop is not None,
            crop_size=crop or {"height": 1, "width": 1},
            image_mean=list(self.mean),
            image_std=list(self.std),
        )

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


def clip_config(architecture: dict[str, Any], tokenizer: Any) -> Any:
    """A ``CLIPConfig`` of ``architecture`` (``text_config``, ``vision_config``, ``projection_dim``) whose
    special ids are ``tokenizer``'s. CLIP pools the text at the first ``eos_token_id``
    (transformers CLIPTextTransformer): the stand-in's end token [SEP]. The vocabulary keeps the
    architecture's size (its parameters count in a cost measurement) unless the tokenizer is larger."""
    from transformers import CLIPConfig

    text = dict(architecture["text_config"])
    text["vocab_size"] = max(text.get("vocab_size") or 0, len(tokenizer))
    end = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    start = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    text.update(eos_token_id=end, bos_token_id=start, pad_token_id=tokenizer.pad_token_id)
    return CLIPConfig(
        text_config=text,
        vision_config=dict(architecture["vision_config"]),
        projection_dim=architecture["projection_dim"],
    )


@dataclass
class LocalClip:
    """A ``CLIPModel`` in eval mode plus the tensor image transform and (optionally) the tokenizer.

    ``transform`` maps ``[N, 3, H, W]`` images in ``[0, 1]`` to ``pixel_values``: a
    :class:`ClipImageTransform` (read from / written to ``preprocessor_config.json``) unless a reward
    preprocesses otherwise (HPSv2's pad-to-square) and passes its own to :meth:`load`."""

    model: Any
    transform: Callable[[Tensor], Tensor]
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
        transform: Callable[[Tensor], Tensor] | None = None,
    ) -> LocalClip:
        """``transform``: the reward's own preprocessing (then no ``preprocessor_config.json`` is read)."""
        from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

        model_dir = require_files(weights_path, PRETRAINED_LAYOUT, "CLIPModel save_pretrained")
        proc_dir = model_dir
        if processor_path is not None:
            proc_dir = require_local_dir(processor_path, "processor_path")
        layout = {} if transform is not None else {"image processor": IMAGE_PROCESSOR_FILES}
        if with_tokenizer:
            layout["tokenizer"] = TOKENIZER_FILES
        require_files(proc_dir, layout, "CLIP processor")
        model = CLIPModel.from_pretrained(model_dir, local_files_only=True, dtype=dtype)
        from digenrl.models.construction import realign_tensors

        model = realign_tensors(model.eval().requires_grad_(False).to(device))
        if transform is None:
            image_processor = AutoImageProcessor.from_pretrained(proc_dir, local_files_only=True)
            transform = ClipImageTransform.from_image_processor(image_processor)
        tokenizer = AutoTokenizer.from_pretrained(proc_dir, local_files_only=True) if with_tokenizer else None
        return cls(model, transform, tokenizer)

    @classmethod
    def random(
        cls,
        architecture: dict[str, Any],
        transform: Callable[[Tensor], Tensor],
        *,
        seed: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> LocalClip:
        """A ``CLIPModel`` of ``architecture`` with random weights (seeded) and the offline tokenizer."""
        from transformers import CLIPModel

        tokenizer = offline_tokenizer()
        config = clip_config(architecture, tokenizer)
        model = build_random(CLIPModel, config, seed=seed, device=torch.device(device), dtype=dtype)
        return cls(model.eval().requires_grad_(False), transform, tokenizer)

    def save_pretrained(self, directory: str | os.PathLike[str]) -> Path:
        """Write model, tokenizer and image processor so :meth:`load` reads this CLIP back."""
        parts = [self.model, self.tokenizer]
        if isinstance(self.transform, ClipImageTransform):
            parts.append(self.transform.image_processor())
        return save_pretrained_all(directory, *[p for p in parts if p is not None])

    @property
    def device(self) -> torch.device:
        return self.model.logit_scale.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.logit_scale.dtype

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

    def prompt_embeddings(self, prompts: list[str], batch_size: int) -> Tensor:
        """Unit text embeddings, one row per prompt, ``batch_size`` per forward; each distinct prompt is
        embedded once (GRPO groups and video frames repeat prompts)."""
        distinct = list(dict.fromkeys(prompts))
        text = torch.cat(
            [self.text_embeddings(distinct[i : i + batch_size]) for i in range(0, len(distinct), batch_size)]
        )
        row_of = {prompt: row for row, prompt in enumerate(distinct)}
        return text[torch.tensor([row_of[p] for p in prompts], device=text.device)]

    def batched_image_embeddings(self, images: Tensor, batch_size: int) -> Tensor:
        """:meth:`image_embeddings` of ``images`` ``[N, 3, H, W]``, ``batch_size`` per forward."""
        return torch.cat(
            [self.image_embeddings(images[i : i + batch_size]) for i in range(0, images.shape[0], batch_size)]
        )

    def cosine(self, images: Tensor, prompts: list[str], batch_size: int) -> Tensor:
        """cos(text, image) of each image with its prompt, ``batch_size`` per forward."""
        image = self.batched_image_embeddings(images, batch_size)
        return (image * self.prompt_embeddings(prompts, batch_size)).sum(dim=-1)
