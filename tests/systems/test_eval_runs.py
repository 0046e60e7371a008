"""Evaluation in whole runs of every system (digenrl/rollout/evaluate.py): ``eval_*`` fields at iteration 0
and for the final policy, a grid per evaluation in ``samples/``, an ``eval`` span on exactly the ranks
holding the trainer's weights, and the same evaluation of the same initial weights whichever system and rank
split ran it. The README's main job (experiments/configs/tiny.yaml) evaluates by default."""

from __future__ import annotations

import json

import pytest

from digenrl.config import load_config
from digenrl.runtime.observe.metrics import read_metrics
from tests.systems.launcher import RESUME_KEYS, TINY, assert_resumed_exactly, resume_from_copy, run_train

#: three held-out prompts: two trainer ranks get unequal shares (one padded)
EVAL = ["iterations=2", "eval.every=1", "eval.num_prompts=3", "checkpoint_every=0"]


def _eval_spans(out_dir, rank: int) -> list[dict]:
    lines = (out_dir / "events" / f"rank{rank}.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("phase") == "eval"]


def _check_evaluations(out_dir, iterations: int) -> list[dict]:
    """Iteration 0 evaluates θ_0, the last record the final θ_N; a grid for each; returns the records."""
    records = read_metrics(out_dir)
    assert [r["iteration"] for r in records] == list(range(iterations))
    assert records[0]["eval_policy_version"] == 0
    assert records[-1]["eval_policy_version"] == iterations
    for record in (records[0], records[-1]):
        assert record["eval_samples"] > 0 and record["eval_reward_std"] >= 0
        # named by the policy it shows: the final grid is policy_v<N> (drawn after update N)
        assert (out_dir / "samples" / f"policy_v{record['eval_policy_version']}.png").is_file()
    assert (out_dir / "samples" / f"policy_v{iterations}.png").is_file()
    return records


@pytest.fixture(scope="module")
def colocated(tmp_path_factory):
    out = tmp_path_factory.mktemp("colocated")
    run_train(["system=colocated-sync", "profile=cpu-1", *EVAL, f"out_dir={out}"])
    return out


def test_the_main_job_reports_eval_reward_at_its_first_and_last_iteration_and_leaves_grids(tmp_path):
    """The README's command (digenrl, one trainer + one generator, gloo), shortened to 3 iterations."""
    assert load_config(TINY).eval.every > 0  # the shipped config evaluates
    proc = run_train(["iterations=3", f"out_dir={tmp_path}"], nproc=2, evaluate=True)
    lines = proc.stdout.splitlines()
    first = next(line for line in lines if line.startswith("[digenrl] iteration 0 "))
    last = next(line for line in lines if line.startswith("[digenrl] iteration 2 "))
    assert " | eval v0 " in first and " | eval v3 " in last
    assert "[digenrl] eval reward on held-out prompts: " in proc.stdout
    records = _check_evaluations(tmp_path, 3)
    assert "eval_reward_mean" not in records[1] and records[0]["eval_samples"] == 4  # tiny.yaml: 4 prompts
    assert len(_eval_spans(tmp_path, 0)) == 2 and not _eval_spans(
        tmp_path, 1
    )  # the trainer, not the generator
    trace = json.loads((tmp_path / "trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert any(e.get("name") == "eval" for e in events)


def test_two_trainer_ranks_evaluate_shares_that_gather_into_the_single_rank_result(colocated, tmp_path):
    """separate-sync, 2 trainers + 1 generator: each trainer evaluates its share (2 prompts; 1 + a padding
    repeat); rank 0 gathers them; θ_0's evaluation equals the one-process colocated run's (same noise and
    weights)."""
    pools = ["system=separate-sync", "profile=cpu-4", "pools.trainers=2", "pools.generators=1"]
    run_train([*pools, *EVAL, f"out_dir={tmp_path}"], nproc=3)
    records = _check_evaluations(tmp_path, 2)
    reference = read_metrics(colocated)
    _check_evaluations(colocated, 2)
    assert records[0]["eval_samples"] == reference[0]["eval_samples"] == 3
    assert records[0]["eval_reward_mean"] == pytest.approx(reference[0]["eval_reward_mean"], abs=1e-6)
    assert records[0]["eval_reward_std"] == pytest.approx(reference[0]["eval_reward_std"], abs=1e-6)
    assert [len(_eval_spans(tmp_path, rank)) for rank in range(3)] == [2, 2, 0]


@pytest.mark.parametrize(
    ("system", "nproc", "extra"),
    [
        ("separate-async", 2, ["profile=cpu-2"]),
        # the EMA starts at the initial weights: θ_0's EMA evaluation is θ_0's
        ("colocated-overlap", 0, ["profile=cpu-1", "eval.use_ema=true", "trainer.ema_decay=0.9"]),
    ],
)
def test_every_system_evaluates(colocated, tmp_path, system, nproc, extra):
    run_train([f"system={system}", *extra, *EVAL, f"out_dir={tmp_path}"], nproc=nproc)
    records = _check_evaluations(tmp_path, 2)
    assert records[0]["eval_reward_mean"] == pytest.approx(
        read_metrics(colocated)[0]["eval_reward_mean"], abs=1e-6
    )
    assert records[0]["eval_ema"] is ("eval.use_ema=true" in extra)


def test_a_resumed_run_evaluates_as_the_uninterrupted_one(tmp_path):
    """Evaluation draws nothing from the training's random streams and its noise is fixed: a run resumed
    from iteration 1 logs the evaluations (and trains) bit for bit as the uninterrupted run."""
    run = ["system=colocated-sync", "profile=cpu-1", "iterations=3", "eval.every=1", "eval.num_prompts=2"]
    run += ["checkpoint_every=1", "checkpoint_keep=0", "seed=2"]
    run_train([*run, f"out_dir={tmp_path / 'full'}"])
    resume_from_copy(tmp_path / "full", tmp_path / "resumed", 1, run)
    keys = (*RESUME_KEYS, "eval_policy_version", "eval_reward_mean", "eval_reward_std")
    assert_resumed_exactly(tmp_path / "full", tmp_path / "resumed", keys)
    assert [r["eval_policy_version"] for r in read_metrics(tmp_path / "resumed")] == [0, 1, 3]


def test_evaluation_leaves_the_training_unchanged(colocated, tmp_path):
    """The same run without evaluation trains bit for bit the same (evaluation draws only its own noise,
    touches no gradient or optimizer state)."""
    run_train(
        ["system=colocated-sync", "profile=cpu-1", *EVAL[:1], "checkpoint_every=0", f"out_dir={tmp_path}"]
    )
    for a, b in zip(read_metrics(colocated), read_metrics(tmp_path), strict=True):
        assert {k: a[k] for k in RESUME_KEYS} == {k: b[k] for k in RESUME_KEYS}
        assert "eval_reward_mean" in a and "eval_reward_mean" not in b
