"""The reward-function contract shared by every DigenRL reward.

A reward maps a batch of decoded images (or videos) and their prompts to one float32 score per sample.
Rewards are black boxes to the RL algorithm (FlowGRPO only needs scalar rewards to build group-relative
advantages, arXiv 2505.05470 §3), so the contract is deliberately small:

* ``images``: float tensor ``[B, 3, H, W]`` with values in ``[0, 1]``; videos are ``[B, 3, F, H, W]``.
* ``prompts``: ``list[str]`` of length ``B``.
* ``metadata`` (optional): ``list[dict]`` of length ``B``, what the prompt set gives each prompt beside its
  text (a ``.jsonl`` prompt file's other fields, docs/rewards.md); e.g. the text an OCR reward expects.
  Rewards that read it override :meth:`RewardFunction.score_batch`; the others never see it.
* result: ``Tensor[B]`` float32 on the device of ``images``.

Videos are scored frame by frame (each frame paired with its sample's prompt) and the per-frame scores
are averaged over ``F``; this is how image rewards are commonly applied to video generators (e.g. the
per-frame OCR reward in flow_grpo/rewards.py ``video_ocr_score``), and it keeps every reward usable for
both modalities without a video-specific implementation. A reward that needs the frames together (a
temporal term) sets ``scores_whole_videos`` and implements :meth:`RewardFunction.score_videos` on
``[B, 3, F, H, W]`` (an image is a one-frame video to it).

Pixels are clamped to ``[0, 1]`` before scoring (decoded VAE outputs overshoot slightly; DDPO's
ddpo_pytorch/rewards.py clamps in the same place). A sample with any non-finite pixel is not scored: its
reward is NaN, so that :func:`digenrl.rewards.nonfinite.check_finite_rewards` reports it instead of the
reward silently scoring garbage (e.g. a NaN cast to uint8 before JPEG encoding).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, Self

import torch
from torch import Tensor

IMAGE_NDIM = 4
VIDEO_NDIM = 5

#: What a prompt carries beside its text (one JSON object per prompt); empty when the set has none.
PromptMetadata = Mapping[str, Any]


class NonFiniteRewardError(RuntimeError):
    """A reward was NaN/inf and the configured policy (``reward.nonfinite_policy = "abort"``) forbids it."""


class RewardFunction(ABC):
    """Base class of all rewards: validates input, flattens videos, guards non-finite pixels.

    Subclasses implement :meth:`score_images` on a clean ``[N, 3, H, W]`` float32 batch and set the class
    attributes ``name`` (the registry name), ``needs_weights`` (True when the reward runs a model with
    weights: it takes ``weights_path``, may live on scorer ranks and has bytes to park) and
    ``weights_optional`` (True when such a reward can also build random weights at its real size without a
    ``weights_path``, as the generators do; see :func:`digenrl.rewards.registry.build_reward`); a reward
    with weights declares the files its directory holds in ``weights_layout``.
    """

    name: str = "reward"
    needs_weights: bool = False
    weights_optional: bool = False
    #: True for a reward that scores a prompt group's samples together (e.g. ranks them against each other):
    #: it needs the whole group in one call, so GAP fragments smaller than a group are refused at start-up
    #: (``gap.fragment_samples``, :func:`digenrl.gap.consumer.check_gap_config`). Every built-in scores
    #: samples independently.
    needs_whole_group: bool = False
    #: The files a ``weights_path`` directory must hold: ``{what: (file, alternative, ...)}``, checked at
    #: start-up and when the reward loads (:func:`digenrl.rewards.local_weights.require_files`).
    weights_layout: Mapping[str, tuple[str, ...]] = {}
    #: True for a reward that scores a video's frames together (:meth:`score_videos`), not frame by frame.
    scores_whole_videos: bool = False

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)

    @abstractmethod
    def score_images(self, images: Tensor, prompts: list[str]) -> Tensor:
        """Score ``images`` ``[N, 3, H, W]`` (float32, finite, in ``[0, 1]``) → ``Tensor[N]``."""

    def score_videos(self, videos: Tensor, prompts: list[str], metadata: list[PromptMetadata]) -> Tensor:
        """Score ``videos`` ``[B, 3, F, H, W]`` (float32, finite, in ``[0, 1]``) → ``Tensor[B]``; what
        :meth:`__call__` uses instead of :meth:`score_batch` when ``scores_whole_videos`` is set."""
        raise NotImplementedError(f"reward {self.name!r} sets scores_whole_videos but has no score_videos")

    def score_batch(self, images: Tensor, prompts: list[str], metadata: list[PromptMetadata]) -> Tensor:
        """What :meth:`__call__` scores with: :meth:`score_images` plus each prompt's metadata. Rewards
        that read metadata (OCR, remote, weighted sums) override this; the default ignores it."""
        return self.score_images(images, prompts)

    @classmethod
    def check_prompts(cls, prompts: list[str], metadata: list[PromptMetadata], key: str) -> None:
        """Raise ``ValueError`` naming ``key`` (the prompt set's config key) when this reward cannot score
        these prompts; called at start-up. Rewards that need something of each prompt override it (the
        OCR reward needs the text to render); the default accepts every prompt."""
        return None

    def to(self, device: torch.device | str) -> Self:
        """Move the reward's models (:meth:`modules`) to ``device``; returns ``self``, as ``nn.Module.to``."""
        for module in self.modules():
            module.to(device)
        self.device = torch.device(device)
        return self

    def num_parameters(self) -> int:
        """Parameters of the reward's models (0 for a pixel reward)."""
        return sum(p.numel() for module in self.modules() for p in module.parameters())

    def modules(self) -> list[torch.nn.Module]:
        """The ``nn.Module`` s this reward holds — its model weights, what a colocated run parks around
        scoring and a cost model counts — found among its attributes and one level inside the helper
        objects it keeps (e.g. a CLIP wrapper). Empty for pixel rewards."""
        found: list[torch.nn.Module] = []
        for value in vars(self).values():
            if isinstance(value, torch.nn.Module):
                found.append(value)
            elif hasattr(value, "__dict__") and not isinstance(value, type):
                found.extend(v for v in vars(value).values() if isinstance(v, torch.nn.Module))
        return list({id(m): m for m in found}.values())

    def __call__(
        self, images: Tensor, prompts: list[str], metadata: Sequence[PromptMetadata] | None = None
    ) -> Tensor:
        frames, frame_prompts, batch, num_frames = flatten_frames(images, prompts)
        frame_metadata = [m for m in check_metadata(metadata, batch) for _ in range(num_frames)]
        finite = torch.isfinite(frames).flatten(1).all(dim=1)
        clean = torch.where(finite[:, None, None, None], frames, 0.0).clamp_(0.0, 1.0)
        if self.scores_whole_videos:
            finite = finite.view(batch, num_frames).all(dim=1)
            videos = clean.view(batch, num_frames, *clean.shape[1:]).transpose(1, 2)
            scores = self.score_videos(videos, list(prompts), check_metadata(metadata, batch))
            if scores.shape != (batch,):
                raise RuntimeError(
                    f"reward {self.name!r} returned shape {tuple(scores.shape)}, expected ({batch},)"
                )
            scores = scores.detach().to(device=images.device, dtype=torch.float32)
            return torch.where(finite.to(images.device), scores, torch.nan)
        scores = self.score_batch(clean, frame_prompts, frame_metadata)
        if scores.shape != (clean.shape[0],):
            raise RuntimeError(
                f"reward {self.name!r} returned shape {tuple(scores.shape)}, expected ({clean.shape[0]},)"
            )
        scores = scores.detach().to(device=images.device, dtype=torch.float32)
        scores = torch.where(finite.to(images.device), scores, torch.nan)
        return scores.view(batch, num_frames).mean(dim=1)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, device={str(self.device)!r})"


def check_metadata(metadata: Sequence[PromptMetadata] | None, batch: int) -> list[PromptMetadata]:
    """``metadata`` as one mapping per sample (``None``: empty mappings)."""
    if metadata is None:
        return [{} for _ in range(batch)]
    if isinstance(metadata, str | bytes | Mapping) or not all(isinstance(m, Mapping) for m in metadata):
        raise ValueError("metadata must be a list with one mapping (dict) per prompt, or None")
    if len(metadata) != batch:
        raise ValueError(f"metadata has length {len(metadata)} but images has batch size {batch}")
    return list(metadata)


def flatten_frames(images: Tensor, prompts: list[str]) -> tuple[Tensor, list[str], int, int]:
    """Validate a reward input and flatten videos to frames.

    Returns ``(frames [B·F, 3, H, W] float32, prompt per frame, B, F)`` with ``F = 1`` for images; frames of
    one sample are contiguous so per-sample averaging is a ``view(B, F).mean(1)``.
    """
    if not isinstance(images, Tensor) or not images.is_floating_point():
        raise ValueError(
            f"images must be a floating-point torch.Tensor, got {type(images).__name__}"
            + (f" of dtype {images.dtype}" if isinstance(images, Tensor) else "")
        )
    if images.ndim not in (IMAGE_NDIM, VIDEO_NDIM) or images.shape[1] != 3:
        raise ValueError(
            "images must have shape [B, 3, H, W] (image) or [B, 3, F, H, W] (video), "
            f"got {tuple(images.shape)}"
        )
    if not isinstance(prompts, list | tuple) or not all(isinstance(p, str) for p in prompts):
        raise ValueError("prompts must be a list[str]")
    batch = images.shape[0]
    if len(prompts) != batch:
        raise ValueError(f"prompts has length {len(prompts)} but images has batch size {batch}")
    if images.ndim == IMAGE_NDIM:
        return images.float(), list(prompts), batch, 1
    num_frames = images.shape[2]
    if num_frames == 0:
        raise ValueError("images (video) has zero frames")
    frames = images.float().permute(0, 2, 1, 3, 4).reshape(batch * num_frames, 3, *images.shape[-2:])
    frame_prompts = [p for p in prompts for _ in range(num_frames)]
    return frames, frame_prompts, batch, num_frames
