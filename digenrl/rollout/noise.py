"""Per-sample, per-step noise that does not depend on the schedule that draws it.

Every random draw of a trajectory comes from a ``torch.Generator`` seeded by a hash of
``(seed, iteration, prompt_index, sample_index, step)``, never from a global RNG. A sample therefore
gets the same initial latent and the same SDE noise whether it is generated alone, batched with its
group, batched with other prompts, on another rank, or split across TSP pipeline stages (a stage only
needs the step index to reproduce its draws). The equivalence tests of GAP / TSP / TCSS rely on this.

Draws are device-specific (CUDA's Philox stream differs from the CPU's Mersenne Twister), so two
schedules are comparable bit for bit only on the same device type.
"""

from __future__ import annotations

import torch

from digenrl.data.seeding import mix_seed

INITIAL_NOISE_STEP = -1
"""Step tag of the initial latent x_T ~ N(0, I); SDE step i uses tag i."""
FORWARD_NOISE_STEP = 1 << 20
"""Tag offset of DiffusionNFT's forward-process noise: the unit at step k noises the clean latent with the
draw tagged ``FORWARD_NOISE_STEP + k``, never one of the sampler's (digenrl/algo/nft.py)."""


def sample_seed(seed: int, iteration: int, prompt_index: int, sample_index: int) -> int:
    """The seed that identifies one trajectory: sample ``sample_index`` of prompt ``prompt_index``
    (the prompt's position in iteration ``iteration``'s logical batch) under run seed ``seed``."""
    return mix_seed(seed, iteration, prompt_index, sample_index)


def step_noise(
    sample_seeds: torch.Tensor | list[int],
    step: int,
    shape: tuple[int, ...],
    *,
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Standard-normal noise ``[B, *shape]`` for ``step`` of each trajectory in ``sample_seeds``.

    One generator per sample keeps a sample's draw independent of its batch neighbours.
    """
    seeds = sample_seeds.tolist() if isinstance(sample_seeds, torch.Tensor) else list(sample_seeds)
    device = torch.device(device)
    out = torch.empty((len(seeds), *shape), device=device, dtype=dtype)
    generator = torch.Generator(device=device)
    for i, s in enumerate(seeds):
        generator.manual_seed(mix_seed(int(s), step))
        out[i] = torch.randn(shape, generator=generator, device=device, dtype=dtype)
    return out


def sample_generator(
    sample_seed_value: int, purpose: int, device: torch.device | str = "cpu"
) -> torch.Generator:
    """A generator for a trajectory's non-noise randomness (e.g. which timesteps it trains),
    keyed by ``purpose`` so it never correlates with the noise stream."""
    generator = torch.Generator(device=device)
    generator.manual_seed(mix_seed(sample_seed_value, 0x7A11 + purpose))
    return generator
