"""algo.cfg_grad: which CFG branches the training gradient flows through (digenrl/rollout/sampler.py).

``cond`` detaches the unconditional prediction (yifan123/flow_grpo_refactor scripts/train_sd3.py
``compute_log_prob``), ``both`` is the full gradient (yifan123/flow_grpo scripts/train_sd3.py). Checked here
against an independent float64 objective, for both layouts of ``cond`` (the batched 2B forward with the
unconditional half detached, and the separate no-graph unconditional pass), with the on-policy ratio of each,
and the separate pass under two DDP / FSDP2 trainer ranks against the single-process update.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from digenrl.config import Config, ConfigError, apply_overrides
from digenrl.rollout.sampler import CFG_SPLIT_MIN_BATCH, Sampler
from digenrl.trainer import PolicyTrainer
from digenrl.validation import validate_config
from tests.runtime.spawn import spawn_workers

from .fixtures import (
    build_model,
    empty_cond,
    grads_by_name,
    make_config,
    make_sampler,
    perturb_adapter,
    random_cond,
    rollout_batch,
    select,
)

SCALE = 4.5  # tiny-sd3 has true CFG: guidance by a second, unconditional forward


def _trainer(
    cfg_grad: str, *overrides: str, split_min: int | None = None, dtype=torch.float32, seed=0, world_size=1
):
    cfg = make_config(f"sampler.guidance_scale={SCALE}", f"algo.cfg_grad={cfg_grad}", *overrides)
    model = build_model(seed, dtype=dtype)
    trainer = PolicyTrainer(
        cfg, model, make_sampler(cfg, model), uncond=empty_cond(), device="cpu", world_size=world_size
    )
    assert trainer.sampler.true_cfg and trainer.sampler.cfg_grad == cfg_grad
    if split_min is not None:
        trainer.sampler = dataclasses.replace(trainer.sampler, cfg_split_min_batch=split_min)
    if cfg.trainer.mode == "lora" and world_size == 1:  # trainer ranks load a state instead
        perturb_adapter(model)  # a non-zero adapter: non-zero lora_A gradients and a non-zero KL
    return trainer


def _reference_objective(
    model64, base64, batch, uncond, *, detach_uncond, noise_level, sigma_max, clip_range, kl_beta
):
    """FlowGRPO's mean loss over all units in float64, written out independently of digenrl.algo: the guided
    velocity v_u + w·(v_c − v_u) from two separate forwards (v_u detached when ``detach_uncond``, as
    flow_grpo_refactor's compute_log_prob), flow-SDE mean, Gaussian log-prob averaged over dims, PPO clip,
    KL / (2σ_t²) to the base model (the adapter-disabled reference, computed without autograd)."""
    b_idx, k_idx = torch.meshgrid(
        torch.arange(batch.batch_size), torch.arange(batch.num_train_steps), indexing="ij"
    )
    b_idx, k_idx = b_idx.reshape(-1), k_idx.reshape(-1)
    x = batch.latents[b_idx, k_idx].double()
    x_next = batch.next_latents[b_idx, k_idx].double()
    s = batch.sigmas[b_idx, k_idx].double()
    s_next = batch.next_sigmas[b_idx, k_idx].double()

    def as64(c):
        return type(c)(embeds=c.embeds.double(), pooled=c.pooled.double())

    cond = as64(batch.cond.index_select(b_idx))
    unc = as64(uncond.repeat_interleave(len(b_idx)))
    shape = (-1, 1, 1, 1)

    def mean_of(model, detach):
        v_c = model(x, s, cond).double()
        v_u = model(x, s, unc).double()
        if detach:
            v_u = v_u.detach()
        v = v_u + SCALE * (v_c - v_u)
        sig, dt = s.view(shape), (s_next - s).view(shape)
        denom = torch.where(sig >= 1.0, torch.full_like(sig, 1.0 - sigma_max), 1.0 - sig)
        sigma_t = noise_level * torch.sqrt(sig / denom)
        mu = x + dt * (v + sigma_t**2 / (2 * sig) * (x + (1 - sig) * v))
        return mu, sigma_t, sigma_t * torch.sqrt(-dt)

    mu, sigma_t, std = mean_of(model64, detach_uncond)
    logp = (-((x_next - mu) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi)).mean(
        dim=(1, 2, 3)
    )
    ratio = torch.exp(logp - batch.log_probs[b_idx, k_idx].double())
    adv = batch.advantages[b_idx].double()
    loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip_range, 1 + clip_range))
    with torch.no_grad():
        mu_ref, _, _ = mean_of(base64, True)
    kl = ((mu - mu_ref) ** 2 / (2 * sigma_t**2)).mean(dim=(1, 2, 3))
    return (loss + kl_beta * kl).mean(), ratio.detach()


def _off_policy_grads(cfg_grad: str, split_min: int | None = None):
    """Gradient of one logical batch (3 samples x 3 steps, micro-batches of 3) after an update moved the
    adapter away from the rollout policy, so that the ratios spread and some are clipped."""
    trainer = _trainer(
        cfg_grad,
        "algo.kl_beta=0.04",
        "algo.clip_range=0.0003",
        "trainer.micro_batch_size=3",
        split_min=split_min,
    )
    model = trainer.flow_model
    rollout = rollout_batch(
        model, trainer.sampler, batch_size=3, num_train_steps=3, seed=5, uncond=trainer.uncond
    )
    with torch.no_grad():
        for name, p in model.transformer.named_parameters():
            if "lora_A" in name:
                p.add_(torch.randn_like(p) * 0.3)
    stats = trainer.accumulate(rollout, 1.0 / rollout.num_units)
    return trainer, rollout, stats, grads_by_name(trainer)


def _reference_grads(trainer, rollout, *, detach_uncond: bool):
    model64 = copy.deepcopy(trainer.flow_model).double()
    model64.zero_grad(set_to_none=True)
    objective, ratio = _reference_objective(
        model64,
        build_model(0).double(),  # the model before LoRA: the reference policy
        rollout,
        trainer.uncond,
        detach_uncond=detach_uncond,
        noise_level=trainer.sampler.noise_level,
        sigma_max=float(trainer.sampler.sigmas[1]),
        clip_range=0.0003,
        kl_beta=0.04,
    )
    objective.backward()
    return {n: p.grad.float() for n, p in model64.transformer.named_parameters() if p.grad is not None}, ratio


def _assert_close_grads(ours: dict, ref: dict) -> None:
    assert ours.keys() == ref.keys() and ref
    scale = max(float(g.abs().max()) for g in ref.values())
    for name in ref:
        torch.testing.assert_close(
            ours[name], ref[name], rtol=1e-3, atol=1e-4 * scale, msg=lambda m, n=name: f"{n}: {m}"
        )


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def test_cond_gradient_detaches_the_uncond_branch_and_both_is_the_full_gradient():
    runs = {
        "cond, batched 2B pass": _off_policy_grads("cond"),  # 3 units < CFG_SPLIT_MIN_BATCH
        "cond, separate no-graph uncond pass": _off_policy_grads("cond", split_min=1),
        "both": _off_policy_grads("both"),
    }
    assert not runs["cond, batched 2B pass"][0].sampler.separate_uncond_pass(3)
    assert runs["cond, separate no-graph uncond pass"][0].sampler.separate_uncond_pass(3)
    trainer, rollout, _, _ = runs["both"]
    weights = [r[0].trainable_state_dict() for r in runs.values()]  # the same policy in every run
    assert all(torch.equal(w[n], weights[0][n]) for w in weights[1:] for n in weights[0])
    ref_cond, ratio = _reference_grads(trainer, rollout, detach_uncond=True)
    ref_both, ratio_both = _reference_grads(trainer, rollout, detach_uncond=False)
    torch.testing.assert_close(ratio, ratio_both, rtol=0, atol=0)  # values agree; only the update differs
    for _, _, s, _ in runs.values():  # same forward values whatever the convention and layout
        assert 0 < s["clipped_count"] < s["units"]
        assert math.isclose(s["ratio_min"], float(ratio.min()), rel_tol=1e-5)
        assert math.isclose(s["ratio_max"], float(ratio.max()), rel_tol=1e-5)
    _assert_close_grads(runs["cond, batched 2B pass"][3], ref_cond)
    _assert_close_grads(runs["cond, separate no-graph uncond pass"][3], ref_cond)
    _assert_close_grads(runs["both"][3], ref_both)
    # the two conventions really differ (by far more than the tolerance above), so this test can fail
    scale = max(float(g.abs().max()) for g in ref_both.values())
    assert _max_diff(ref_cond, ref_both) > 0.1 * scale
    assert _max_diff(runs["cond, batched 2B pass"][3], runs["both"][3]) > 0.1 * scale
    # the two layouts of cond compute the same gradient
    _assert_close_grads(runs["cond, separate no-graph uncond pass"][3], runs["cond, batched 2B pass"][3])


def _forward_calls(sampler: Sampler, model, batch: int, *, grad: bool) -> list[tuple[int, bool]]:
    calls: list[tuple[int, bool]] = []
    handle = model.register_forward_pre_hook(
        lambda m, args: calls.append((args[0].shape[0], torch.is_grad_enabled()))
    )
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *model.latent_shape(32, 32), generator=g)
    with torch.set_grad_enabled(grad):
        sampler.velocity(model, x, torch.full((batch,), 0.7), random_cond(batch, g), empty_cond())
    handle.remove()
    return calls


def test_only_a_training_forward_of_at_least_the_threshold_splits_off_the_uncond_pass():
    trainer = _trainer("cond")
    sampler, model, b = trainer.sampler, trainer.flow_model, CFG_SPLIT_MIN_BATCH
    assert _forward_calls(sampler, model, b, grad=True) == [(b, False), (b, True)]  # uncond first, no graph
    assert _forward_calls(sampler, model, b - 1, grad=True) == [(2 * (b - 1), True)]
    assert _forward_calls(sampler, model, b, grad=False) == [(2 * b, False)]  # the rollout's layout
    full = dataclasses.replace(sampler, cfg_grad="both")
    assert _forward_calls(full, model, b, grad=True) == [(2 * b, True)]
    assert "(grad: cond)" in sampler.describe() and "(grad: both)" in full.describe()


def _saved_activation_bytes(sampler: Sampler, model, batch: int) -> tuple[int, torch.Tensor]:
    params = {p.data_ptr() for p in model.parameters()}
    saved = 0

    def pack(t):
        nonlocal saved
        if t.data_ptr() not in params:
            saved += t.numel() * t.element_size()
        return t

    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, *model.latent_shape(32, 32), generator=g)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        v = sampler.velocity(model, x, torch.full((batch,), 0.7), random_cond(batch, g), empty_cond())
    return saved, v.detach()


def test_the_separate_uncond_pass_saves_activations_of_b_samples_not_2b():
    trainer = _trainer("cond")
    model, b = trainer.flow_model, CFG_SPLIT_MIN_BATCH
    split, v_split = _saved_activation_bytes(trainer.sampler, model, b)
    detached, v_detached = _saved_activation_bytes(
        dataclasses.replace(trainer.sampler, cfg_split_min_batch=b + 1), model, b
    )
    full, v_full = _saved_activation_bytes(dataclasses.replace(trainer.sampler, cfg_grad="both"), model, b)
    print(f"saved activation bytes at B={b}: split {split}, batched+detached {detached}, both {full}")
    assert detached == full  # detaching inside the batched pass saves nothing
    assert split < 0.6 * full
    torch.testing.assert_close(v_detached, v_full, rtol=0, atol=0)
    torch.testing.assert_close(v_split, v_full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "dtype,autocast", [(torch.float32, False), (torch.bfloat16, True)], ids=["fp32", "bf16-autocast"]
)
def test_on_policy_ratio_with_cfg_grad_cond(dtype, autocast):
    """The rollout always runs the batched 2B forward; the cond training forward runs it too below the
    threshold (bit-identical: ratio exactly 1) and splits it from the threshold on (another batch
    composition of the same values: ratio 1 within 1e-5)."""
    extra = ("model.dtype=bfloat16", "model.autocast=true") if autocast else ()
    spreads = {}
    for samples in (CFG_SPLIT_MIN_BATCH - 1, CFG_SPLIT_MIN_BATCH):
        trainer = _trainer("cond", f"trainer.micro_batch_size={samples}", *extra, dtype=dtype)
        assert trainer.sampler.separate_uncond_pass(samples) == (samples >= CFG_SPLIT_MIN_BATCH)
        batch = rollout_batch(
            trainer.flow_model,
            trainer.sampler,
            batch_size=samples,
            num_train_steps=2,
            seed=4,
            uncond=trainer.uncond,
        )
        stats = trainer.accumulate(batch, 1.0 / batch.num_units)
        spreads[samples] = max(abs(stats["ratio_min"] - 1), abs(stats["ratio_max"] - 1))
        assert stats["clipped_count"] == 0 and any(g.abs().max() > 0 for g in grads_by_name(trainer).values())
    print(f"cfg_grad=cond on-policy max |ratio - 1| ({dtype}, autocast={autocast}): {spreads}")
    assert spreads[CFG_SPLIT_MIN_BATCH - 1] == 0.0
    assert spreads[CFG_SPLIT_MIN_BATCH] < 1e-5


def test_forced_split_at_small_micro_batches_keeps_the_ratio_near_one_in_fp32():
    """Every micro-batch size with the split forced (cfg_split_min_batch=1): the rollout ran 4 samples in
    one 2B forward, the trainer runs the conditional branch alone at micro-batch 1..4."""
    spreads = {}
    for mbs in (1, 2, 3, 4):
        trainer = _trainer("cond", f"trainer.micro_batch_size={mbs}", split_min=1)
        batch = rollout_batch(
            trainer.flow_model,
            trainer.sampler,
            batch_size=4,
            num_train_steps=2,
            seed=6,
            uncond=trainer.uncond,
        )
        stats = trainer.accumulate(batch, 1.0 / batch.num_units)
        spreads[mbs] = max(abs(stats["ratio_min"] - 1), abs(stats["ratio_max"] - 1))
    print(f"fp32, forced split, max |ratio - 1| by micro-batch: {spreads}")
    assert max(spreads.values()) < 1e-5


def test_bad_cfg_grad_is_rejected_naming_the_key():
    with pytest.raises(
        ConfigError, match=r"algo\.cfg_grad='uncond' is not allowed; choose one of: cond, both"
    ):
        validate_config(apply_overrides(Config(), {"algo.cfg_grad": "uncond"}))
    for value in ("cond", "both"):
        validate_config(apply_overrides(Config(), {"algo.cfg_grad": value}))
    assert Config().algo.cfg_grad == "cond"
    cfg = make_config(f"sampler.guidance_scale={SCALE}", "algo.cfg_grad=full")  # not validated yet
    model = build_model(0)
    with pytest.raises(ValueError, match=r"algo\.cfg_grad='full'"):
        make_sampler(cfg, model)
    with pytest.raises(ValueError, match="cfg_split_min_batch"):
        dataclasses.replace(make_sampler(make_config(), model), cfg_split_min_batch=0)


# Two trainer ranks (gloo) with the separate no-graph unconditional pass forced at every micro-batch: each
# micro-batch then runs up to three forwards (KL reference, unconditional, conditional) before one backward.
SCENARIOS = {
    "ddp-lora-kl": ("ddp", "lora", 0.04),
    "fsdp2-lora-kl": ("fsdp2", "lora", 0.04),
    "fsdp2-full": ("fsdp2", "full", 0.0),
}
SHARES = {0: [[0, 1], [2, 3]], 1: [[4], [5]]}  # rank -> its 2 fragments; rank 1 pads with zero-weight units


def _split_trainer(scenario: str, seed: int, world_size: int = 1, single_process: bool = False):
    backend, mode, kl_beta = SCENARIOS[scenario]
    overrides = (
        f"trainer.backend={'none' if single_process else backend}",
        f"trainer.mode={mode}",
        f"algo.kl_beta={kl_beta}",
        "trainer.micro_batch_size=2",
        "trainer.lr=0.001",
    )
    return _trainer("cond", *overrides, split_min=1, seed=seed, world_size=world_size)


def _iteration(trainer, batch, fragments):
    for samples in fragments:
        trainer.accumulate(select(batch, samples), 1.0 / batch.num_units)
    return trainer.step()


def _split_worker(rank, world, tmp):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    try:
        reference = torch.load(os.path.join(tmp, "reference.pt"), weights_only=False)
        out = {}
        for scenario, ref in reference.items():
            trainer = _split_trainer(scenario, seed=rank, world_size=world)
            trainer.load_trainable_state_dict(ref["init"])
            out[scenario] = {
                "backend": trainer.backend.name,
                "step": _iteration(trainer, ref["batch"], SHARES[rank]),
                "state": trainer.state_dict(),
            }
        torch.save(out, os.path.join(tmp, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_separate_uncond_pass_under_ddp_and_fsdp2_equals_the_single_process_update(tmp_path):
    reference = {}
    for scenario in SCENARIOS:
        trainer = _split_trainer(scenario, seed=0, single_process=True)
        batch = rollout_batch(
            trainer.flow_model,
            trainer.sampler,
            batch_size=6,
            num_train_steps=2,
            seed=21,
            uncond=trainer.uncond,
        )
        init = trainer.trainable_state_dict()
        step = _iteration(trainer, batch, [f for r in SHARES for f in SHARES[r]])
        reference[scenario] = {"init": init, "batch": batch, "step": step, "state": trainer.state_dict()}
    torch.save(reference, tmp_path / "reference.pt")
    spawn_workers(_split_worker, 2, (str(tmp_path),))
    got = torch.load(tmp_path / "rank0.pt", weights_only=False)
    for scenario, ref in reference.items():
        assert got[scenario]["backend"] == SCENARIOS[scenario][0]
        for key in ("grad_norm", "update_norm"):
            assert got[scenario]["step"][key] == pytest.approx(ref["step"][key], rel=1e-5), (scenario, key)
        assert ref["state"]["model"].keys() == got[scenario]["state"]["model"].keys()
        for name, value in ref["state"]["model"].items():
            torch.testing.assert_close(got[scenario]["state"]["model"][name], value, rtol=0, atol=1e-6)
