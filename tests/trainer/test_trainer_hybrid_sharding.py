"""Hybrid sharding (``trainer.sharding=hybrid``, HSDP) on 4 gloo ranks declared as 2 nodes × 2
(``profile=cpu-4-2node``): the groups are created on every rank (ranks outside the trainers keep none), each
rank holds half the weights (sharded inside its node, not over all four), the replicas of a shard stay
identical, and two full fine-tuning steps — uneven shares, two fragments per step, clipping active — give
the flat FSDP2 update (loss, gradient norm, update norm, final weights and Adam moments within fp32
summation order). A sharded checkpoint (DCP) of the hybrid trainer written after the first step and loaded
into a fresh hybrid trainer continues bit for bit."""

from __future__ import annotations

import math
import os
import tempfile
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from digenrl.runtime.comm.shard_groups import build_shard_groups
from digenrl.runtime.hardware.profiles import load_profile
from digenrl.trainer import PolicyTrainer, load_latest_checkpoint
from digenrl.trainer.checkpoint import save_checkpoint
from tests.runtime.spawn import spawn_workers

from .data_parallel_case import assert_states_close
from .fixtures import build_model, make_config, make_sampler, rollout_batch, select

pytestmark = pytest.mark.distributed

WORLD = 4
CLIP = 0.01
#: (rank, fragment) -> samples of the 10-sample logical batch: uneven on purpose (rank 0 holds 3, rank 3 3)
SHARES = {0: [[0, 1], [2]], 1: [[3], [4]], 2: [[5], [6]], 3: [[7], [8, 9]]}
FULL_FT = [
    "trainer.mode=full",
    "trainer.backend=fsdp2",
    "trainer.lr=0.001",
    "trainer.micro_batch_size=2",
    f"trainer.grad_clip={CLIP}",  # below the gradient norm: clipping acts, so a wrong norm changes the update
]


def _trainer(*overrides, shard_groups=None, world_size=WORLD):
    cfg = make_config(*FULL_FT, *overrides)
    model = build_model(seed=0)
    return PolicyTrainer(
        cfg,
        model,
        make_sampler(cfg, model),
        uncond=None,
        device="cpu",
        world_size=world_size,
        shard_groups=shard_groups,
    )


def _batches():
    trainer = _trainer(world_size=1)  # one process: backend none
    return [
        rollout_batch(trainer.flow_model, trainer.sampler, batch_size=10, num_train_steps=2, seed=70 + i)
        for i in range(2)
    ]


def _iteration(trainer, batch, fragments) -> dict[str, float]:
    """This rank's fragments accumulated, then one step: the step's statistics and this rank's loss sum."""
    losses = [
        trainer.accumulate(select(batch, samples), 1.0 / batch.num_units)["loss_sum"] for samples in fragments
    ]
    return {**trainer.step(), "loss_sum": sum(losses)}


def _local_checksum(trainer) -> list[float]:
    return [
        float(trainer.backend.local_view(p).detach().double().sum())
        for p in trainer.backend.trainable_parameters()
    ]


def _assert_same_state(a: dict, b: dict) -> None:
    assert a["steps"] == b["steps"] and a["model"].keys() == b["model"].keys() and a["model"]
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    for name, entry in a["optimizer"]["state"].items():
        for key, value in entry.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b["optimizer"]["state"][name][key])), (
                name,
                key,
            )


def _worker(rank, world, tmp):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    try:
        node_of = load_profile("cpu-4-2node").node_of
        # trainers 0 and 2 of a separate layout: every rank creates the groups, the others keep none
        some = build_shard_groups((0, 2), node_of, timeout_s=60)
        assert (some is None) == (rank % 2 == 1)
        if some is not None:
            assert some.shard_ranks == (rank,) and some.replica_ranks == (0, 2)
            one = torch.ones(1)
            dist.all_reduce(one, group=some.replica)
            assert one.item() == 2
        groups = build_shard_groups(range(world), node_of, timeout_s=60)
        assert groups.shard_ranks == ((0, 1) if rank < 2 else (2, 3))
        assert groups.replica_ranks == ((0, 2) if rank % 2 == 0 else (1, 3))
        batches = torch.load(os.path.join(tmp, "batches.pt"), weights_only=False)
        flat = _trainer()
        hybrid = _trainer("trainer.sharding=hybrid", shard_groups=groups)
        # a shard per rank of the node (half the weights), not per rank of the group (a quarter)
        for (name, p), (_, q) in zip(
            flat.backend.named_trainable(), hybrid.backend.named_trainable(), strict=True
        ):
            rows = p.shape[0]
            assert flat.backend.local_view(p).shape[0] == -(-rows // 4), name
            assert hybrid.backend.local_view(q).shape[0] == -(-rows // 2), name
        results = {"flat": [], "hybrid": []}
        for i, batch in enumerate(batches):
            for key, trainer in (("flat", flat), ("hybrid", hybrid)):
                results[key].append(_iteration(trainer, batch, SHARES[rank]))
            a, b = results["flat"][i], results["hybrid"][i]
            # the same weights see the same units: the first step's loss is identical on every rank
            if i == 0:
                assert a["loss_sum"] == b["loss_sum"], (rank, a, b)
            assert b["loss_sum"] == pytest.approx(a["loss_sum"], rel=1e-5), (rank, i, a, b)
            if i == 0:
                state, shards = hybrid.checkpoint_state()
                assert shards is not None  # FSDP2 full fine-tuning: the sharded format (DCP)
                save_checkpoint(
                    os.path.join(tmp, "hybrid"),
                    1,
                    {"trainer": state},
                    rank=rank,
                    is_writer=rank == 0,
                    sharded=shards,
                )
        # every replica of a shard holds the same weights
        sums = [None] * world
        dist.all_gather_object(sums, _local_checksum(hybrid))
        assert sums[rank] == sums[rank ^ 2], (rank, sums)
        # resume: a fresh hybrid trainer loads step 1 and runs the second step as the uninterrupted one did
        resumed = _trainer("trainer.sharding=hybrid", shard_groups=groups)
        ckpt = load_latest_checkpoint(os.path.join(tmp, "hybrid"))
        assert ckpt["format"] == "sharded" and ckpt["step"] == 1
        resumed.load_state_dict(ckpt["trainer"], checkpoint_dir=ckpt["path"])
        second = _iteration(resumed, batches[1], SHARES[rank])
        assert second == results["hybrid"][1], (rank, second, results["hybrid"][1])
        states = {
            key: t.state_dict() for key, t in (("flat", flat), ("hybrid", hybrid), ("resumed", resumed))
        }
        if rank == 0:
            torch.save({"results": results, "second": second, "states": states}, os.path.join(tmp, "out.pt"))
    finally:
        dist.destroy_process_group()


def test_hybrid_sharding_gives_the_flat_update_and_resumes_exactly():
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(_batches(), os.path.join(tmp, "batches.pt"))
        spawn_workers(_worker, WORLD, (tmp,), limit_s=120)
        out = torch.load(os.path.join(tmp, "out.pt"), weights_only=False)
    flat, hybrid = out["results"]["flat"], out["results"]["hybrid"]
    for step, (a, b) in enumerate(zip(flat, hybrid, strict=True)):
        assert a["grad_norm"] > CLIP, (step, a["grad_norm"])  # clipping acted
        for key in ("grad_norm", "update_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-5), (step, key, a[key], b[key])
            assert math.isfinite(b[key]) and b[key] > 0
    states = out["states"]
    assert_states_close(states["flat"], states["hybrid"], atol=1e-6)
    # the resumed run's second step and final state are the uninterrupted hybrid run's, bit for bit
    assert out["second"] == hybrid[1]
    _assert_same_state(states["hybrid"], states["resumed"])
