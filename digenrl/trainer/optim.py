"""The optimizer of the policy update: AdamW over the trainable parameters only.

Defaults (TrainerConfig) follow flow_grpo config/base.py and scripts/train_sd3.py: AdamW, betas
(0.9, 0.999), weight decay 1e-4, eps 1e-8; lr 3e-4 for LoRA, 1e-5 for a full fine-tune
(docs/algorithm.md, "Loss").
Frozen parameters are never handed to AdamW: decoupled weight decay would otherwise still move them.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from digenrl.config import TrainerConfig


def build_optimizer(params: Iterable[nn.Parameter], cfg: TrainerConfig) -> torch.optim.AdamW:
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        raise ValueError(
            "no trainable parameters: apply LoRA (trainer.mode=lora) or unfreeze (trainer.mode=full)"
        )
    if len(cfg.betas) != 2:
        raise ValueError(f"trainer.betas must hold two numbers, got {cfg.betas}")
    if cfg.lr <= 0:
        raise ValueError(f"trainer.lr must be > 0, got {cfg.lr}")
    return torch.optim.AdamW(
        trainable,
        lr=cfg.lr,
        betas=(float(cfg.betas[0]), float(cfg.betas[1])),
        weight_decay=cfg.weight_decay,
        eps=cfg.eps,
    )
