"""``trainer.ema_decay``: the EMA of the trainable weights follows diffusers' EMAModel formula, is updated
only by committed steps, swaps in and out losslessly, and resumes bit for bit from both checkpoint formats (a
2-rank FSDP2 run keeps it sharded like the weights)."""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from digenrl.trainer import PolicyTrainer, full_trainer_state, latest_checkpoint_dir, load_latest_checkpoint
from digenrl.trainer.checkpoint import read_meta, save_checkpoint
from tests.runtime.spawn import spawn_workers

from .fixtures import build_model, make_config, make_sampler, rollout_batch, select, trainable_snapshot

DECAY = 0.8


def _trainer(*overrides: str, world_size: int = 1) -> PolicyTrainer:
    cfg = make_config(f"trainer.ema_decay={DECAY}", *overrides)
    model = build_model(seed=0)
    return PolicyTrainer(
        cfg, model, make_sampler(cfg, model), uncond=None, device="cpu", world_size=world_size
    )


def _batch(trainer: PolicyTrainer, seed: int):
    return rollout_batch(trainer.flow_model, trainer.sampler, batch_size=4, num_train_steps=2, seed=seed)


def _train(trainer: PolicyTrainer, seeds: range) -> None:
    for seed in seeds:
        batch = _batch(trainer, seed)
        trainer.accumulate(batch, 1.0 / batch.num_units)
        trainer.step()


def _ema(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    return trainer.ema.full_state()["weights"]


def test_the_ema_follows_diffusers_formula_over_committed_steps():
    trainer = _trainer()
    expected: dict[str, torch.Tensor] = {}
    for n, seed in enumerate(range(10, 14), start=1):
        _train(trainer, range(seed, seed + 1))
        weights = trainable_snapshot(trainer)
        # diffusers EMAModel.get_decay: d_1 = 0, then min(decay, n / (9 + n))
        decay = 0.0 if n == 1 else min(DECAY, n / (9 + n))
        for name, theta in weights.items():
            previous = expected.get(name, theta)
            expected[name] = previous - (1 - decay) * (previous - theta)
    assert trainer.ema.updates == 4
    ema = _ema(trainer)
    assert ema.keys() == expected.keys() and len(ema) > 0
    for name in ema:
        assert ema[name].dtype == torch.float32
        torch.testing.assert_close(ema[name], expected[name], rtol=0, atol=1e-7)
    assert any(not torch.equal(ema[name], weights[name]) for name in ema)  # it lags the weights


def test_a_skipped_non_finite_step_leaves_the_ema_alone():
    trainer = _trainer("trainer.nonfinite=skip")
    _train(trainer, range(2))
    before = {k: v.clone() for k, v in _ema(trainer).items()}
    batch = _batch(trainer, 5)
    trainer.accumulate(batch, 1.0 / batch.num_units)
    next(iter(trainer.backend.trainable_parameters())).grad.fill_(float("nan"))
    assert trainer.step()["nonfinite_skipped"] == 1.0
    assert trainer.ema.updates == 2
    for name, value in _ema(trainer).items():
        assert torch.equal(value, before[name]), name


def test_ema_weights_swap_in_and_out_losslessly():
    trainer, twin = _trainer(), _trainer()
    _train(trainer, range(3))
    _train(twin, range(3))
    trained = trainable_snapshot(trainer)
    ema = _ema(trainer)
    batch = _batch(trainer, 99)
    with trainer.ema_weights():
        inside = trainable_snapshot(trainer)
        with torch.no_grad():
            v_ema = trainer.flow_model(batch.latents[:, 0], batch.sigmas[:, 0], batch.cond)
    with torch.no_grad():
        v_trained = trainer.flow_model(batch.latents[:, 0], batch.sigmas[:, 0], batch.cond)
    assert not torch.equal(v_ema, v_trained)
    for name in trained:
        assert torch.equal(inside[name], ema[name]), name
    after = trainable_snapshot(trainer)
    for name in trained:
        assert torch.equal(after[name], trained[name]), name
    # and training goes on exactly as if nothing had been swapped (optimizer state untouched)
    with pytest.raises(RuntimeError, match="inside"), trainer.ema_weights():
        raise RuntimeError("an evaluation failed inside the block")
    _train(trainer, range(3, 5))
    _train(twin, range(3, 5))
    for name, value in trainable_snapshot(trainer).items():
        assert torch.equal(value, trainable_snapshot(twin)[name]), name
    for name, value in _ema(trainer).items():
        assert torch.equal(value, _ema(twin)[name]), name


def test_no_ema_without_ema_decay():
    cfg = make_config()
    model = build_model(seed=0)
    trainer = PolicyTrainer(cfg, model, make_sampler(cfg, model), uncond=None, device="cpu")
    assert trainer.ema is None and "ema" not in trainer.state_dict()
    with pytest.raises(ValueError, match=r"trainer\.ema_decay=0"), trainer.ema_weights():
        pass


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_the_ema_resumes_bit_for_bit_from_a_checkpoint(tmp_path, mode):
    straight = _trainer(f"trainer.mode={mode}", "trainer.lr=0.001")
    _train(straight, range(4))

    first = _trainer(f"trainer.mode={mode}", "trainer.lr=0.001")
    _train(first, range(2))
    save_checkpoint(tmp_path, 2, {"trainer": first.state_dict()}, rank=0, is_writer=True)
    resumed = _trainer(f"trainer.mode={mode}", "trainer.lr=0.001")
    resumed.load_state_dict(load_latest_checkpoint(tmp_path)["trainer"])
    assert resumed.ema.updates == 2
    _train(resumed, range(2, 4))

    assert resumed.ema.updates == straight.ema.updates == 4
    a, b = _ema(straight), _ema(resumed)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_a_checkpoint_and_a_trainer_must_agree_on_the_ema(tmp_path):
    with_ema = _trainer()
    cfg = make_config()
    model = build_model(seed=0)
    without = PolicyTrainer(cfg, model, make_sampler(cfg, model), uncond=None, device="cpu")
    with pytest.raises(ValueError, match=r"holds EMA of the weights, but this run has trainer\.ema_decay=0$"):
        without.load_state_dict(with_ema.state_dict())
    with pytest.raises(
        ValueError, match=r"holds no EMA of the weights, but this run has trainer\.ema_decay=0\.8"
    ):
        with_ema.load_state_dict(without.state_dict())


# ---------------------------------------------------------------------------------------- FSDP2, 2 ranks
FULL_FT = ["trainer.mode=full", "trainer.lr=0.001", "trainer.micro_batch_size=2"]
SHARES = {0: [0, 1, 2], 1: [3]}


def _worker(rank: int, world: int, tmp: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    try:
        trainer = _trainer(*FULL_FT, "trainer.backend=fsdp2", world_size=2)
        assert trainer.checkpoint_format == "sharded"
        shards = trainer.ema.shards()
        # sharded like the weights: a DTensor with the parameter's placements, holding this rank's part only
        for (name, param), shadow in zip(trainer.backend.named_trainable(), shards.values(), strict=True):
            assert shadow.placements == param.placements, name
            assert shadow.to_local().shape == param.to_local().shape, name
        for batch in torch.load(os.path.join(tmp, "batches.pt"), weights_only=False):
            trainer.accumulate(select(batch, SHARES[rank]), 1.0 / batch.num_units)
            trainer.step()
        state, sharded = trainer.checkpoint_state()
        save_checkpoint(
            os.path.join(tmp, "sharded"),
            2,
            {"trainer": state},
            rank=rank,
            is_writer=rank == 0,
            sharded=sharded,
        )
        full = trainer.state_dict()
        save_checkpoint(os.path.join(tmp, "full"), 2, {"trainer": full}, rank=rank, is_writer=rank == 0)
        batch = torch.load(os.path.join(tmp, "batches.pt"), weights_only=False)[0]
        with torch.no_grad(), trainer.ema_weights():  # both ranks swap their shards; the forward gathers
            v_ema = trainer.flow_model(batch.latents[:, 0], batch.sigmas[:, 0], batch.cond)
        if rank == 0:
            torch.save({**full["ema"], "v": v_ema}, os.path.join(tmp, "ema.pt"))
    finally:
        dist.destroy_process_group()


def test_two_rank_fsdp2_ema_stays_sharded_and_loads_from_either_format():
    with tempfile.TemporaryDirectory() as tmp:
        seed_trainer = _trainer(*FULL_FT)
        torch.save([_batch(seed_trainer, 40 + i) for i in range(2)], os.path.join(tmp, "batches.pt"))
        spawn_workers(_worker, 2, (tmp,))
        saved = torch.load(os.path.join(tmp, "ema.pt"), weights_only=True)
        assert saved["updates"] == 2 and len(saved["weights"]) > 0
        sharded = load_latest_checkpoint(os.path.join(tmp, "sharded"))
        assert read_meta(latest_checkpoint_dir(os.path.join(tmp, "sharded")))["trainer_format"] == "sharded"
        assert "weights" not in sharded["trainer"]["ema"]  # trainer.pt stays small: the EMA is in the shards
        full = load_latest_checkpoint(os.path.join(tmp, "full"))
        offline = full_trainer_state(sharded)["ema"]
        for one, other in ((offline, full["trainer"]["ema"]), (offline, saved)):
            assert one["updates"] == other["updates"] and one["weights"].keys() == other["weights"].keys()
            for name, value in one["weights"].items():
                assert torch.equal(value, other["weights"][name]), name
        # one process, no process group: DCP reshards the 2-rank EMA into plain tensors
        from_sharded, from_full = _trainer(*FULL_FT), _trainer(*FULL_FT)
        from_sharded.load_state_dict(sharded["trainer"], checkpoint_dir=sharded["path"])
        from_full.load_state_dict(full["trainer"])
        a, b = _ema(from_sharded), _ema(from_full)
        assert from_sharded.ema.updates == from_full.ema.updates == 2
        for name in a:
            assert torch.equal(a[name], b[name]) and torch.equal(a[name], saved["weights"][name]), name
        batch = torch.load(os.path.join(tmp, "batches.pt"), weights_only=False)[0]
        with torch.no_grad():
            with from_full.ema_weights():
                v_ema = from_full.flow_model(batch.latents[:, 0], batch.sigmas[:, 0], batch.cond)
            v_trained = from_full.flow_model(batch.latents[:, 0], batch.sigmas[:, 0], batch.cond)
        torch.testing.assert_close(saved["v"], v_ema, rtol=0, atol=1e-6)
        assert not torch.allclose(v_ema, v_trained, rtol=0, atol=1e-6)
