"""TrajectoryBatch transfer: exact (de)serialisation in one process, and a real 2-process gloo round trip
with metadata on a FileStore control plane, a timed-out receive and an out-of-order receive."""

from __future__ import annotations

import json
import random
from dataclasses import fields
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from digenrl.data.text_condition import TextCondition
from digenrl.data.trajectory import TrajectoryBatch
from digenrl.runtime.comm.control_plane import ControlPlane
from digenrl.runtime.comm.errors import DistributedTimeoutError
from digenrl.runtime.comm.transfer import (
    TransferStats,
    batch_from_tensors,
    batch_to_tensors,
    recv_trajectories,
    send_trajectories,
)
from tests.runtime.spawn import spawn_workers


def synthetic_batch(*, optional: bool, mask: bool, embeds_dtype=torch.float32) -> TrajectoryBatch:
    """A batch with every field filled with fresh random values (optional fields set or None)."""
    prompts_n, group, k, text_len = random.randint(1, 3), 2, random.randint(1, 3), random.randint(2, 5)
    b = prompts_n * group
    latent = (4, 4, random.choice([4, 6]))
    return TrajectoryBatch(
        prompts=[f"prompt {random.random():.6f} ünïcode" for _ in range(b)],
        prompt_ids=torch.arange(b) // group + random.randint(0, 100),
        sample_ids=torch.arange(b) % group,
        seeds=torch.randint(0, 2**62, (b,)),
        cond=TextCondition(
            embeds=torch.randn(b, text_len, 8).to(embeds_dtype),
            pooled=torch.randn(b, 8) if optional else None,
            mask=(torch.rand(b, text_len) > 0.3) if mask else None,
        ),
        latents=torch.randn(b, k, *latent),
        next_latents=torch.randn(b, k, *latent),
        log_probs=torch.randn(b, k),
        step_indices=torch.randint(0, 10, (b, k)),
        sigmas=torch.rand(b, k),
        next_sigmas=torch.rand(b, k),
        policy_version=torch.full((b,), random.randint(0, 50), dtype=torch.int64),
        iteration=random.randint(0, 1000),
        final_latents=torch.randn(b, *latent) if optional else None,
        rewards=torch.randn(b) if optional else None,
        advantages=torch.randn(b) if optional else None,
    )


def assert_batches_identical(a: TrajectoryBatch, b: TrajectoryBatch) -> None:
    for f in fields(TrajectoryBatch):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, TextCondition):
            x, y = x.to_dict(), y.to_dict()
            assert x.keys() == y.keys()
            for key in x:
                assert x[key].dtype == y[key].dtype and torch.equal(x[key], y[key]), f"cond.{key}"
        elif isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor), f.name
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), f.name
        else:
            assert x == y, f.name


def _variants() -> list[TrajectoryBatch]:
    return [
        synthetic_batch(optional=True, mask=True, embeds_dtype=torch.bfloat16),
        synthetic_batch(optional=False, mask=False),
        synthetic_batch(optional=False, mask=True),
    ]


def test_round_trip_is_exact_through_json():
    for batch in _variants():
        meta, tensors = batch_to_tensors(batch)
        meta = json.loads(json.dumps(meta))  # what the store carries
        back = batch_from_tensors(meta, [t.clone() for t in tensors])
        assert_batches_identical(batch, back)


def test_field_order_and_optional_fields():
    full = synthetic_batch(optional=True, mask=True)
    names = [e["name"] for e in batch_to_tensors(full)[0]["fields"]]
    assert names == [
        "prompt_ids",
        "sample_ids",
        "seeds",
        "cond.embeds",
        "cond.pooled",
        "cond.mask",
        "latents",
        "next_latents",
        "log_probs",
        "step_indices",
        "sigmas",
        "next_sigmas",
        "policy_version",
        "final_latents",
        "rewards",
        "advantages",
    ]
    bare = synthetic_batch(optional=False, mask=False)
    bare_names = [e["name"] for e in batch_to_tensors(bare)[0]["fields"]]
    assert not {"cond.pooled", "cond.mask", "final_latents", "rewards", "advantages"} & set(bare_names)
    back = batch_from_tensors(*batch_to_tensors(bare))
    assert back.rewards is None and back.advantages is None and back.cond.mask is None


def test_from_tensors_rejects_inconsistent_input():
    meta, tensors = batch_to_tensors(synthetic_batch(optional=True, mask=False))
    with pytest.raises(ValueError, match="metadata lists"):
        batch_from_tensors(meta, tensors[:-1])
    bad = list(tensors)
    bad[0] = bad[0].to(torch.int32)
    with pytest.raises(ValueError, match=r"tensor 'prompt_ids' is torch\.int32"):
        batch_from_tensors(meta, bad)
    with pytest.raises(ValueError, match="format 99"):
        batch_from_tensors({**meta, "format": 99}, tensors)


# ----------------------------------------------------------------------------- 2 processes

NAMESPACE = "transfer-test"


def _worker(rank: int, world: int, tmp: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    store = dist.FileStore(f"{tmp}/plane", world)
    role = "generator" if rank == 0 else "trainer"
    plane = ControlPlane(store, rank, role, 30.0, namespace=NAMESPACE).scoped("iter0")
    out: dict = {}
    try:
        batches = torch.load(f"{tmp}/batches.pt", weights_only=False)
        if rank == 0:
            out["stats"] = [
                send_trajectories(batch, 1, plane=plane, key=f"fragment/{i}")
                for i, batch in enumerate(batches)
            ]
            # wrong order: this metadata claims to be transfer #7 from rank 0 (no tensors follow)
            meta, _ = batch_to_tensors(batches[0])
            plane.publish("fragment/out-of-order", json.dumps({**meta, "sequence": 7, "src": 0}))
        else:
            received, stats = [], []
            for i in range(len(batches)):
                batch, stat = recv_trajectories(
                    0, plane=plane, key=f"fragment/{i}", device="cpu", timeout_s=30
                )
                received.append(batch)
                stats.append(stat)
            out["received"], out["stats"] = received, stats
            try:
                recv_trajectories(0, plane=plane, key="fragment/never", device="cpu", timeout_s=0.5)
            except DistributedTimeoutError as error:
                out["timeout"] = str(error)
            try:
                recv_trajectories(0, plane=plane, key="fragment/out-of-order", device="cpu", timeout_s=30)
            except RuntimeError as error:
                out["order"] = str(error)
        torch.save(out, f"{tmp}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_two_process_round_trip_timeout_and_order(tmp_path):
    batches = _variants()
    torch.save(batches, tmp_path / "batches.pt")
    spawn_workers(_worker, 2, (str(tmp_path),))
    sender = torch.load(tmp_path / "rank0.pt", weights_only=False)
    receiver = torch.load(tmp_path / "rank1.pt", weights_only=False)

    assert len(receiver["received"]) == len(batches)
    for sent, got in zip(batches, receiver["received"], strict=True):
        assert_batches_identical(sent, got)
    for batch, sent, got in zip(batches, sender["stats"], receiver["stats"], strict=True):
        _, tensors = batch_to_tensors(batch)
        expected = sum(t.numel() * t.element_size() for t in tensors)
        assert isinstance(sent, TransferStats) and isinstance(got, TransferStats)
        assert sent.bytes == got.bytes == expected
        assert sent.tensors == got.tensors == len(tensors)
        assert sent.seconds >= 0 and got.seconds >= 0 and got.wait_seconds >= 0

    message = receiver["timeout"]
    assert "rank 1 (trainer)" in message
    assert f"{NAMESPACE}/iter0/fragment/never" in message
    assert "from rank 0" in message and "0.5 s" in message

    order = receiver["order"]
    assert "'fragment/out-of-order' was transfer #7 from rank 0" in order
    assert f"received as #{len(batches)}" in order
