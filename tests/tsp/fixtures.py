"""A real tiny SD3 bundle and rollout engines over it, shared by the TSP and GAP tests."""

from __future__ import annotations

import functools

import torch

from digenrl.config import Config, apply_overrides
from digenrl.models import ModelBundle, build_model_bundle
from digenrl.rollout.engine import RolloutEngine
from digenrl.rollout.sampler import Sampler

MODEL = "tiny-sd3"
HEIGHT = WIDTH = 32
PROMPTS = ["a red cube", "a cat on a mat", "two dogs", "a blue sky", "an empty room", "a tree"]


@functools.cache
def bundle() -> ModelBundle:
    """Built once per test process (the text encoder dominates its ~4 s); never trained in place."""
    torch.manual_seed(0)
    return build_model_bundle(MODEL)


def make_config(*overrides: str) -> Config:
    base = [f"model.name={MODEL}", "sampler.num_steps=6", "algo.group_size=2", "algo.timestep_fraction=0.5"]
    return apply_overrides(Config(), [*base, *overrides])


def make_engine(cfg: Config, *, flow_model=None, seed: int | None = None) -> RolloutEngine:
    """An engine as ``systems.components`` builds it; ``flow_model`` defaults to the shared bundle's."""
    b = bundle()
    model = b.flow_model if flow_model is None else flow_model
    sampler = Sampler.from_config(cfg, b.spec, model.token_count(HEIGHT, WIDTH))
    return RolloutEngine(
        model,
        b.text_encoder,
        sampler,
        latent_shape=model.latent_shape(HEIGHT, WIDTH),
        group_size=cfg.algo.group_size,
        seed=cfg.seed if seed is None else seed,
        **RolloutEngine.algo_settings(cfg.algo),
        samples_per_forward=cfg.sampler.samples_per_forward,
    )
