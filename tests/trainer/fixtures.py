"""Shared builders for the trainer tests: a tiny SD3 flow model, its sampler and on-policy trajectories."""

from __future__ import annotations

import torch

from digenrl.config import Config, apply_overrides
from digenrl.data.trajectory import TrajectoryBatch
from digenrl.models import TextCondition, build_flow_model
from digenrl.rollout.sampler import Sampler

MODEL = "tiny-sd3"
HEIGHT = WIDTH = 32
TEXT_LEN = 6


def make_config(*overrides: str) -> Config:
    """Defaults for tests: LoRA r=4, no CFG (one forward per unit), large lr so updates are visible."""
    base = [
        f"model.name={MODEL}",
        "trainer.lora_rank=4",
        "trainer.lora_alpha=8",
        "trainer.lr=0.01",
        "trainer.micro_batch_size=4",
        "trainer.backend=auto",
        "sampler.guidance_scale=1.0",
        "sampler.num_steps=4",
        "algo.clip_range=0.2",
    ]
    return apply_overrides(Config(), [*base, *overrides])


def build_model(seed: int = 0, dtype: torch.dtype = torch.float32):
    torch.manual_seed(seed)
    return build_flow_model(MODEL, dtype=dtype)


def make_sampler(cfg: Config, flow_model) -> Sampler:
    return Sampler.from_config(cfg, flow_model.spec, flow_model.token_count(HEIGHT, WIDTH))


def random_cond(n: int, generator: torch.Generator) -> TextCondition:
    return TextCondition(
        embeds=torch.randn(n, TEXT_LEN, 32, generator=generator),
        pooled=torch.randn(n, 32, generator=generator),
    )


def empty_cond() -> TextCondition:
    g = torch.Generator().manual_seed(12345)
    return random_cond(1, g)


@torch.no_grad()
def rollout_batch(
    flow_model,
    sampler: Sampler,
    *,
    batch_size: int,
    num_train_steps: int,
    seed: int,
    uncond: TextCondition | None = None,
    iteration: int = 0,
    cond: TextCondition | None = None,
) -> TrajectoryBatch:
    """On-policy trajectories: all samples go through one forward per step (the rollout composition);
    the first ``num_train_steps`` transitions are recorded as trained units. Advantages are random.
    ``cond``: the samples' condition (default: random SD3-shaped embeddings)."""
    g = torch.Generator().manual_seed(seed)
    shape = flow_model.latent_shape(HEIGHT, WIDTH)
    cond = random_cond(batch_size, g) if cond is None else cond
    x = torch.randn(batch_size, *shape, generator=g)
    lat, nxt, logp, sig, nsig = [], [], [], [], []
    for k in range(num_train_steps):
        s = sampler.sigmas[k].expand(batch_size).contiguous()
        sn = sampler.sigmas[k + 1].expand(batch_size).contiguous()
        v = sampler.velocity(flow_model, x, s, cond, uncond)
        noise = torch.randn(batch_size, *shape, generator=g)
        res = sampler.transition(v, x, s, sn, noise=noise)
        lat.append(x)
        nxt.append(res.prev_sample)
        logp.append(res.log_prob)
        sig.append(s)
        nsig.append(sn)
        x = res.prev_sample
    b = batch_size
    return TrajectoryBatch(
        prompts=[f"prompt {i}" for i in range(b)],
        prompt_ids=torch.arange(b) // 2,
        sample_ids=torch.arange(b) % 2,
        seeds=torch.arange(b) + 1000 * seed,
        cond=cond,
        latents=torch.stack(lat, 1),
        next_latents=torch.stack(nxt, 1),
        log_probs=torch.stack(logp, 1),
        step_indices=torch.arange(num_train_steps).expand(b, -1).clone(),
        sigmas=torch.stack(sig, 1),
        next_sigmas=torch.stack(nsig, 1),
        policy_version=torch.zeros(b, dtype=torch.long),
        iteration=iteration,
        advantages=torch.randn(b, generator=g),
    )


def trainable_snapshot(trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.trainable_state_dict().items()}


def grads_by_name(trainer) -> dict[str, torch.Tensor]:
    return {
        n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
        for n, p in trainer.backend.named_trainable()
        if p.grad is not None
    }


def select(batch: TrajectoryBatch, index: list[int]) -> TrajectoryBatch:
    return batch.select(index)


def perturb_adapter(flow_model, scale: float = 0.05, seed: int = 7) -> None:
    """Give lora_B non-zero values (it starts at zero), so that the adapter changes the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in flow_model.transformer.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
