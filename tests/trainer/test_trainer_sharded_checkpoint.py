"""Sharded checkpoints (torch.distributed.checkpoint): an FSDP2 state saved by 2 ranks loads into one
process exactly as its full-format twin does, a crash inside the sharded save keeps the previous
checkpoint, and non-finite shards are refused."""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from digenrl.trainer import PolicyTrainer, full_trainer_state, latest_checkpoint_dir, load_latest_checkpoint
from digenrl.trainer.checkpoint import SHARDED_DIR, checkpoint_steps, read_meta, save_checkpoint
from tests.runtime.spawn import spawn_workers

from .fixtures import build_model, make_config, make_sampler, rollout_batch, select

FULL_FT = ["trainer.mode=full", "trainer.lr=0.001", "trainer.micro_batch_size=2"]
SHARES = {0: [0, 1, 2], 1: [3]}  # uneven on purpose: rank 0 holds three samples, rank 1 one


def _trainer(*overrides, world_size=1):
    cfg = make_config(*FULL_FT, *overrides)
    model = build_model(seed=0)
    return PolicyTrainer(
        cfg, model, make_sampler(cfg, model), uncond=None, device="cpu", world_size=world_size
    )


def _batches():
    trainer = _trainer()
    return [
        rollout_batch(trainer.flow_model, trainer.sampler, batch_size=4, num_train_steps=2, seed=40 + i)
        for i in range(2)
    ]


def _save(out, trainer, step, *, rank=0, sharded=True):
    state, shards = trainer.checkpoint_state() if sharded else (trainer.state_dict(), None)
    return save_checkpoint(out, step, {"trainer": state}, rank=rank, is_writer=rank == 0, sharded=shards)


def _worker(rank, world, tmp):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    try:
        trainer = _trainer("trainer.backend=fsdp2", world_size=2)
        assert trainer.backend.name == "fsdp2" and trainer.checkpoint_format == "sharded"
        for batch in torch.load(os.path.join(tmp, "batches.pt"), weights_only=False):
            trainer.accumulate(select(batch, SHARES[rank]), 1.0 / batch.num_units)
            trainer.step()
        _save(os.path.join(tmp, "sharded"), trainer, 2, rank=rank)
        _save(os.path.join(tmp, "full"), trainer, 2, rank=rank, sharded=False)
    finally:
        dist.destroy_process_group()


def _assert_same_trainer_state(a, b):
    assert a["steps"] == b["steps"] and a["model"].keys() == b["model"].keys() and len(a["model"]) > 0
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    assert a["optimizer"]["state"].keys() == a["model"].keys() == b["optimizer"]["state"].keys()
    for name, entry in a["optimizer"]["state"].items():
        assert entry.keys() == b["optimizer"]["state"][name].keys() >= {"exp_avg", "exp_avg_sq", "step"}
        for key, value in entry.items():
            assert torch.equal(value, b["optimizer"]["state"][name][key]), (name, key)


def test_two_rank_sharded_checkpoint_loads_into_one_process_like_the_full_one():
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(_batches(), os.path.join(tmp, "batches.pt"))
        spawn_workers(_worker, 2, (tmp,))
        sharded_dir = latest_checkpoint_dir(os.path.join(tmp, "sharded"))
        meta = read_meta(sharded_dir)
        assert meta["trainer_format"] == "sharded"
        assert read_meta(latest_checkpoint_dir(os.path.join(tmp, "full")))["trainer_format"] == "full"
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(meta["sharded_files"])
        sharded = load_latest_checkpoint(os.path.join(tmp, "sharded"))
        full = load_latest_checkpoint(os.path.join(tmp, "full"))
        assert sharded["format"] == "sharded" and "model" not in sharded["trainer"]  # trainer.pt stays small

        # one process, no process group: DCP reshards the 2-rank state into plain tensors
        from_sharded, from_full = _trainer(), _trainer()
        assert from_sharded.backend.name == "none"
        from_sharded.load_state_dict(sharded["trainer"], checkpoint_dir=sharded["path"])
        from_full.load_state_dict(full["trainer"])
        _assert_same_trainer_state(from_sharded.state_dict(), full["trainer"])
        _assert_same_trainer_state(from_sharded.state_dict(), from_full.state_dict())
        _assert_same_trainer_state(full_trainer_state(sharded), full["trainer"])  # the offline conversion
        # and both continue alike: the optimizer step count and moments came back too
        batch = _batches()[0]
        steps = []
        for t in (from_sharded, from_full):
            t.accumulate(batch, 1.0 / batch.num_units)
            steps.append(t.step())
        assert steps[0] == steps[1]
        _assert_same_trainer_state(from_sharded.state_dict(), from_full.state_dict())


def test_a_crash_inside_the_sharded_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    trainer = _trainer("trainer.checkpoint_format=sharded")
    assert trainer.checkpoint_format == "sharded"
    batch = _batches()[0]
    trainer.accumulate(batch, 1.0 / batch.num_units)
    trainer.step()
    _save(tmp_path, trainer, 1)
    at_step_1 = trainer.state_dict()
    trainer.accumulate(batch, 1.0 / batch.num_units)
    trainer.step()

    def killed(self, *args, **kwargs):  # this rank's shard file is written, DCP's .metadata is not
        raise RuntimeError("simulated kill during the sharded save")

    monkeypatch.setattr(dcp.FileSystemWriter, "finish", killed)
    with pytest.raises(CheckpointException, match="simulated kill"):  # DCP gathers every rank's failure
        _save(tmp_path, trainer, 2)
    monkeypatch.undo()
    leftover = tmp_path / "checkpoints" / ".step_2.tmp" / SHARDED_DIR
    assert any(leftover.glob("*.distcp")) and not (leftover / ".metadata").exists()
    assert checkpoint_steps(tmp_path) == [1] and latest_checkpoint_dir(tmp_path).name == "step_1"
    resumed = _trainer("trainer.checkpoint_format=sharded")
    ckpt = load_latest_checkpoint(tmp_path)
    resumed.load_state_dict(ckpt["trainer"], checkpoint_dir=ckpt["path"])
    _assert_same_trainer_state(resumed.state_dict(), at_step_1)
    # the next save of that step replaces the leftover and publishes
    _save(tmp_path, trainer, 2)
    assert checkpoint_steps(tmp_path) == [1, 2] and not leftover.parent.exists()
    assert read_meta(latest_checkpoint_dir(tmp_path))["trainer_format"] == "sharded"


def test_non_finite_shards_are_never_written(tmp_path):
    trainer = _trainer("trainer.checkpoint_format=sharded")
    _save(tmp_path, trainer, 1)
    state, shards = trainer.checkpoint_state()
    name = next(iter(shards["model"]))
    shards["model"][name] = torch.full_like(shards["model"][name], float("nan"))
    with pytest.raises(
        FloatingPointError, match=rf"step_2: non-finite values in {SHARDED_DIR}\.model\.{name}"
    ):
        save_checkpoint(tmp_path, 2, {"trainer": state}, rank=0, is_writer=True, sharded=shards)
    assert checkpoint_steps(tmp_path) == [1] and not Path(tmp_path, "checkpoints", ".step_2.tmp").exists()


def test_lora_checkpoints_stay_full():
    trainer = _trainer("trainer.mode=lora")
    state, shards = trainer.checkpoint_state()
    assert trainer.checkpoint_format == "full" and shards is None and len(state["model"]) > 0
