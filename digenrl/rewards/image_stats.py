"""Cheap, weight-free image-statistics rewards for fast CPU learning checks.

They are smooth in the pixels and trivially learnable, so a policy that is being trained correctly moves
them within a few steps — a quick end-to-end sanity check that needs no reward-model weights.

* ``brightness``: mean luma with the ITU-R BT.601 weights, Y' = 0.299 R' + 0.587 G' + 0.114 B'
  (Recommendation ITU-R BT.601, luminance-signal equation), on the gamma-encoded values as given;
  in ``[0, 1]``.
* ``colorfulness``: Hasler & Süsstrunk, "Measuring colourfulness in natural images", Proc. SPIE 5007
  (2003), metric M3: rg = R − G, yb = ½(R + G) − B, M = sqrt(σ_rg² + σ_yb²) + 0.3·sqrt(μ_rg² + μ_yb²),
  with mean and (population) standard deviation over the pixels of one image. The paper works on 0–255
  values; this reward uses the ``[0, 1]`` pixel values, i.e. returns M / 255 (M is homogeneous of degree
  one, so multiply by 255 to use the paper's scale, where ~33 is "moderately colourful").
"""

from __future__ import annotations

import torch
from torch import Tensor

from digenrl.rewards.base import RewardFunction
from digenrl.rewards.registry import register_reward

BT601_LUMA_WEIGHTS = (0.299, 0.587, 0.114)  # ITU-R BT.601 luma coefficients for R', G', B'
HASLER_SUSSTRUNK_MEAN_WEIGHT = 0.3  # Hasler & Süsstrunk (2003), M3 = σ_rgyb + 0.3 μ_rgyb


def mean_luma(images: Tensor) -> Tensor:
    """Mean BT.601 luma of each ``[N, 3, H, W]`` image → ``Tensor[N]``."""
    weights = torch.tensor(BT601_LUMA_WEIGHTS, dtype=images.dtype, device=images.device)
    return torch.einsum("nchw,c->nhw", images, weights).mean(dim=(1, 2))


def hasler_susstrunk_colorfulness(images: Tensor) -> Tensor:
    """Hasler–Süsstrunk M3 colourfulness of each ``[N, 3, H, W]`` image (in the images' value units)."""
    red, green, blue = images.unbind(dim=1)
    rg = (red - green).flatten(1)
    yb = (0.5 * (red + green) - blue).flatten(1)
    spread = torch.sqrt(rg.var(dim=1, unbiased=False) + yb.var(dim=1, unbiased=False))
    offset = torch.sqrt(rg.mean(dim=1) ** 2 + yb.mean(dim=1) ** 2)
    return spread + HASLER_SUSSTRUNK_MEAN_WEIGHT * offset


@register_reward("brightness")
class Brightness(RewardFunction):
    """Mean BT.601 luma in ``[0, 1]``."""

    def score_images(self, images: Tensor, prompts: list[str]) -> Tensor:
        return mean_luma(images)


@register_reward("colorfulness")
class Colorfulness(RewardFunction):
    """Hasler–Süsstrunk (2003) M3 colourfulness on ``[0, 1]`` pixels (= paper value / 255)."""

    def score_images(self, images: Tensor, prompts: list[str]) -> Tensor:
        return hasler_susstrunk_colorfulness(images)
