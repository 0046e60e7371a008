"""DeepSpeed ZeRO-2 and ZeRO-3 on two CPU ranks (gloo, DeepSpeed's CPU accelerator) compute the
single-process update on the union of their data — uneven shares per rank, two fragments per iteration —
and their checkpoint state (fp32 master weights, Adam moments by name) loads across layouts. Needs the
``deepspeed`` package (the ``test`` extra installs it)."""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from digenrl.trainer import PolicyTrainer
from tests.runtime.spawn import spawn_workers

from .fixtures import build_model, make_config, make_sampler, perturb_adapter, rollout_batch, select

pytestmark = pytest.mark.distributed

SCENARIOS = {
    "zero2-lora": ["trainer.backend=deepspeed", "trainer.deepspeed_stage=2", "trainer.mode=lora"],
    "zero3-full": [
        "trainer.backend=deepspeed",
        "trainer.deepspeed_stage=3",
        "trainer.mode=full",
        "trainer.lr=0.001",
    ],
}
SHARES = {0: [[0, 1], [2, 3]], 1: [[4], [5]]}  # (rank, fragment) -> samples; rank 0 holds twice rank 1's
ITERATIONS = 2


def _config(name):
    return make_config(*SCENARIOS[name], "trainer.micro_batch_size=2", "trainer.grad_clip=0.5")


def _run_iteration(trainer, batch, fragments):
    weight = 1.0 / batch.num_units  # all ranks' units count: 6 samples x 2 steps
    stats = [trainer.accumulate(select(batch, samples), weight) for samples in fragments]
    return sum(s["units"] for s in stats), trainer.step()


def _reference(tmp):
    """Single process, no data parallelism: every fragment of both ranks in one trainer."""
    results = {}
    for name in SCENARIOS:
        cfg = make_config(*[o for o in SCENARIOS[name] if "deepspeed" not in o], "trainer.backend=none")
        cfg.trainer.micro_batch_size, cfg.trainer.grad_clip = 2, 0.5
        model = build_model(seed=0)
        trainer = PolicyTrainer(cfg, model, make_sampler(cfg, model), uncond=None, device="cpu")
        if cfg.trainer.mode == "lora":
            perturb_adapter(model)
        init = trainer.trainable_state_dict()
        batches = [
            rollout_batch(model, trainer.sampler, batch_size=6, num_train_steps=2, seed=100 + i)
            for i in range(ITERATIONS)
        ]
        steps, states = [], []
        for batch in batches:
            _, out = _run_iteration(trainer, batch, [f for r in (0, 1) for f in SHARES[r]])
            steps.append(out)
            states.append(trainer.state_dict())
        results[name] = {"init": init, "batches": batches, "steps": steps, "states": states}
    torch.save(results, os.path.join(tmp, "reference.pt"))
    return results


def _worker(rank, world_size, tmp):
    torch.set_num_threads(1)
    os.environ.update(
        {"DS_ACCELERATOR": "cpu", "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size)}
    )
    dist.init_process_group(
        "gloo",
        init_method=f"file://{tmp}/store",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=90),
    )
    try:
        reference = torch.load(os.path.join(tmp, "reference.pt"), weights_only=False)
        out = {}
        for name, ref in reference.items():
            cfg = _config(name)
            model = build_model(seed=0)
            trainer = PolicyTrainer(
                cfg, model, make_sampler(cfg, model), uncond=None, device="cpu", world_size=world_size
            )
            trainer.load_trainable_state_dict(ref["init"])
            steps = []
            for batch in ref["batches"]:
                units, step = _run_iteration(trainer, batch, SHARES[rank])
                steps.append({**step, "units": units})
            state = trainer.state_dict()
            # a fresh trainer (no step yet: ZeRO-3 has no optimizer state) resumes from the single-process
            # state after iteration 1 and redoes iteration 2 under ZeRO
            trainer.backend.engine.destroy()
            model = build_model(seed=0)  # LoRA: the frozen base must be the reference's
            trainer = PolicyTrainer(
                cfg, model, make_sampler(cfg, model), uncond=None, device="cpu", world_size=world_size
            )
            trainer.load_state_dict(ref["states"][0])
            _, redo = _run_iteration(trainer, ref["batches"][1], SHARES[rank])
            out[name] = {
                "backend": trainer.backend.name,
                "steps": steps,
                "state": state,
                "redo": redo,
                "redo_state": trainer.state_dict(),
            }
        torch.save(out, os.path.join(tmp, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _assert_states_close(a, b, atol):
    assert a["model"].keys() == b["model"].keys()
    for n in a["model"]:
        torch.testing.assert_close(
            a["model"][n], b["model"][n], rtol=0, atol=atol, msg=lambda m, n=n: f"{n}: {m}"
        )
    assert a["steps"] == b["steps"]
    assert a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()
    for n, entry in a["optimizer"]["state"].items():
        assert entry.keys() == b["optimizer"]["state"][n].keys(), n
        for k, v in entry.items():
            torch.testing.assert_close(
                v,
                b["optimizer"]["state"][n][k],
                rtol=1e-5,
                atol=atol,
                msg=lambda m, n=n, k=k: f"{n} {k}: {m}",
            )


def test_two_rank_deepspeed_zero2_and_zero3_equal_the_single_process_update():
    with tempfile.TemporaryDirectory() as tmp:
        reference = _reference(tmp)
        spawn_workers(_worker, 2, (tmp,), limit_s=150)
        ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(2)]

    for name, ref in reference.items():
        got, other = ranks[0][name], ranks[1][name]
        assert got["backend"] == "deepspeed"
        for it in range(ITERATIONS):
            assert got["steps"][it]["units"] + other["steps"][it]["units"] == 12
            for key in ("grad_norm", "update_norm"):
                expected = ref["steps"][it][key]
                assert got["steps"][it][key] == pytest.approx(expected, rel=1e-5), (name, it, key)
                assert other["steps"][it][key] == pytest.approx(expected, rel=1e-5), (name, it, key)
        _assert_states_close(got["state"], ref["states"][-1], atol=1e-6)
        assert other["state"]["model"] == {}  # full state is gathered on rank 0 only
        assert got["redo"]["update_norm"] == pytest.approx(ref["steps"][1]["update_norm"], rel=1e-5)
        _assert_states_close(got["redo_state"], ref["states"][1], atol=1e-6)
