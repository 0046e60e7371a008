"""Frozen VAE decoder: flow latents -> float32 pixels in [0, 1], with each model's latent normalisation.

Normalisation undone before decoding (diffusers pipelines, 0.42), from `ModelSpec` data: z / scaling_factor
+ shift_factor (SD3, FLUX, HunyuanVideo), or z * latents_std + latents_mean per channel (Wan, Qwen-Image).
The downsampling factors and the decode call are the family's (`ModelFamily.latent_compression`,
`vae_decode`: Qwen-Image's 5-D VAE decodes an image as one frame). VAE output in [-1, 1] maps to [0, 1]
as x / 2 + 0.5, clamped (diffusers VaeImageProcessor.denormalize).
"""

from __future__ import annotations

import os

import torch
from torch import Tensor, nn

from digenrl.models.construction import freeze, instantiate_diffusers_model, load_diffusers_model
from digenrl.models.spec_types import ModelSpec
from digenrl.models.specs import get_family


def latent_compression(spec: ModelSpec) -> tuple[int, int]:
    """(temporal, spatial) downsampling factors of the model's VAE (its family reads the VAE config)."""
    return get_family(spec.family).latent_compression(spec.vae_config)


def latent_channels(spec: ModelSpec) -> int:
    cfg = spec.vae_config
    return int(cfg["z_dim"] if "z_dim" in cfg else cfg["latent_channels"])


class LatentDecoder(nn.Module):
    """Decodes unpacked latents [B, C, h, w] (image) or [B, C, f, h, w] (video) to float32 pixels.

    Images come back as [B, 3, H, W], videos as [B, 3, F, H, W], values in [0, 1].
    """

    def __init__(self, spec: ModelSpec, vae: nn.Module) -> None:
        super().__init__()
        self.spec = spec
        self.vae = freeze(vae)
        self._decode = get_family(spec.family).vae_decode
        self.temporal_factor, self.spatial_factor = latent_compression(spec)
        channels = latent_channels(spec)
        if spec.vae_latents_mean is not None:
            if len(spec.vae_latents_mean) != channels:
                raise ValueError(
                    f"{spec.name}: vae_latents_mean has {len(spec.vae_latents_mean)} entries, "
                    f"VAE has {channels} channels"
                )
            self.register_buffer("latents_mean", torch.tensor(spec.vae_latents_mean, dtype=torch.float32))
            self.register_buffer("latents_std", torch.tensor(spec.vae_latents_std, dtype=torch.float32))
        else:
            self.latents_mean = None
            self.latents_std = None

    @classmethod
    def build(
        cls,
        spec: ModelSpec,
        *,
        pretrained_path: str | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> LatentDecoder:
        """Random init from `spec.vae_config`, or `from_pretrained` of `<pretrained_path>/vae`
        (or of the directory itself)."""
        if pretrained_path is None:
            vae = instantiate_diffusers_model(spec.vae_class, spec.vae_config, device=device, dtype=dtype)
        else:
            sub = os.path.join(pretrained_path, "vae")
            vae = load_diffusers_model(
                spec.vae_class, sub if os.path.isdir(sub) else pretrained_path, device=device, dtype=dtype
            )
        return cls(spec, vae).to(device)

    def train(self, mode: bool = True) -> LatentDecoder:
        return super().train(False)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.vae.parameters()).dtype

    def _denormalize(self, latents: Tensor) -> Tensor:
        z = latents.float()
        if self.latents_mean is not None:
            shape = (1, -1) + (1,) * (z.ndim - 2)
            return z * self.latents_std.view(shape) + self.latents_mean.view(shape)
        return z / self.spec.vae_scaling_factor + self.spec.vae_shift_factor

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        expected_ndim = 5 if self.spec.is_video else 4
        if latents.ndim != expected_ndim:
            raise ValueError(
                f"{self.spec.name} latents must be {expected_ndim}-D "
                f"({'[B, C, f, h, w]' if self.spec.is_video else '[B, C, h, w]'}), got {tuple(latents.shape)}"
            )
        z = self._denormalize(latents).to(self.dtype)
        pixels = self._decode(self.vae, z)
        return (pixels.float() / 2 + 0.5).clamp(0, 1)

    def pixel_shape(self, latent_shape: tuple[int, ...]) -> tuple[int, ...]:
        """Per-sample pixel shape (3, H, W) or (3, F, H, W) for an unpacked latent shape."""
        s = self.spatial_factor
        if self.spec.is_video:
            _, f, h, w = latent_shape
            return 3, (f - 1) * self.temporal_factor + 1, h * s, w * s
        _, h, w = latent_shape
        return 3, h * s, w * s

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.vae.parameters())
