"""JPEG (in)compressibility rewards from DDPO (Black et al., arXiv 2305.13301, §6.1).

Definition (ddpo-pytorch, ddpo_pytorch/rewards.py ``jpeg_incompressibility``/``jpeg_compressibility``):
image → ``(x·255).round().clamp(0, 255)`` uint8 → PIL JPEG at quality 95 into an in-memory buffer →
size in kB = bytes / 1000. Incompressibility = +kB, compressibility = −kB.

FlowGRPO (flow_grpo/rewards.py ``jpeg_compressibility``) returns ``−kB / 500`` for compressibility
(its incompressibility stays unscaled); pass ``scale=1/500`` to reproduce it. ``scale`` multiplies
the signed kB value for both rewards; the default 1.0 is DDPO's.

The reward is non-differentiable and runs on CPU (libjpeg via Pillow), one image at a time.
"""

from __future__ import annotations

import io
import math

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from digenrl.rewards.base import RewardFunction
from digenrl.rewards.registry import register_reward

JPEG_QUALITY = 95  # ddpo_pytorch/rewards.py: image.save(buffer, format="JPEG", quality=95)
BYTES_PER_KB = 1000.0  # ddpo_pytorch/rewards.py: buffer.tell() / 1000


def to_uint8_hwc(images: Tensor) -> np.ndarray:
    """``[N, 3, H, W]`` floats in ``[0, 1]`` → ``[N, H, W, 3]`` uint8 with DDPO's round-then-clamp."""
    quantized = (images.detach().float() * 255.0).round().clamp(0, 255).to(torch.uint8)
    return quantized.permute(0, 2, 3, 1).cpu().numpy()


def jpeg_size_kb(images: Tensor, quality: int = JPEG_QUALITY) -> Tensor:
    """In-memory JPEG size of each image in kB (bytes / 1000), float32 ``Tensor[N]`` on CPU."""
    sizes = []
    for pixels in to_uint8_hwc(images):
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=quality)
        sizes.append(buffer.tell() / BYTES_PER_KB)
    return torch.tensor(sizes, dtype=torch.float32)


class _JpegSizeReward(RewardFunction):
    sign: float = 1.0

    def __init__(
        self, device: torch.device | str = "cpu", scale: float = 1.0, quality: int = JPEG_QUALITY
    ) -> None:
        super().__init__(device)
        is_number = isinstance(scale, int | float) and not isinstance(scale, bool)
        if not (is_number and math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be finite and positive (DDPO 1.0, FlowGRPO 1/500), got {scale!r}")
        if isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= 95:
            raise ValueError(f"quality must be an int in [1, 95] (DDPO uses 95), got {quality!r}")
        self.scale = float(scale)
        self.quality = quality

    def score_images(self, images: Tensor, prompts: list[str]) -> Tensor:
        return self.sign * self.scale * jpeg_size_kb(images, self.quality)


@register_reward("jpeg-incompressibility")
class JpegIncompressibility(_JpegSizeReward):
    """+JPEG size in kB (× ``scale``): rewards detailed, hard-to-compress images."""

    sign = 1.0


@register_reward("jpeg-compressibility")
class JpegCompressibility(_JpegSizeReward):
    """−JPEG size in kB (× ``scale``): rewards flat, easy-to-compress images. FlowGRPO: ``scale=1/500``."""

    sign = -1.0
