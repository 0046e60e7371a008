"""JPEG (in)compressibility rewards vs an independent Pillow computation (DDPO definition)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from digenrl.rewards import build_reward


def random_uint8_images(batch: int, height: int = 24, width: int = 20) -> torch.Tensor:
    return torch.randint(0, 256, (batch, 3, height, width), dtype=torch.uint8)


def reference_jpeg_kb(pixels: np.ndarray) -> float:
    """DDPO: uint8 HWC → PIL JPEG quality 95 in memory → bytes / 1000."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=95)
    return len(buffer.getvalue()) / 1000.0


def reference_batch_kb(images_uint8: torch.Tensor) -> np.ndarray:
    return np.array([reference_jpeg_kb(img.permute(1, 2, 0).numpy()) for img in images_uint8])


def test_incompressibility_matches_pillow_size_in_kb() -> None:
    images_uint8 = random_uint8_images(3)
    images = images_uint8.float() / 255.0
    reward = build_reward("jpeg-incompressibility")
    scores = reward(images, ["a", "b", "c"])
    assert scores.dtype == torch.float32 and scores.shape == (3,)
    np.testing.assert_allclose(scores.numpy(), reference_batch_kb(images_uint8), rtol=0, atol=1e-6)


def test_compressibility_is_negative_size_and_scale_applies() -> None:
    images_uint8 = random_uint8_images(2)
    images = images_uint8.float() / 255.0
    expected_kb = reference_batch_kb(images_uint8)
    compress = build_reward("jpeg-compressibility")(images, ["x", "y"])
    np.testing.assert_allclose(compress.numpy(), -expected_kb, atol=1e-6)
    assert (compress < 0).all()
    flow_grpo = build_reward("jpeg-compressibility", scale=1 / 500)(images, ["x", "y"])
    np.testing.assert_allclose(flow_grpo.numpy(), -expected_kb / 500, atol=1e-7)
    incompress = build_reward("jpeg-incompressibility", scale=0.25)(images, ["x", "y"])
    np.testing.assert_allclose(incompress.numpy(), expected_kb * 0.25, atol=1e-6)


def test_flat_image_is_more_compressible_than_noise() -> None:
    flat = torch.full((1, 3, 32, 32), float(torch.rand(())))
    noise = torch.rand(1, 3, 32, 32)
    images = torch.cat([flat, noise])
    compress = build_reward("jpeg-compressibility")(images, ["p", "p"])
    incompress = build_reward("jpeg-incompressibility")(images, ["p", "p"])
    assert compress[0] > compress[1]
    assert incompress[0] < incompress[1]


def test_out_of_range_pixels_are_clamped_like_ddpo() -> None:
    images_uint8 = random_uint8_images(2)
    images = images_uint8.float() / 255.0
    overshoot = images.clone()
    overshoot[images_uint8 == 255] += 0.3
    overshoot[images_uint8 == 0] -= 0.3
    reward = build_reward("jpeg-incompressibility")
    expected = reference_batch_kb(images_uint8)
    np.testing.assert_allclose(reward(overshoot, ["a", "b"]).numpy(), expected, atol=1e-6)


def test_video_reward_is_mean_over_frames() -> None:
    batch, frames = 2, 3
    video_uint8 = torch.randint(0, 256, (batch, 3, frames, 16, 16), dtype=torch.uint8)
    video_uint8[0, :, 1] = 128  # one flat frame so the frame sizes differ strongly
    scores = build_reward("jpeg-incompressibility")(video_uint8.float() / 255.0, ["a", "b"])
    expected = [
        np.mean([reference_jpeg_kb(video_uint8[b, :, f].permute(1, 2, 0).numpy()) for f in range(frames)])
        for b in range(batch)
    ]
    np.testing.assert_allclose(scores.numpy(), expected, atol=1e-6)


def test_nonfinite_pixels_give_nan_for_that_sample_only() -> None:
    images = torch.rand(3, 3, 16, 16)
    images[1, 0, 3, 4] = float("nan")
    scores = build_reward("jpeg-compressibility")(images, ["a", "b", "c"])
    assert torch.isnan(scores[1])
    assert torch.isfinite(scores[[0, 2]]).all()


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), "1"])
def test_invalid_scale_is_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="scale"):
        build_reward("jpeg-compressibility", scale=bad)
