"""Each algorithm runs end to end under colocated-sync, separate-sync and digenrl on CPU (tiny model): one
combined test per algorithm, two iterations per system."""

from __future__ import annotations

from pathlib import Path

from digenrl.runtime.observe.metrics import read_metrics
from tests.systems.launcher import run_train

SYSTEMS = (
    ("colocated-sync", 0, ["profile=cpu-1"]),
    ("separate-sync", 2, ["profile=cpu-2", "pools.trainers=1", "pools.generators=1"]),
    ("digenrl", 2, ["profile=cpu-2"]),
)


def _run_everywhere(tmp_path: Path, algo: list[str]) -> dict[str, list[dict]]:
    runs = {}
    for system, nproc, extra in SYSTEMS:
        out = tmp_path / system
        run_train(["iterations=2", f"system={system}", *extra, *algo, f"out_dir={out}"], nproc=nproc)
        runs[system] = read_metrics(out)
    return runs


def test_mixgrpo_flash_with_grpo_guard_runs_under_every_system(tmp_path):
    """MixGRPO-Flash with GRPO-Guard's RatioNorm and reweighting: a trainer rank regenerates the behaviour
    mean from the rollout's noise keys, so the on-policy ratio stays 1 on every layout."""
    algo = ["algo=mixgrpo", "algo.mix_window=2", "algo.mix_shift_interval=1", "algo.mix_ode_solver=dpm2"]
    algo += ["algo.ratio_norm=true", "algo.step_reweight=true"]
    runs = _run_everywhere(tmp_path, algo)
    for system, records in runs.items():
        assert len(records) == 2, system
        for r in records:  # on-policy: one optimizer step per iteration
            assert abs(r["ratio_min"] - 1) < 1e-3 and abs(r["ratio_max"] - 1) < 1e-3, (system, r)
            assert r["update_norm"] > 0, system
            assert r["train_units"] == 16 * 2, system  # 4 prompts x 4 samples x the window's 2 steps
    # the same trajectories and updates whatever the system (the window is a function of the iteration)
    reference = runs["colocated-sync"]
    for system in ("separate-sync", "digenrl"):
        for a, b in zip(reference, runs[system], strict=True):
            assert abs(a["reward_mean"] - b["reward_mean"]) < 1e-5, (system, a, b)


def test_diffusionnft_learns_and_runs_under_every_system(tmp_path):
    """DiffusionNFT (ODE rollouts, clean latents and rewards only): the tiny model's brightness reward rises
    over 10 colocated iterations, and the separate and digenrl layouts train on the same data."""
    algo = ["algo=diffusionnft"]
    learn = tmp_path / "learn"
    run_train(["iterations=10", "system=colocated-sync", "profile=cpu-1", *algo, f"out_dir={learn}"])
    rewards = [r["reward_mean"] for r in read_metrics(learn)]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.003, rewards
    runs = _run_everywhere(tmp_path, algo)
    for system, records in runs.items():
        assert len(records) == 2, system
        for r in records:
            assert r["update_norm"] > 0 and r["ratio_mean"] == 1.0, (system, r)
            assert r["train_units"] == 16 * 7, system  # ⌊8 · 0.99⌋ forward units per sample
    for system in ("separate-sync", "digenrl"):
        for a, b in zip(runs["colocated-sync"], runs[system], strict=True):
            assert abs(a["reward_mean"] - b["reward_mean"]) < 1e-5, (system, a, b)
            assert abs(a["loss"] - b["loss"]) < 1e-3 * abs(a["loss"]), (system, a, b)
