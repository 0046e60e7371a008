"""The video reward (``video-pickscore``): VBench's consistency term against a hand computation, the
frame-averaged PickScore term against the image ``pickscore`` reward on the same weights, a still video
scoring as its frame, the save → from_pretrained round trip, whole videos reaching it inside a weighted
sum, and a non-finite frame making its sample NaN."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from digenrl.rewards import build_reward
from digenrl.rewards.registry import CompositeReward
from digenrl.rewards.video import temporal_consistency


def test_temporal_consistency_by_hand() -> None:
    e1, e2 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    # t=2: cos(e1, e2) = 0 with both the previous and the first frame -> 0; t=3: previous 0, first 1 -> 0.5
    assert temporal_consistency(torch.stack([e1, e2, e1])[None]).item() == pytest.approx(0.25)
    assert temporal_consistency(torch.stack([e1, e1, e1])[None]).item() == pytest.approx(1.0)  # still video
    assert temporal_consistency(torch.stack([e1, -e1])[None]).item() == 0.0  # negative cosines clamp at 0
    diagonal = torch.tensor([0.6, 0.8])  # cos with e1 = 0.6
    assert temporal_consistency(torch.stack([e1, diagonal])[None]).item() == pytest.approx(0.6)
    assert temporal_consistency(torch.stack([e1])[None, :]).item() == 1.0  # one frame: no pair


def test_tiny_video_reward(tmp_path: Path) -> None:
    reward = build_reward("tiny-video-pickscore")
    generator = torch.Generator().manual_seed(0)
    videos = torch.rand(2, 3, 4, 32, 32, generator=generator)
    prompts = ["a cat", "a dog"]
    scores = reward(videos, prompts)
    assert scores.shape == (2,) and bool(torch.isfinite(scores).all())
    pickscore, consistency = reward.parts(videos, prompts)
    assert torch.allclose(scores, pickscore + consistency)
    assert bool((consistency < 1).all()) and bool((consistency > 0).all())  # random frames drift
    # a still video: consistency 1, and the frame term is its frame's score
    still = videos[:, :, :1].expand(-1, -1, 4, -1, -1).contiguous()
    assert torch.allclose(reward(still, prompts), reward(videos[:, :, 0], prompts), atol=1e-6)
    assert torch.allclose(reward.parts(still, prompts)[1], torch.ones(2), atol=1e-6)
    # the frame term is the image PickScore reward averaged over frames, on the same weights
    reward.save_pretrained(tmp_path / "w")
    loaded = build_reward("tiny-video-pickscore", weights_path=str(tmp_path / "w"))
    assert torch.allclose(loaded(videos, prompts), scores, atol=1e-6)
    image_pickscore = build_reward("pickscore", weights_path=str(tmp_path / "w"))
    assert torch.allclose(image_pickscore(videos, prompts), pickscore, atol=1e-6)
    # a weighted sum hands the video whole to it (the consistency term needs the frames together)
    both = CompositeReward.from_spec({"tiny-video-pickscore": 1.0, "brightness": 0.5})
    both.parts[0] = (reward, 1.0)
    expected = scores + 0.5 * build_reward("brightness")(videos, prompts)
    assert torch.allclose(both(videos, prompts), expected, atol=1e-6)
    # a non-finite frame: that sample is NaN, the other scored
    broken = videos.clone()
    broken[1, :, 2, 0, 0] = float("nan")
    out = reward(broken, prompts)
    assert torch.isnan(out[1]) and torch.allclose(out[0], scores[0])
    with pytest.raises(ValueError, match="temporal_weight must be >= 0"):
        build_reward("tiny-video-pickscore", temporal_weight=-1.0)
