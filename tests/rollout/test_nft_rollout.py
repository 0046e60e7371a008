"""DiffusionNFT's rollout: every step the ODE, no log-probability, and each trained unit the clean latent
noised by the forward process (x_σ = (1 − σ)·x0 + σ·ε with keyed ε) beside x0 itself."""

from __future__ import annotations

import torch

from digenrl.algo.sde_step import euler_step
from digenrl.rollout.noise import FORWARD_NOISE_STEP, INITIAL_NOISE_STEP, step_noise
from tests.tsp.fixtures import PROMPTS, bundle, make_config, make_engine
from tests.tsp.test_tsp_engine_split import assert_identical

NFT = ["algo=diffusionnft", "sampler.guidance_scale=1.0", "seed=4"]


def test_the_rollout_is_the_ode_and_the_units_are_forward_noised_clean_latents():
    engine = make_engine(make_config(*NFT, "algo.nft_ode_solver=euler"))
    out = engine.generate(PROMPTS[:2], [0, 1], iteration=2, policy_version=0)
    sampler, seeds = engine.sampler, out.seeds.tolist()
    # the plain Euler ODE from the keyed initial noise
    x = step_noise(seeds, INITIAL_NOISE_STEP, engine.latent_shape, device="cpu")
    cond = bundle().text_encoder.encode(PROMPTS[:2]).repeat_interleave(2)
    with torch.no_grad():
        for i in range(sampler.num_steps):
            sigma = sampler.sigmas[i].expand(len(seeds))
            v = sampler.velocity(engine.model, x, sigma, cond, None)
            x = euler_step(v, x, sampler.sigmas[i], sampler.sigmas[i + 1])
    assert torch.equal(out.final_latents, x)
    # 3 of the 6 steps per sample (timestep_fraction=0.5), drawn per sample as the published code does
    steps = out.step_indices
    assert steps.shape == (4, 3) and len({tuple(row) for row in steps.tolist()}) > 1
    assert bool((out.log_probs == 0).all())  # no likelihood
    for b in range(4):
        for k in range(3):
            step = int(steps[b, k])
            sigma = sampler.sigmas[step]
            eps = step_noise(seeds[b : b + 1], FORWARD_NOISE_STEP + step, engine.latent_shape, device="cpu")[
                0
            ]
            assert torch.equal(out.next_latents[b, k], x[b])
            assert torch.allclose(out.latents[b, k], (1 - sigma) * x[b] + sigma * eps, atol=1e-6)
            assert out.sigmas[b, k] == sigma


def test_a_tsp_split_and_the_published_dpm2_solver():
    engine = make_engine(make_config(*NFT, "algo.nft_ode_solver=euler"))
    whole = engine.generate(PROMPTS[:2], [0, 1], iteration=1, policy_version=0)
    start = engine.start(PROMPTS[:2], [0, 1], iteration=1, policy_version=0)
    assert_identical(engine.advance(engine.advance(start, 2), 6), whole)  # Euler splits at any step
    dpm = make_engine(make_config(*NFT)).generate(PROMPTS[:2], [0, 1], iteration=1, policy_version=0)
    gap = (dpm.final_latents - whole.final_latents).abs().max().item()
    assert 0 < gap < 0.5 * whole.final_latents.abs().max().item()
