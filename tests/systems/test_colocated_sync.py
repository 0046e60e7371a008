"""``colocated-sync`` end to end: learning, 1 vs 2 ranks, outputs, exact resume, start-up errors."""

from __future__ import annotations

import json
import math

import pytest

from digenrl.runtime.observe.metrics import REQUIRED_KEYS, read_metrics
from tests.systems.equivalence import assert_same_update
from tests.systems.launcher import assert_resumed_exactly, resume_from_copy, run_train

# experiments/configs/tiny.yaml runs digenrl on cpu-2 (the main job); these tests run the baseline
BASE = ["system=colocated-sync", "profile=cpu-1"]
LEARN = [*BASE, "iterations=16", "seed=0"]


def _learning_margin(records: list[dict]) -> tuple[float, float]:
    """Improvement of the batch-mean reward (last 3 vs first 3 iterations) and the noise scale of one
    batch mean (initial within-batch std / sqrt(B)), so the assertion is in units of sampling noise."""
    first = sum(r["reward_mean"] for r in records[:3]) / 3
    last = sum(r["reward_mean"] for r in records[-3:]) / 3
    noise = records[0]["reward_std"] / math.sqrt(records[0]["samples"])
    return last - first, noise


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    proc = run_train([*LEARN, f"out_dir={out}"])
    return out, proc


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("two")
    proc = run_train([*LEARN, "profile=cpu-2", f"out_dir={out}"], nproc=2)
    return out, proc


def test_single_process_learns_the_reward(single):
    out, proc = single
    records = read_metrics(out)
    assert len(records) == 16
    gain, noise = _learning_margin(records)
    assert gain > 5 * noise, f"reward did not improve clearly: gain {gain:.5f}, noise {noise:.5f}"
    assert "[digenrl] iteration 15 (16/16)" in proc.stdout


def test_two_ranks_learn_and_match_the_single_process_run(single, two_ranks):
    """Same seed and logical batch on 1 and 2 ranks: every sample is drawn from its own seeded
    generator and gradients are summed exactly, so the runs agree up to fp32 batch-composition noise."""
    gain, noise = _learning_margin(read_metrics(two_ranks[0]))
    assert gain > 5 * noise
    assert_same_update(
        single[0], two_ranks[0], rel=1e-3, reward_abs=1e-5, samples=16, equal=("policy_version",)
    )


def test_outputs_metrics_config_events_trace_and_checkpoint(two_ranks):
    out, _ = two_ranks
    for record in read_metrics(out):
        assert set(REQUIRED_KEYS) <= set(record)
        assert abs(record["ratio_mean"] - 1.0) < 1e-3  # on-policy, one update per batch
        # model FLOPs by phase on every run; on a CPU no fraction of the bound, and the reason
        assert record["flops"]["total"] == pytest.approx(
            sum(v for k, v in record["flops"].items() if k != "total")
        )
        assert record["flops"]["rollout"] > 0 and record["flops"]["train"] > 0
        assert "fraction_of_bound" not in record and "measured matmul ceiling" in record["bound_note"]
    assert (out / "config.yaml").is_file()
    assert sorted(p.name for p in (out / "events").glob("rank*.jsonl")) == ["rank0.jsonl", "rank1.jsonl"]
    trace = json.loads((out / "trace.json").read_text())
    pids = {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert pids == {0, 1}
    assert (out / "checkpoints" / "latest").is_file()


def test_resume_replays_the_uninterrupted_run_exactly(tmp_path, monkeypatch):
    """A run crashes at the start of iteration 3, after checkpoint step_2 and after metrics and events of
    iteration 2 were written; resuming it gives the uninterrupted run: one metrics line per iteration with
    the same values, the same weights and optimizer state, and the profile of both processes kept."""
    full, part = tmp_path / "full", tmp_path / "part"
    run = [*BASE, "iterations=4", "checkpoint_every=2"]
    run_train([*run, f"out_dir={full}"])
    monkeypatch.setenv("DIGENRL_INJECT_FAULT", "rank=0,iteration=3")
    crashed = run_train([*run, f"out_dir={part}"], check=False)
    assert crashed.returncode != 0 and [r["iteration"] for r in read_metrics(part)] == [0, 1, 2]
    monkeypatch.delenv("DIGENRL_INJECT_FAULT")
    proc = run_train([*run, "resume=true", f"out_dir={part}"])
    assert "[digenrl] iteration 2 (3/4)" in proc.stdout and "iteration 1 (" not in proc.stdout
    assert_resumed_exactly(full, part, copied=False)
    trace = json.loads((part / "trace.json").read_text())
    optimizer = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["name"] == "optimizer"]
    assert [(e["args"]["iteration"], e["args"].get("superseded", False)) for e in optimizer] == [
        (0, False),
        (1, False),
        (2, True),  # the first process's iteration 2, redone after the resume
        (2, False),
        (3, False),
    ]
    assert [r["iteration"] for r in read_metrics(part) if r.get("busy_fraction")] == [0, 1, 2, 3]


def test_colocated_overlap_resumes_exactly(tmp_path):
    overlap = ["system=colocated-overlap", "profile=cpu-1", "iterations=3", "checkpoint_every=2"]
    run_train([*overlap, f"out_dir={tmp_path / 'full'}"])
    resume_from_copy(tmp_path / "full", tmp_path / "resumed", 2, overlap)
    assert_resumed_exactly(tmp_path / "full", tmp_path / "resumed")


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["model=nope"], "model.name"),
        (["algo.group_size=1"], "algo.group_size"),
        (["bogus.key=1"], "bogus"),
    ],
)
def test_bad_config_fails_at_startup_naming_the_key(tmp_path, overrides, needle):
    proc = run_train([*BASE, *overrides, f"out_dir={tmp_path}"], check=False, timeout_s=120)
    assert proc.returncode == 2
    assert needle in proc.stderr


def test_more_ranks_than_the_profile_fails_at_startup(tmp_path):
    proc = run_train([*BASE, f"out_dir={tmp_path}"], nproc=2, check=False, timeout_s=120, launcher="command")
    assert proc.returncode != 0
    assert "profile='cpu-1' has only 1 devices" in proc.stderr


def test_parked_optimizer_state_moves_once_per_iteration_and_changes_nothing(tmp_path):
    """residency.train_resident=false parks the optimizer state for generation and scoring and brings
    it back once, right before the optimizer step (the train_resident=false sequence of docs/references.md
    [001], with the rollout sharing the trainer's weights); the run itself is unchanged bit for bit."""
    resident, parked = tmp_path / "resident", tmp_path / "parked"
    run_train([*BASE, "iterations=3", f"out_dir={resident}"])
    run_train([*BASE, "iterations=3", "residency.train_resident=false", f"out_dir={parked}"])
    for a, b in zip(read_metrics(resident), read_metrics(parked), strict=True):
        for key in ("reward_mean", "loss", "update_norm", "grad_norm"):
            assert a[key] == b[key], key
    records = [json.loads(line) for line in (parked / "events" / "rank0.jsonl").read_text().splitlines()]
    notes = [r["message"] for r in records if r["type"] == "note" and r.get("kind") == "residency"]
    assert notes == ["residency: train offload", "residency: train onload"] * 3
    # every swap is measured: a span per transition, with its iteration, bytes moved and seconds
    swaps = [r for r in records if r["type"] == "span" and r["phase"] == "residency"]
    assert [(s["iteration"], s["extra"]["kind"]) for s in swaps] == [
        (k, kind) for k in range(3) for kind in ("offload", "onload")
    ]
    assert all(s["t_end"] >= s["t_start"] for s in swaps)
    # AdamW creates its state at the first step: iteration 0 has nothing to move, later ones do
    assert [s["extra"]["bytes"] > 0 for s in swaps] == [False, False] + [True] * 4
    assert all(r["phase_seconds"]["colocated"]["residency"] > 0 for r in read_metrics(parked))
    assert not any(
        '"residency"' in line for line in (resident / "events" / "rank0.jsonl").read_text().splitlines()
    )
