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
from digenrl.rewards.registry import register_reward

PICKSCORE_NORMALIZER = 26.0  # flow_grpo/pickscore_scorer.py: scores = scores / 26


@register_reward("pickscore")
class PickScore(RewardFunction):
    """PickScore of each image for its prompt, batched (``batch_size`` images per forward), no grad."""

    needs_weights = True

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
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not normalizer > 0:
            raise ValueError(f"normalizer must be positive (FlowGRPO uses 26), got {normalizer!r}")
        self.clip = LocalClip.load(
            weights_path, processor_path=processor_path, device=self.device, dtype=dtype
        )
        self.batch_size = batch_size
        self.normalizer = float(normalizer)

    def to(self, device: torch.device | str) -> PickScore:
        self.clip.to(device)
        return super().to(device)

    @torch.no_grad()
    def score_images(self, images: Tensor, prompts: list[str]) -> Tensor:
        # GRPO groups (and video frames) repeat prompts: embed each distinct prompt once.
        distinct = list(dict.fromkeys(prompts))
        text_embeds = torch.cat(
            [
                self.clip.text_embeddings(distinct[start : start + self.batch_size])
                for start in range(0, len(distinct), self.batch_size)
            ]
        )
        row_of_prompt = {prompt: row for row, prompt in enumerate(distinct)}
        rows = torch.tensor([row_of_prompt[p] for p in prompts], device=text_embeds.device)
        image_embeds = torch.cat(
            [
                self.clip.image_embeddings(images[start : start + self.batch_size])
                for start in range(0, images.shape[0], self.batch_size)
            ]
        )
        cosine = (image_embeds * text_embeds[rows]).sum(dim=-1)
        return self.clip.model.logit_scale.float().exp() * cosine / self.normalizer
