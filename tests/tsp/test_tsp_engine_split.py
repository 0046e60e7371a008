"""RolloutEngine.start / advance: a rollout split at any step boundary — on the same engine, on another
engine holding a copy of the weights (another rank), or after a trip through the transfer encoding —
reproduces generate() bit for bit; generate() itself matches a straightforward reference rollout."""

from __future__ import annotations

import copy
import json
import random
from dataclasses import fields

import pytest
import torch

from digenrl.algo.timesteps import sde_step_mask
from digenrl.data.text_condition import TextCondition
from digenrl.data.trajectory import TrajectoryBatch
from digenrl.rollout.noise import INITIAL_NOISE_STEP, sample_seed, step_noise
from digenrl.runtime.comm.transfer import batch_from_tensors, batch_to_tensors

from .fixtures import PROMPTS, bundle, make_config, make_engine

# (timestep selection, guidance scale (> 1: true CFG with the uncond branch), samples per forward)
CASES = [("first", 1.0, 0), ("shuffled", 4.5, 3), ("fast-window", 4.5, 0)]


def _request(num_prompts: int = 2):
    prompts = random.sample(PROMPTS, num_prompts)
    ids = random.sample(range(50), num_prompts)
    return prompts, ids, random.randint(0, 1000), random.randint(0, 9)


def _engine(mode: str, guidance: float, spf: int, **kw):
    cfg = make_config(
        f"algo.timestep_selection={mode}",
        f"sampler.guidance_scale={guidance}",
        f"sampler.samples_per_forward={spf}",
        f"seed={random.randint(0, 10_000)}",
    )
    return make_engine(cfg, **kw)


def assert_identical(a: TrajectoryBatch, b: TrajectoryBatch) -> None:
    for f in fields(TrajectoryBatch):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, TextCondition):
            x, y = x.to_dict(), y.to_dict()
            assert x.keys() == y.keys()
            for key in x:
                assert torch.equal(x[key], y[key]), f"cond.{key}"
        elif isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor), f.name
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), f.name
        else:
            assert x == y, f.name


def _hop(batch: TrajectoryBatch) -> TrajectoryBatch:
    """What a stage hop does to a batch: metadata through JSON, tensors copied."""
    meta, tensors = batch_to_tensors(batch)
    return batch_from_tensors(json.loads(json.dumps(meta)), [t.clone() for t in tensors])


@torch.no_grad()
def _reference(engine, prompts, ids, iteration, version, step_indices):
    """The whole trajectory stacked, then gathered at the trained steps — the rollout written plainly."""
    g, t, shape, sampler = engine.group_size, engine.sampler.num_steps, engine.latent_shape, engine.sampler
    seeds = [sample_seed(engine.seed, iteration, pid, j) for pid in ids for j in range(g)]
    b = len(seeds)
    cond = bundle().text_encoder.encode(prompts).repeat_interleave(g)
    uncond = bundle().text_encoder.negative_condition(1) if sampler.true_cfg else None
    mask = sde_step_mask(t, step_indices[0], mode=engine.sde_mode)
    chunk = engine.samples_per_forward or b
    x = step_noise(seeds, INITIAL_NOISE_STEP, shape, device="cpu")
    xs, logps = [x], []
    for i in range(t):
        noise = step_noise(seeds, i, shape, device="cpu")
        parts, lps = [], []
        for lo in range(0, b, chunk):
            hi = min(lo + chunk, b)
            sigma = sampler.sigmas[i].expand(hi - lo)
            v = sampler.velocity(engine.model, x[lo:hi], sigma, cond[lo:hi], uncond)
            res = sampler.transition(
                v,
                x[lo:hi],
                sigma,
                sampler.sigmas[i + 1].expand(hi - lo),
                noise=noise[lo:hi],
                stochastic=bool(mask[i]),
            )
            parts.append(res.prev_sample)
            lps.append(res.log_prob)
        x = torch.cat(parts)
        xs.append(x)
        logps.append(torch.cat(lps))
    traj, logp = torch.stack(xs, 1), torch.stack(logps, 1)
    rows = torch.arange(b).unsqueeze(1)
    return {
        "seeds": torch.tensor(seeds),
        "latents": traj[rows, step_indices],
        "next_latents": traj[rows, step_indices + 1],
        "log_probs": logp[rows, step_indices],
        "sigmas": sampler.sigmas[step_indices],
        "next_sigmas": sampler.sigmas[step_indices + 1],
        "final_latents": x,
        "cond": cond,
        "policy_version": torch.full((b,), version),
    }


@pytest.mark.parametrize(("mode", "guidance", "spf"), CASES)
def test_generate_matches_the_plain_reference_rollout(mode, guidance, spf):
    engine = _engine(mode, guidance, spf)
    prompts, ids, iteration, version = _request(3)
    out = engine.generate(prompts, ids, iteration=iteration, policy_version=version)
    ref = _reference(engine, prompts, ids, iteration, version, out.step_indices)
    assert out.steps_done == engine.sampler.num_steps
    assert out.batch_size == 6 and out.num_train_steps == (2 if mode == "fast-window" else 3)
    if mode == "first":
        assert out.step_indices.tolist() == [[0, 1, 2]] * 6
    for name, value in ref.items():
        got = getattr(out, name)
        if name == "cond":
            assert torch.equal(got.embeds, value.embeds)
        else:
            assert torch.equal(got, value.to(got.dtype)), name
    assert out.prompt_ids.tolist() == [pid for pid in ids for _ in range(2)]
    assert out.sample_ids.tolist() == [0, 1] * 3
    assert out.prompts == [p for p in prompts for _ in range(2)]
    assert bool((out.log_probs != 0).all())  # every trained transition was recorded


@pytest.mark.parametrize(("mode", "guidance", "spf"), CASES)
def test_any_two_stage_split_equals_generate(mode, guidance, spf):
    engine = _engine(mode, guidance, spf)
    prompts, ids, iteration, version = _request()
    whole = engine.generate(prompts, ids, iteration=iteration, policy_version=version)
    t = engine.sampler.num_steps
    for split in range(t + 1):
        head = engine.advance(engine.start(prompts, ids, iteration=iteration, policy_version=version), split)
        assert head.steps_done == split
        assert_identical(engine.advance(head, t), whole)
        assert_identical(engine.advance(_hop(head), t), whole)  # the second stage got it over the wire


def test_three_stages_on_three_engines_with_copied_weights_equal_generate():
    """Each stage as another rank would run it: its own engine, its own copy of the model weights,
    the in-flight batch arriving through the transfer encoding."""
    mode, guidance, spf = random.choice(CASES)
    seed = random.randint(0, 10_000)
    engines = [
        _engine(mode, guidance, spf, flow_model=copy.deepcopy(bundle().flow_model), seed=seed)
        for _ in range(3)
    ]
    t = engines[0].sampler.num_steps
    cuts = sorted(random.sample(range(1, t), 2))
    bounds = [0, *cuts, t]
    prompts, ids, iteration, version = _request()
    whole = _engine(mode, guidance, spf, seed=seed).generate(
        prompts, ids, iteration=iteration, policy_version=version
    )
    batch = engines[0].start(prompts, ids, iteration=iteration, policy_version=version)
    for stage, engine in enumerate(engines):
        batch = _hop(engine.advance(batch, bounds[stage + 1]))
    assert_identical(batch, whole)


def test_start_holds_the_initial_noise_and_empty_buffers():
    engine = _engine("first", 1.0, 0)
    prompts, ids, iteration, version = _request()
    batch = engine.start(prompts, ids, iteration=iteration, policy_version=version)
    seeds = [sample_seed(engine.seed, iteration, pid, j) for pid in ids for j in range(2)]
    assert batch.steps_done == 0
    assert torch.equal(
        batch.final_latents, step_noise(seeds, INITIAL_NOISE_STEP, engine.latent_shape, device="cpu")
    )
    assert batch.latents.shape == (4, 3, *engine.latent_shape) and not batch.latents.any()
    assert not batch.next_latents.any() and not batch.log_probs.any()
    assert torch.equal(batch.sigmas, engine.sampler.sigmas[:3].expand(4, -1))
    assert torch.equal(batch.next_sigmas, engine.sampler.sigmas[1:4].expand(4, -1))
    assert batch.policy_version.tolist() == [version] * 4


def test_advance_leaves_its_input_untouched_and_reports_steps():
    engine = _engine("first", 1.0, 0)
    prompts, ids, iteration, version = _request()
    start = engine.start(prompts, ids, iteration=iteration, policy_version=version)
    snapshot = _hop(start)
    seen: list[int] = []
    mid = engine.advance(start, 4, on_step=seen.append)
    assert seen == [0, 1, 2, 3]
    assert_identical(start, snapshot)
    engine.advance(mid, 6, on_step=seen.append)
    assert seen == [0, 1, 2, 3, 4, 5]
    assert mid.steps_done == 4  # the first advance's result is not changed by the second
    same = engine.advance(mid, 4)
    assert_identical(same, mid)


def test_advance_rejects_bad_targets_and_cat_rejects_mixed_progress():
    engine = _engine("first", 1.0, 0)
    prompts, ids, iteration, version = _request()
    mid = engine.advance(engine.start(prompts, ids, iteration=iteration, policy_version=version), 3)
    for bad in (2, 7, 3.5, True):
        with pytest.raises(ValueError, match="until_step"):
            engine.advance(mid, bad)
    other = engine.advance(mid, 4)
    with pytest.raises(ValueError, match="steps_done"):
        TrajectoryBatch.cat([mid, other])
    assert TrajectoryBatch.cat([mid, mid]).steps_done == 3
    assert mid.select([1, 0]).steps_done == 3
