"""A video reward: per-frame PickScore averaged over frames, plus VBench's temporal-consistency term.

``r(video) = mean_t PickScore(frame_t, prompt) + temporal_weight · C(video)`` where

* PickScore (Kirstain et al., arXiv 2305.01569) is scaled as FlowGRPO scales it (``logit_scale.exp() ·
  cos / 26``, digenrl/rewards/pickscore.py); averaging an image reward over a video's frames is how the
  FlowGRPO/DanceGRPO video recipes apply image rewards (flow_grpo/rewards.py ``video_ocr_score``);
* ``C`` is VBench's consistency score (Huang et al., "VBench: Comprehensive Benchmark Suite for Video
  Generative Models", CVPR 2024, arXiv 2311.17982; github.com/Vchitect/VBench
  vbench/background_consistency.py, the same formula as its subject_consistency.py):
  ``C = 1/(F−1) · Σ_{t=2..F} ½ (max(0, cos(e_{t−1}, e_t)) + max(0, cos(e_1, e_t)))`` over unit image
  embeddings ``e_t`` of the frames, in ``[0, 1]``; 1 for a static video, lower as the content drifts or
  flickers. A one-frame input (an image) has no pair: ``C = 1``. VBench embeds frames with CLIP ViT-B/32
  (background) or DINO ViT-B/16 (subject); here the frames' PickScore CLIP image embeddings, already
  computed for the first term, serve, so the term costs no extra forward.

``temporal_weight`` (default 1.0; no published recipe fixes it) trades the two; with 0 the reward is the
frame-averaged PickScore. The score term alone rewards good frames even if they do not form a video; the
consistency term alone rewards a still image; together they ask for good frames that hold together.

* ``reward.weights_path=/dir``: PickScore's local directory (as ``reward=pickscore``: ``CLIPModel``
  ``save_pretrained`` of PickScore_v1 with the CLIP-H/14 tokenizer and image processor);
* unset: random weights at the PickScore_v1 size (open_clip ViT-H-14's shape; a warning), for cost
  measurements;
* ``tiny-video-pickscore``: a 2 + 2-layer CLIP for CPU tests.

The reward scores a video's frames together (``scores_whole_videos``), so it runs where the decoded video
is; the ``remote`` reward's wire format carries frames, not videos.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from digenrl.rewards.base import PromptMetadata, RewardFunction
from digenrl.rewards.clip_backbone import ClipImageTransform, LocalClip
from digenrl.rewards.clipscore import TINY_CLIP
from digenrl.rewards.hpsv2 import OPEN_CLIP_VIT_H_14
from digenrl.rewards.local_weights import FULL_LAYOUT, check_batch_size, warn_random_weights
from digenrl.rewards.pickscore import pickscore_from_cosine
from digenrl.rewards.registry import register_reward


def temporal_consistency(embeddings: Tensor) -> Tensor:
    """VBench's consistency of each video from unit frame embeddings ``[B, F, D]`` → ``[B]`` (module
    docstring); 1 where ``F = 1``."""
    if embeddings.shape[1] < 2:
        return torch.ones(embeddings.shape[0], dtype=embeddings.dtype, device=embeddings.device)
    previous = (embeddings[:, 1:] * embeddings[:, :-1]).sum(-1).clamp(min=0)
    first = (embeddings[:, 1:] * embeddings[:, :1]).sum(-1).clamp(min=0)
    return ((previous + first) / 2).mean(dim=1)


@register_reward("video-pickscore")
class VideoPickScore(RewardFunction):
    """Frame-averaged PickScore plus ``temporal_weight`` × VBench consistency (module docstring).

    Args:
        weights_path: PickScore's local directory, or ``None`` for random weights at its size.
        temporal_weight: weight of the consistency term (``>= 0``).
        batch_size: frames per CLIP forward.
    """

    needs_weights = True
    weights_optional = True
    weights_layout = FULL_LAYOUT
    scores_whole_videos = True
    architecture: dict[str, Any] = OPEN_CLIP_VIT_H_14

    def __init__(
        self,
        weights_path: str | os.PathLike[str] | None = None,
        device: torch.device | str = "cpu",
        *,
        temporal_weight: float = 1.0,
        dtype: torch.dtype = torch.float32,
        batch_size: int = 32,
        seed: int = 0,
    ) -> None:
        super().__init__(device)
        if not temporal_weight >= 0:
            raise ValueError(f"temporal_weight must be >= 0, got {temporal_weight!r}")
        self.temporal_weight = float(temporal_weight)
        self.batch_size = check_batch_size(batch_size)
        if weights_path is None:
            size = self.architecture["vision_config"]["image_size"]
            transform = ClipImageTransform.resize_and_crop(size)
            self.clip = LocalClip.random(
                self.architecture, transform, seed=seed, device=self.device, dtype=dtype
            )
            warn_random_weights(self.name, self.num_parameters(), "PickScore_v1 (CLIPModel save_pretrained)")
        else:
            self.clip = LocalClip.load(weights_path, device=self.device, dtype=dtype)

    def save_pretrained(self, directory: str | os.PathLike[str]) -> Path:
        """Write model, tokenizer and image processor so ``weights_path=directory`` loads this reward."""
        return self.clip.save_pretrained(directory)

    def parts(self, videos: Tensor, prompts: list[str]) -> tuple[Tensor, Tensor]:
        """``(frame-averaged PickScore [B], consistency [B])`` of ``videos`` ``[B, 3, F, H, W]``."""
        batch, frames = videos.shape[0], videos.shape[2]
        flat = videos.transpose(1, 2).reshape(batch * frames, *videos.shape[1:2], *videos.shape[-2:])
        image = self.clip.batched_image_embeddings(flat, self.batch_size)
        text = self.clip.prompt_embeddings(prompts, self.batch_size)
        cosine = (image.view(batch, frames, -1) * text[:, None]).sum(-1)
        pickscore = pickscore_from_cosine(self.clip, cosine)
        return pickscore.mean(dim=1), temporal_consistency(image.view(batch, frames, -1))

    @torch.no_grad()
    def score_videos(self, videos: Tensor, prompts: list[str], metadata: list[PromptMetadata]) -> Tensor:
        score, consistency = self.parts(videos, prompts)
        return score + self.temporal_weight * consistency

    def score_images(self, images: Tensor, prompts: list[str]) -> Tensor:
        return self.score_videos(images[:, :, None], prompts, [{} for _ in prompts])


@register_reward("tiny-video-pickscore")
class TinyVideoPickScore(VideoPickScore):
    """:class:`VideoPickScore` with a 2 + 2-layer CLIP (CPU tests); loads directories alike."""

    architecture = TINY_CLIP
