"""Hand-made cost models for simulator tests: every table is linear through zero (time ∝ batch), so the
per-sample / per-unit costs are exact constants and expected timelines can be written by hand."""

from __future__ import annotations

from digenrl.costs.cost_model import CostModel


def linear(per_item: float) -> dict[int, float]:
    """Two points on t = per_item · batch; interpolation and extrapolation stay on that line."""
    return {1: per_item, 2: 2 * per_item}


def toy_costs(
    *,
    step: float = 0.125,
    decode: float = 0.0,
    reward: float = 0.0,
    unit: float = 0.0,
    optimizer: float = 0.0,
    switch: float = 0.0,
    fragment_bytes: int = 0,
    unit_bytes: int = 0,
    cond_bytes: int = 0,
    latent_bytes: int = 0,
    sync_bytes: int = 0,
    grad_bytes: int = 0,
    optimizer_bytes: int = 0,
    device: str = "toy",
) -> CostModel:
    """``step``: seconds per sample per denoising step; ``unit``: seconds per training unit; the same for
    guidance on and off."""
    both = {"cfg": linear(step), "no_cfg": linear(step)}
    return CostModel(
        device=device,
        model="toy",
        generator_step_points=both,
        vae_decode_points=linear(decode),
        reward_points=linear(reward),
        train_points={"cfg": linear(unit), "no_cfg": linear(unit)},
        optimizer_step_s=optimizer,
        weight_sync_bytes=sync_bytes,
        grad_bytes=grad_bytes,
        fragment_bytes_per_sample=fragment_bytes,
        unit_bytes=unit_bytes,
        cond_bytes_per_sample=min(cond_bytes, fragment_bytes),
        latent_bytes_per_sample=latent_bytes,
        param_bytes=0,
        optimizer_bytes=optimizer_bytes,
        switch_sync_s=switch,
    )
