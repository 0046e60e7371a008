"""PickScore reward (Kirstain et al., "Pick-a-Pic", arXiv 2305.01569), scaled as in FlowGRPO.

score = logit_scale.exp() · cos(text_emb, image_emb) / 26, with the CLIP projected embeddings
(flow_grpo/pickscore_scorer.py ``PickScoreScorer.__call__``: L2-normalise both embeddings, multiply by
``logit_scale.exp()``, take the diagonal, divide by 26 "to 0-1"). ``normalizer`` exposes the 26.

Weights directory layout (``reward.weights_path``, local; loaded with ``from_pretrained``):

    <weights_path>/config.json, model.safetensors   CLIPModel.save_pretrained of PickScore_v1 (CLIP-H/14)
    <weights_path>/preprocessor_config.json         CLIP image processor (224 px, OpenAI CLIP mean/std)
    <weights_path>/tokenizer files                  CLIP tokenizer (tokenizer.json / vocab.json+merges.txt)

FlowGRPO loads the processor/tokenizer from the CLIP-H/14 laion2B repository and the model from
PickScore_v1; if yours live apart, pass ``processor_path`` to point at the directory holding them.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from digenrl.rewards.base import RewardFunction
from digenrl.rewards.clip_backbone import LocalClip
from digenrl.rewards.local_weights import FULL_LAYOUT, check_batch_size
from digenrl.rewards.registry import register_reward

PICKSCORE_NORMALIZER = 26.0  # flow_grpo/pickscore_scorer.py: scores = scores / 26


def pickscore_from_cosine(
    clip: LocalClip, cosine: Tensor, normalizer: float = PICKSCORE_NORMALIZER
) -> Tensor:
    """PickScore from cos(text, image): ``logit_scale.exp() · cos / normalizer`` (module docstring)."""
    return clip.model.logit_scale.float().exp() * cosine / normalizer


@register_reward("pickscore")
class PickScore(RewardFunction):
    """PickScore of each image for its prompt, batched (``batch_size`` images per forward), no grad."""

    needs_weights = True
    weights_layout = FULL_LAYOUT  # from a run's config the processor and tokenizer sit beside the model

    def __init__(
        self,
        weights_path: str | os.PathLike[str],
        device: torch.device | str = "cpu",
        *,
        processor_path: str | os.PathLike[str] | None = None,
        dtype: torch.dtype = torch.float32,
        batch_size: int = 32,
        normalizer: float = PICKSCORE_NORMALIZER,
    ) -> None:
        super().__init__(device)
        if not normalizer > 0:
            raise ValueError(f"normalizer must be positive (FlowGRPO uses 26), got {normalizer!r}")
        self.clip = LocalClip.load(
            weights_path, processor_path=processor_path, device=self.device, dtype=dtype
        )
        self.batch_size = check_batch_size(batch_size)
        self.normalizer = float(normalizer)

    @torch.no_grad()
    def score_images(self, images: Tensor, prompts: list[str]) -> Tensor:
        return pickscore_from_cosine(
            self.clip, self.clip.cosine(images, prompts, self.batch_size), self.normalizer
        )
