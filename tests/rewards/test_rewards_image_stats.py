"""Brightness (BT.601 luma) and Hasler–Süsstrunk colourfulness vs float64 numpy references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from digenrl.rewards import build_reward


def reference_brightness(images: np.ndarray) -> np.ndarray:
    r, g, b = images[:, 0], images[:, 1], images[:, 2]
    return (0.299 * r + 0.587 * g + 0.114 * b).mean(axis=(1, 2))


def reference_colorfulness(images: np.ndarray) -> np.ndarray:
    out = []
    for img in images:
        r, g, b = img[0].ravel(), img[1].ravel(), img[2].ravel()
        rg = r - g
        yb = 0.5 * (r + g) - b
        std_root = np.sqrt(np.std(rg) ** 2 + np.std(yb) ** 2)
        mean_root = np.sqrt(np.mean(rg) ** 2 + np.mean(yb) ** 2)
        out.append(std_root + 0.3 * mean_root)
    return np.array(out)


def test_brightness_matches_bt601_reference() -> None:
    images = torch.rand(4, 3, 9, 7)
    scores = build_reward("brightness")(images, ["p"] * 4)
    assert scores.dtype == torch.float32 and scores.shape == (4,)
    np.testing.assert_allclose(scores.numpy(), reference_brightness(images.double().numpy()), atol=1e-6)
    black_white = torch.stack([torch.zeros(3, 4, 4), torch.ones(3, 4, 4)])
    extremes = build_reward("brightness")(black_white, ["a", "b"])
    np.testing.assert_allclose(extremes.numpy(), [0.0, 1.0], atol=1e-6)


def test_colorfulness_matches_hasler_susstrunk_reference() -> None:
    images = torch.rand(3, 3, 8, 11)
    scores = build_reward("colorfulness")(images, ["p"] * 3)
    np.testing.assert_allclose(scores.numpy(), reference_colorfulness(images.double().numpy()), atol=1e-6)


def test_colorfulness_known_values() -> None:
    gray = torch.rand(1, 1, 6, 6).expand(1, 3, 6, 6)
    red = torch.zeros(1, 3, 6, 6)
    red[:, 0] = 1.0
    scores = build_reward("colorfulness")(torch.cat([gray, red]), ["g", "r"])
    # gray: rg = yb = 0 everywhere → 0. Pure red: rg = 1, yb = 0.5, σ = 0 → 0.3·sqrt(1.25).
    np.testing.assert_allclose(scores.numpy(), [0.0, 0.3 * np.sqrt(1.25)], atol=1e-6)


def test_video_brightness_is_mean_over_frames() -> None:
    video = torch.rand(2, 3, 4, 5, 5)
    scores = build_reward("brightness")(video, ["a", "b"])
    per_frame = reference_brightness(video.double().permute(0, 2, 1, 3, 4).reshape(8, 3, 5, 5).numpy())
    np.testing.assert_allclose(scores.numpy(), per_frame.reshape(2, 4).mean(axis=1), atol=1e-6)


@pytest.mark.parametrize(
    ("images", "prompts", "match"),
    [
        (torch.rand(2, 4, 8, 8), ["a", "b"], "shape"),
        (torch.rand(2, 3, 8), ["a", "b"], "shape"),
        (torch.randint(0, 255, (2, 3, 8, 8)), ["a", "b"], "floating-point"),
        (torch.rand(2, 3, 8, 8), ["a"], "prompts has length 1"),
        (torch.rand(2, 3, 8, 8), ["a", 3], "list\\[str\\]"),
    ],
)
def test_bad_inputs_are_rejected(images: torch.Tensor, prompts: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_reward("brightness")(images, prompts)
