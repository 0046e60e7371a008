"""Two trainer ranks (gloo, CPU) with DDP and FSDP2 produce the single-process update on the union of
their data — with uneven shares per rank and two fragments per iteration — and their gathered state
loads across layouts (2 ranks ↔ 1 process)."""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from digenrl.trainer import PolicyTrainer
from tests.runtime.spawn import spawn_workers

from .data_parallel_case import (
    ITERATIONS,
    SHARES,
    assert_states_close,
    run_iteration,
    single_process_reference,
)
from .fixtures import build_model, make_config, make_sampler

pytestmark = pytest.mark.distributed

SCENARIOS = {
    "ddp-lora-kl": ["trainer.backend=ddp", "trainer.mode=lora", "algo.kl_beta=0.04"],
    "fsdp2-full": ["trainer.backend=fsdp2", "trainer.mode=full", "trainer.lr=0.001"],
    "fsdp2-lora-kl": ["trainer.backend=fsdp2", "trainer.mode=lora", "algo.kl_beta=0.04"],
}
# (rank, fragment) -> samples of the 6-sample logical batch; rank 0 holds twice rank 1's units


def _config(name):
    return make_config(*SCENARIOS[name], "trainer.micro_batch_size=2", "trainer.grad_clip=0.5")


def _worker(rank, world_size, tmp):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{tmp}/store",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=60),
    )
    try:
        reference = torch.load(os.path.join(tmp, "reference.pt"), weights_only=False)
        out = {}
        for name, ref in reference.items():
            cfg = _config(name)
            model = build_model(seed=rank)  # different per rank on purpose: wrapping must broadcast rank 0's
            trainer = PolicyTrainer(
                cfg, model, make_sampler(cfg, model), uncond=None, device="cpu", world_size=world_size
            )
            trainer.load_trainable_state_dict(ref["init"])
            steps = []
            for batch in ref["batches"]:
                units, step = run_iteration(trainer, batch, SHARES[rank])
                steps.append({**step, "units": units})
            state = trainer.state_dict()
            # resume from the single-process state after iteration 1 and redo iteration 2 under this layout
            trainer.load_state_dict(ref["states"][0])
            _, redo = run_iteration(trainer, ref["batches"][1], SHARES[rank])
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


def test_two_rank_ddp_and_fsdp2_equal_the_single_process_update():
    with tempfile.TemporaryDirectory() as tmp:
        reference = single_process_reference(tmp, {name: _config(name) for name in SCENARIOS})
        spawn_workers(_worker, 2, (tmp,))
        ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(2)]

    for name, ref in reference.items():
        got, other = ranks[0][name], ranks[1][name]
        assert got["backend"] == SCENARIOS[name][0].split("=")[1]
        for it in range(ITERATIONS):
            assert got["steps"][it]["units"] + other["steps"][it]["units"] == 12
            for key in ("grad_norm", "update_norm"):
                expected = ref["steps"][it][key]
                assert got["steps"][it][key] == pytest.approx(expected, rel=1e-5), (name, it, key)
                assert other["steps"][it][key] == pytest.approx(expected, rel=1e-5), (name, it, key)
        assert_states_close(got["state"], ref["states"][-1], atol=1e-6)
        assert other["state"] == {} or other["state"]["model"] == {}  # full state is gathered on rank 0 only
        assert got["redo"]["update_norm"] == pytest.approx(ref["steps"][1]["update_norm"], rel=1e-5)
        assert_states_close(got["redo_state"], ref["states"][1], atol=1e-6)
