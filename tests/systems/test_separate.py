"""Disjoint pools: separate-sync / separate-async equal colocated-sync on the same data; robustness.

All runs use the tiny model on CPU with gloo. Generation is bit-identical across schedules because
every sample draws from its own seeded generator and each generator / colocated rank batches the same
prompt groups; the update agrees up to fp32 summation order (units split differently over trainers).
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from digenrl.config import ConfigError, load_config
from digenrl.runtime.observe.metrics import read_metrics
from digenrl.trainer.checkpoint import load_latest_checkpoint
from digenrl.validation import validate_config
from tests.systems.equivalence import assert_same_update
from tests.systems.launcher import RESUME_KEYS, TINY, assert_resumed_exactly, resume_from_copy, run_train

# forwards and decodes of one group in every system: the first iteration is then the same computation, bit
# for bit (its batches are checked: tests/systems/equivalence.py, first_rewards_exact)
COMMON = [
    "iterations=2",
    "seed=5",
    "checkpoint_every=1",
    "sampler.samples_per_forward=4",
    "runtime.record_batches=true",
]
SEPARATE = ["profile=cpu-4", "pools.trainers=2", "pools.generators=2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pools")
    dirs = {
        "colocated-sync": root / "colocated",
        "separate-sync": root / "ssync",
        "separate-async": root / "sasync",
    }
    run_train([*COMMON, "profile=cpu-2", f"out_dir={dirs['colocated-sync']}"], nproc=2)
    for system in ("separate-sync", "separate-async"):
        run_train([*COMMON, *SEPARATE, f"system={system}", f"out_dir={dirs[system]}"], nproc=4)
    return dirs


def _model_state(out_dir) -> dict[str, torch.Tensor]:
    payload = load_latest_checkpoint(out_dir)
    assert payload is not None and payload["next_iteration"] == 2
    return payload["trainer"]["model"]


@pytest.mark.parametrize("system", ["separate-sync", "separate-async"])
def test_same_trajectories_and_update_as_colocated_sync(runs, system):
    # Iteration 0 starts from the same weights: bit-identical trajectories, hence identical rewards; later
    # iterations use θ_k that differs in the last fp32 bits (gradient summation order).
    assert_same_update(
        runs["colocated-sync"],
        runs[system],
        rel=1e-4,
        samples=16,
        iterations=2,
        first_rewards_exact=True,
        ratio_abs=1e-5,
        zero=("staleness",),
    )
    ref_state, state = _model_state(runs["colocated-sync"]), _model_state(runs[system])
    assert ref_state.keys() == state.keys()
    # Adam normalises each element by its own gradient scale, so an element whose gradient is ~0 can
    # move by up to lr on last-bit noise: compare the whole parameter vector, not element by element.
    ref = torch.cat([t.flatten() for t in ref_state.values()])
    new = torch.cat([state[name].flatten() for name in ref_state])
    assert (new - ref).norm() <= 1e-4 * ref.norm(), float((new - ref).norm() / ref.norm())


def test_async_with_staleness_zero_is_separate_sync(runs):
    sync, asynchronous = read_metrics(runs["separate-sync"]), read_metrics(runs["separate-async"])
    for a, b in zip(sync, asynchronous, strict=True):
        for key in ("reward_mean", "reward_std", "loss", "update_norm", "grad_norm", "staleness"):
            assert a[key] == b[key], key


def test_weight_sync_is_measured_and_trace_separates_the_pools(runs):
    records = read_metrics(runs["separate-sync"])
    assert all(r["sync_bytes"] > 0 and r["sync_s"] >= 0 for r in records)
    trace = json.loads((runs["separate-sync"] / "trace.json").read_text())
    names = {
        e["pid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    assert {pid: name.split("(")[-1].rstrip(")") for pid, name in names.items()} == {
        0: "trainer",
        1: "trainer",
        2: "generator",
        3: "generator",
    }
    phases = {(e["pid"], e["name"]) for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert (0, "train") in phases and (2, "generate") in phases and (2, "sync") in phases


def test_separate_sync_resumes_exactly(runs, tmp_path):
    system = [*COMMON, *SEPARATE, "system=separate-sync"]
    resume_from_copy(runs["separate-sync"], tmp_path / "resumed", 1, system, nproc=4)
    assert_resumed_exactly(runs["separate-sync"], tmp_path / "resumed")


def test_async_with_staleness_one_overlaps_stays_within_one_version_and_resumes_exactly(tmp_path):
    """Batch j is generated with θ_{j-1}, except right after a checkpoint: batch 2 waits for θ_2, so no
    stale batch is in flight when step_2 is written and a run resumed from it (whose generators start
    from θ_2) replays the uninterrupted run exactly, its stale batch 3 included."""
    out = tmp_path / "stale1"
    run = [
        "iterations=4",
        "checkpoint_every=2",
        "seed=5",
        *SEPARATE,
        "system=separate-async",
        "asynchrony.max_staleness=1",
    ]
    run_train([*run, f"out_dir={out}"], nproc=4)
    records = read_metrics(out)
    assert [r["staleness"] for r in records] == [0, 1, 0, 1]
    assert all(abs(r["ratio_mean"] - 1.0) < 1e-2 for r in records)
    spans = [json.loads(line) for line in (out / "events" / "rank2.jsonl").read_text().splitlines()]
    versions = {s["iteration"]: s["policy_version"] for s in spans if s.get("phase") == "generate"}
    assert versions == {0: 0, 1: 0, 2: 2, 3: 2}
    resume_from_copy(out, tmp_path / "resumed", 2, run, nproc=4)
    assert_resumed_exactly(out, tmp_path / "resumed", (*RESUME_KEYS, "staleness"))


@pytest.mark.parametrize(
    ("kind", "pools", "generator"),
    [
        # raise: the teardown by torchrun's elastic agent, on forked ranks (tests/systems/preloaded_launch.py)
        ("raise", SEPARATE, 3),
        # kill: the job torchrun itself tears down, and its failure summary (the user's command, each rank a
        # fresh interpreter importing torch: on the smallest separate job, 1 trainer + 1 generator)
        ("kill", ["profile=cpu-2", "pools.trainers=1", "pools.generators=1"], 1),
    ],
    ids=["raise", "kill"],
)
def test_a_failing_rank_brings_the_job_down_and_the_checkpoint_loads(
    tmp_path, kind, pools, generator, monkeypatch
):
    """The last generator rank fails at the start of iteration 1, once iteration 0's checkpoint is published
    (it runs ahead of the trainer ranks that write it: without ``after`` the job may be torn down first)."""
    out = tmp_path / kind
    latest = out / "checkpoints" / "latest"
    monkeypatch.setenv("DIGENRL_INJECT_FAULT", f"rank={generator},iteration=1,kind={kind},after={latest}")
    start = time.monotonic()
    proc = run_train(
        [
            *pools,
            "iterations=3",
            "system=separate-sync",
            "checkpoint_every=1",
            "runtime.timeout_s=30",
            f"out_dir={out}",
        ],
        nproc=generator + 1,
        check=False,
        timeout_s=120,
        launcher="command" if kind == "kill" else "preloaded",
    )
    assert proc.returncode != 0
    assert time.monotonic() - start < 100
    if kind == "raise":
        fault = f"injected fault on rank {generator} at iteration 1 (start)"
        assert f"[rank {generator}] FAILED: RuntimeError: {fault}" in proc.stderr
    else:
        assert f"rank      : {generator}" in proc.stderr or f"local_rank: {generator}" in proc.stderr
    payload = load_latest_checkpoint(out)
    assert payload is not None and payload["next_iteration"] == 1


@pytest.mark.parametrize(
    ("overrides", "world", "needles"),
    [
        (
            ["system=separate-sync", "pools.trainers=3", "pools.generators=3"],
            4,
            ["pools.trainers", "4 ranks"],
        ),
        (["system=separate-sync", "pools.trainers=0", "pools.generators=4"], 4, ["pools.trainers"]),
        (
            ["system=separate-sync", "pools.trainers=1", "pools.generators=2", "pools.scorers=1"],
            4,
            ["pools.scorers", "reward.name"],
        ),
        (["system=separate-sync"], 1, ["pools.trainers", "pools.generators", "at least 2 ranks"]),
        (
            ["system=separate-sync", "pools.trainers=1", "pools.generators=3"],
            4,
            ["algo.prompts_per_iteration=4", "pools.generators=3"],
        ),
        (
            ["system=separate-async", "pools.trainers=2", "pools.generators=2", "asynchrony.max_staleness=3"],
            4,
            ["asynchrony.max_staleness"],
        ),
    ],
)
def test_bad_pools_fail_at_startup_naming_the_keys(overrides, world, needles):
    cfg = load_config(TINY, ["profile=cpu-4", *overrides])
    with pytest.raises(ConfigError) as info:
        validate_config(cfg, world_size=world)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))
