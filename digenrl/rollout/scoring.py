"""Decode finished trajectories and score them (generator side, off the trainer's critical path)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from digenrl.data.trajectory import TrajectoryBatch
from digenrl.models.vae import LatentDecoder
from digenrl.rewards.base import RewardFunction
from digenrl.rewards.nonfinite import check_finite_rewards
from digenrl.rewards.registry import CompositeReward
from digenrl.runtime.reproducibility.batch_ledger import BatchLedger, sample_keys


@dataclass
class ScoreResult:
    rewards: torch.Tensor  # [B] float32 (non-finite entries of dropped groups replaced by 0)
    keep: torch.Tensor  # [B] bool: False for samples of a group dropped for a non-finite reward

    @classmethod
    def cat(cls, parts: list[ScoreResult]) -> ScoreResult:
        return cls(rewards=torch.cat([p.rewards for p in parts]), keep=torch.cat([p.keep for p in parts]))


class Scorer:
    """VAE decode + reward, in chunks of ``decode_batch`` samples; non-finite rewards are handled by
    ``nonfinite_policy`` (``drop-group`` or ``abort``), see :mod:`digenrl.rewards.nonfinite`.

    ``metadata``: prompt text → what the prompt set gives that prompt beside its text
    (:func:`digenrl.data.prompts.metadata_lookup`), handed to the reward with the prompts; prompts not in
    it get an empty mapping."""

    def __init__(
        self,
        decoder: LatentDecoder,
        reward: RewardFunction,
        nonfinite_policy: str,
        decode_batch: int = 0,
        metadata: Mapping[str, Mapping[str, Any]] | None = None,
    ):
        self.decoder = decoder
        self.reward = reward
        self.nonfinite_policy = nonfinite_policy
        self.decode_batch = decode_batch
        self.metadata = dict(metadata or {})
        self.ledger: BatchLedger | None = None  # runtime.record_batches: the decode calls' batches

    @torch.no_grad()
    def __call__(self, batch: TrajectoryBatch) -> ScoreResult:
        if batch.final_latents is None:
            raise ValueError("the batch carries no final latents to decode")
        b = batch.batch_size
        chunk = self.decode_batch or b
        rewards = []
        for start in range(0, b, chunk):
            stop = min(start + chunk, b)
            if self.ledger is not None:
                keys = sample_keys(
                    batch.prompt_ids[start:stop].tolist(), batch.sample_ids[start:stop].tolist()
                )
                self.ledger.record("decode", batch.iteration, "samples", keys)
            images = self.decoder.decode(batch.final_latents[start:stop])
            prompts = batch.prompts[start:stop]
            metadata = [self.metadata.get(p, {}) for p in prompts]
            rewards.append(self.reward(images, prompts, metadata).float().cpu())
        raw = torch.cat(rewards)
        checked, keep = check_finite_rewards(
            raw, batch.prompts, batch.prompt_ids.cpu(), self.nonfinite_policy
        )
        return ScoreResult(rewards=torch.where(keep, checked, torch.zeros_like(checked)), keep=keep)

    @torch.no_grad()
    def score_terms(
        self, latents: torch.Tensor, prompts: list[str]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Decode ``latents`` and score them term by term, for evaluation: (pixels in [0, 1] on the CPU,
        ``{"reward": the configured reward, <part name>: the part's unweighted reward, …}``, each ``[B]``
        float32 on the CPU). A weighted sum (``reward.weights``) reports every part and their weighted sum,
        computed once per part; a single reward is its own one term. Non-finite values stay as they are
        (an evaluation drops nothing; the metrics log them as null)."""
        images = self.decoder.decode(latents)
        metadata = [self.metadata.get(p, {}) for p in prompts]
        if not isinstance(self.reward, CompositeReward):
            return images.cpu(), {"reward": self.reward(images, prompts, metadata).float().cpu()}
        terms = {
            name: part.float().cpu()
            for name, part in self.reward.score_parts(images, prompts, metadata).items()
        }
        total = sum(weight * terms[reward.name] for reward, weight in self.reward.parts)
        return images.cpu(), {"reward": total, **terms}
