"""The two-rank data-parallel case shared by the DDP/FSDP2 and DeepSpeed tests: uneven shares per rank, two
fragments per iteration, and the single-process update on the union of both ranks' data as the reference."""

from __future__ import annotations

import os

import torch

from digenrl.config import Config
from digenrl.trainer import PolicyTrainer

from .fixtures import build_model, make_sampler, perturb_adapter, rollout_batch, select

SHARES = {0: [[0, 1], [2, 3]], 1: [[4], [5]]}  # (rank, fragment) -> samples; rank 0 holds twice rank 1's
ITERATIONS = 2


def run_iteration(trainer: PolicyTrainer, batch, fragments) -> tuple[int, dict]:
    weight = 1.0 / batch.num_units  # all ranks' units count: 6 samples x 2 steps
    stats = [trainer.accumulate(select(batch, samples), weight) for samples in fragments]
    return sum(s["units"] for s in stats), trainer.step()


def single_process_reference(tmp: str, configs: dict[str, Config]) -> dict:
    """Per scenario, one process trains every fragment of both ranks: the starting state, the batches,
    each step's statistics and the state after each iteration (also saved to ``tmp/reference.pt`` for the
    workers)."""
    results = {}
    for name, cfg in configs.items():
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
            _, out = run_iteration(trainer, batch, [f for r in (0, 1) for f in SHARES[r]])
            steps.append(out)
            states.append(trainer.state_dict())
        results[name] = {"init": init, "batches": batches, "steps": steps, "states": states}
    torch.save(results, os.path.join(tmp, "reference.pt"))
    return results


def assert_states_close(a: dict, b: dict, atol: float) -> None:
    """Two trainer states (weights, step count, optimizer moments by name) agree."""
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
