"""Shared pieces of the export tests: the project's trained model as a checkpoint, fixed inputs, and the
diffusers pipelines of the tiny models built around a base transformer (no text encoders: the inputs are
text conditions already)."""

from __future__ import annotations

from pathlib import Path

import diffusers
import torch

from digenrl.config import Config, load_config
from digenrl.models import ModelBundle, build_model_bundle
from digenrl.models.flow_model import FlowModel
from digenrl.rollout.sampler import Sampler
from digenrl.trainer import PolicyTrainer, load_latest_checkpoint
from digenrl.trainer.checkpoint import save_checkpoint

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "experiments" / "configs" / "tiny.yaml"
#: the tiny models' diffusers pipelines and their text components (left out: conditions are given)
PIPELINES = {
    "tiny-sd3": (
        diffusers.StableDiffusion3Pipeline,
        ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "text_encoder_3", "tokenizer_3"),
    ),
    "tiny-flux": (diffusers.FluxPipeline, ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")),
}

Inputs = tuple  # (latents, sigma, text condition)


def run_config(model: str, *overrides: str) -> Config:
    """experiments/configs/tiny.yaml (LoRA r=8, alpha=16) on one CPU process."""
    return load_config(TINY, [f"model={model}", "system=colocated-sync", "profile=cpu-1", *overrides])


def project_trainer(cfg: Config) -> tuple[PolicyTrainer, ModelBundle]:
    """A trainer built as a training rank builds it (digenrl/systems/components.py): the run's seeded base
    model, then the policy trainer."""
    bundle = build_model_bundle(cfg.model.name, device="cpu", seed=cfg.seed)
    h, w = bundle.spec.default_height, bundle.spec.default_width
    sampler = Sampler.from_config(cfg, bundle.spec, bundle.flow_model.token_count(h, w))
    return PolicyTrainer(cfg, bundle.flow_model, sampler, uncond=None, device="cpu"), bundle


def train_with_random_gradients(trainer: PolicyTrainer, steps: int, seed: int = 5) -> None:
    """Real optimizer steps (AdamW, EMA) on random gradients: trained weights without generating data."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in trainer.backend.trainable_parameters():
            p.grad = torch.randn(p.shape, generator=g) * 0.05
        trainer.step()


def save_as_a_run(out: Path, cfg: Config, trainer: PolicyTrainer, step: int) -> None:
    """A checkpoint with the payload a run writes (digenrl/systems/base.py ``checkpoint_payload``)."""
    payload = {
        "next_iteration": step,
        "policy_version": step,
        "trainer": trainer.state_dict(),
        "run_id": "test-run",
        "config": cfg.to_dict(),
        "inputs": {},
    }
    save_checkpoint(out, step, payload, rank=0, is_writer=True)


def resumed_trainer(run: Path) -> tuple[PolicyTrainer, ModelBundle]:
    """The project's trained model of a run folder: a trainer resumed from its latest checkpoint."""
    checkpoint = load_latest_checkpoint(run)
    cfg = load_config(None, checkpoint["config"])
    trainer, bundle = project_trainer(cfg)
    trainer.load_state_dict(checkpoint["trainer"], checkpoint_dir=checkpoint["path"])
    return trainer, bundle


def inputs(bundle: ModelBundle) -> Inputs:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(
        2, *bundle.flow_model.latent_shape(bundle.spec.default_height, bundle.spec.default_width), generator=g
    )
    return x, torch.tensor([0.8, 0.35]), bundle.text_encoder.encode(["a red cube on a table", "two cats"])


def velocity(spec, transformer: torch.nn.Module, given: Inputs) -> torch.Tensor:
    """The project's velocity convention (FlowModel) over any transformer, e.g. one diffusers loaded."""
    with torch.no_grad():
        return FlowModel(spec, transformer)(*given)


def trained_velocity(trainer: PolicyTrainer, given: Inputs, *, ema: bool = False) -> torch.Tensor:
    with torch.no_grad():
        if ema:
            with trainer.ema_weights():
                return trainer.flow_model(*given)
        return trainer.flow_model(*given)


def base_pipeline(cfg: Config):
    """The model's diffusers pipeline around the run's base transformer, rebuilt from its seed."""
    cls, text_parts = PIPELINES[cfg.model.name]
    bundle = build_model_bundle(cfg.model.name, device="cpu", seed=cfg.seed)
    return cls(
        transformer=bundle.flow_model.transformer,
        vae=bundle.decoder.vae,
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
        **dict.fromkeys(text_parts),
    )
