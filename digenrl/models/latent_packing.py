"""2x2 latent packing of FLUX and Qwen-Image, and FLUX's rotary position ids.

Both transformers consume tokens of 2x2 latent patches with channel order (c, dy, dx), raster order over
patches (diffusers pipeline_flux.py / pipeline_qwenimage.py `_pack_latents`, `_unpack_latents`).
FLUX position ids: per token (0, row, col) for images, zeros for text (`_prepare_latent_image_ids`).
"""

from __future__ import annotations

import torch
from torch import Tensor


def pack_2x2(latents: Tensor) -> Tensor:
    """[B, C, H, W] -> [B, (H/2)(W/2), 4C]."""
    if latents.ndim != 4:
        raise ValueError(f"pack_2x2 expects [B, C, H, W], got {tuple(latents.shape)}")
    b, c, h, w = latents.shape
    if h % 2 or w % 2:
        raise ValueError(f"pack_2x2 needs even latent height/width, got {h}x{w}")
    x = latents.reshape(b, c, h // 2, 2, w // 2, 2)
    x = x.permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_2x2(tokens: Tensor, height: int, width: int) -> Tensor:
    """[B, (H/2)(W/2), 4C] -> [B, C, H, W] (inverse of `pack_2x2`)."""
    b, n, d = tokens.shape
    if n != (height // 2) * (width // 2) or d % 4:
        raise ValueError(f"unpack_2x2: tokens {tuple(tokens.shape)} do not fit a {height}x{width} latent")
    x = tokens.reshape(b, height // 2, width // 2, d // 4, 2, 2)
    x = x.permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, d // 4, height, width)


def flux_image_ids(height: int, width: int, *, device: torch.device, dtype: torch.dtype) -> Tensor:
    """[(H/2)(W/2), 3] ids (0, row, col) of the packed latent grid of an H x W latent."""
    rows = torch.arange(height // 2, device=device, dtype=dtype)
    cols = torch.arange(width // 2, device=device, dtype=dtype)
    grid_r, grid_c = torch.meshgrid(rows, cols, indexing="ij")
    ids = torch.stack([torch.zeros_like(grid_r), grid_r, grid_c], dim=-1)
    return ids.reshape(-1, 3)


def flux_text_ids(length: int, *, device: torch.device, dtype: torch.dtype) -> Tensor:
    return torch.zeros(length, 3, device=device, dtype=dtype)
