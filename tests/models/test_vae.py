"""LatentDecoder: output shape/range and each family's latent de-normalisation."""

from __future__ import annotations

import pytest
import torch

TINY_NAMES = ["tiny-sd3", "tiny-flux", "tiny-qwen-image", "tiny-wan", "tiny-hunyuan-video"]


@pytest.mark.parametrize("name", TINY_NAMES)
def test_decode_shape_range_dtype(name, bundles):
    bundle = bundles(name)
    spec = bundle.spec
    shape = bundle.flow_model.latent_shape(spec.default_height, spec.default_width, spec.default_frames)
    images = bundle.decoder.decode(torch.randn(2, *shape) * 3)
    expected = (2, 3, spec.default_frames, 32, 32) if spec.is_video else (2, 3, 32, 32)
    assert tuple(images.shape) == expected
    assert tuple(images.shape[1:]) == bundle.decoder.pixel_shape(shape)
    assert images.dtype == torch.float32
    assert images.min() >= 0 and images.max() <= 1
    assert images.std() > 0


def _manual_vae_input(bundle, latents: torch.Tensor) -> torch.Tensor:
    """Independent float64 reference of what the pipelines feed `vae.decode`."""
    spec = bundle.spec
    z = latents.double()
    if spec.vae_latents_mean is not None:
        shape = (1, -1) + (1,) * (z.ndim - 2)
        mean = torch.tensor(spec.vae_latents_mean, dtype=torch.float64).view(shape)
        std = torch.tensor(spec.vae_latents_std, dtype=torch.float64).view(shape)
        z = z * std + mean
    else:
        z = z / spec.vae_scaling_factor + spec.vae_shift_factor
    if spec.vae_class == "AutoencoderKLQwenImage":
        z = z.unsqueeze(2)
    return z.float()


@pytest.mark.parametrize("name", TINY_NAMES)
def test_decode_applies_family_denormalisation(name, bundles):
    bundle = bundles(name)
    spec = bundle.spec
    shape = bundle.flow_model.latent_shape(spec.default_height, spec.default_width, spec.default_frames)
    latents = torch.randn(1, *shape)
    with torch.no_grad():
        raw = bundle.decoder.vae.decode(_manual_vae_input(bundle, latents)).sample
    if spec.vae_class == "AutoencoderKLQwenImage":
        raw = raw[:, :, 0]
    expected = (raw / 2 + 0.5).clamp(0, 1)
    torch.testing.assert_close(bundle.decoder.decode(latents), expected, rtol=1e-4, atol=1e-5)


def test_decode_rejects_wrong_rank(bundles):
    with pytest.raises(ValueError, match="latents"):
        bundles("tiny-wan").decoder.decode(torch.randn(1, 4, 4, 4))
    with pytest.raises(ValueError, match="latents"):
        bundles("tiny-sd3").decoder.decode(torch.randn(1, 4, 1, 8, 8))


def test_scaling_statistics_are_the_published_ones(bundles):
    assert bundles("tiny-sd3").spec.vae_scaling_factor == 1.5305
    assert bundles("tiny-sd3").spec.vae_shift_factor == 0.0609
    assert bundles("tiny-flux").spec.vae_scaling_factor == 0.3611
    assert bundles("tiny-hunyuan-video").spec.vae_scaling_factor == 0.476986
    assert bundles("tiny-wan").spec.vae_latents_std[0] == 2.8184
