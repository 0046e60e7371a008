"""TCSS and TAG under stress: a deliberately slow trainer forces one-version-stale fragments and the
invariants hold; with the planned switch (the default) two runs of one seed are identical whatever the
timing and a resumed run replays the uninterrupted one, with TAG helpers and TSP stages; the timing-driven
switch still runs and resumes exactly at its checkpoint; a TAG helper killed mid-generation brings the job
down, naming the rank."""

from __future__ import annotations

import json
import math
import shutil
import time

import pytest

from digenrl.async_policy.tcss import StalenessBound
from digenrl.runtime.observe.metrics import read_metrics
from tests.systems.equivalence import assert_same_update
from tests.systems.launcher import RESUME_KEYS, assert_resumed_exactly, resume_from_copy, run_train

# 1 trainer + a 2-stage TSP pipeline: the policy version must travel with the fragment, stage by stage
TCSS = [
    "system=digenrl",
    "profile=cpu-4",
    "pools.trainers=1",
    "pools.generators=2",
    "tsp_stages=2",
    "tcss=true",
    "tag=false",
    "seed=0",
]


def _spans(out_dir, rank: int) -> list[dict]:
    lines = (out_dir / "events" / f"rank{rank}.jsonl").read_text().splitlines()
    return [s for s in map(json.loads, lines) if s.get("type") == "span"]


def test_tcss_runs_one_version_ahead_with_a_slow_trainer_and_still_learns(tmp_path, monkeypatch):
    monkeypatch.setenv("DIGENRL_INJECT_DELAY", "rank=0,phase=train,seconds=0.05")
    run_train([*TCSS, "iterations=16", f"out_dir={tmp_path}"], nproc=3, timeout_s=400)
    records = read_metrics(tmp_path)
    assert len(records) == 16
    # the run-time checks raise on a violation; here: staleness really happened and stayed <= 1
    assert all(r["staleness_max"] in (0, 1) for r in records)
    # tcss.switch=auto: all of iteration k with θ_{k−1}, but iteration 0 (nothing older) and the iteration
    # after the checkpoint at 10 (checkpoint_every's default) are on-policy
    assert [r["stale_fraction"] for r in records] == [0.0 if k in (0, 10) else 1.0 for k in range(16)]
    # every fragment ran both TSP stages with the one version it was bound to
    stage0 = {
        (s["iteration"], s["fragment"]): s["policy_version"]
        for s in _spans(tmp_path, 1)
        if s["phase"] == "generate"
    }
    stage1 = {
        (s["iteration"], s["fragment"]): s["policy_version"]
        for s in _spans(tmp_path, 2)
        if s["phase"] == "generate"
    }
    assert stage0 == stage1 and len(stage0) == 16 * 4
    assert all(k - 1 <= v <= k for (k, _), v in stage0.items())
    assert any(v == k - 1 for (k, _), v in stage0.items())
    # stale fragments are importance-weighted by their recorded behaviour log-probs: learning goes on
    first = sum(r["reward_mean"] for r in records[:3]) / 3
    last = sum(r["reward_mean"] for r in records[-3:]) / 3
    noise = records[0]["reward_std"] / math.sqrt(records[0]["samples"])
    assert last - first > 5 * noise, (first, last, noise)


#: the planned switch under test: variant → (overrides, ranks, switch fragment s of the F = 4 fragments)
SWITCH = {
    # one 2-stage TSP pipeline, no TAG: fragment 0 uses θ_{k−1}; stage 0 waits for θ_k at fragment 1 and
    # the version travels to stage 1 with the fragment
    "tsp2": ([*TCSS, "tcss.switch=1"], 3, 1),
    # two one-stage pipelines (D=2) claiming dynamically and two TAG helpers claiming from the tail: the
    # pipelines make fragments 0 and 1 with θ_{k−1}; fragments 2 and 3 use θ_k, whoever makes them
    "d2+tag": (
        [
            "system=digenrl",
            "profile=cpu-4",
            "pools.trainers=2",
            "pools.generators=2",
            "tcss=true",
            "tcss.switch=2",
            "tag.policy=always",
            "seed=0",
        ],
        4,
        2,
    ),
}
SWITCH_RUN = ["iterations=4", "checkpoint_every=2"]
TRAINER = "rank=0,phase=train,seconds=0.1"
#: metrics that describe the schedule (how long, who helped), not what the run computed
SCHEDULE_KEYS = {"run_id", "busy_fraction", "phase_seconds", "tag_fragments", "tag_switches", "tag_budget"}


def _computed(record: dict) -> dict:
    return {k: v for k, v in record.items() if not (k.endswith("_s") or k in SCHEDULE_KEYS)}


@pytest.fixture(scope="module")
def switch_runs(tmp_path_factory):
    """Each variant twice, with different timing: a generator slowed by 0.2 s per fragment, and a trainer
    slowed by 0.1 s per fragment (with ``tcss.switch=timing`` the d2+tag runs then differ in iteration 3:
    3 of 4 fragments one version stale against 4 of 4)."""
    root = tmp_path_factory.mktemp("tcss-switch")
    for name, (overrides, nproc, _) in SWITCH.items():
        for slow, delay in (
            ("generator", f"rank={nproc - 1},phase=generate,seconds=0.2"),
            ("trainer", TRAINER),
        ):
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("DIGENRL_INJECT_DELAY", delay)
                out = root / f"{name}-slow-{slow}"
                run_train([*overrides, *SWITCH_RUN, f"out_dir={out}"], nproc=nproc, timeout_s=300)
    return root


@pytest.mark.parametrize("variant", list(SWITCH))
def test_two_runs_with_the_planned_switch_are_identical_whatever_the_timing(switch_runs, variant):
    a = read_metrics(switch_runs / f"{variant}-slow-generator")
    b = read_metrics(switch_runs / f"{variant}-slow-trainer")
    assert [_computed(r) for r in a] == [_computed(r) for r in b]
    switch = SWITCH[variant][2]
    # stale: iteration 1 and 3 below the switch; on-policy: iteration 0, and 2 after the checkpoint
    assert [r["stale_fraction"] for r in a] == [0.0, switch / 4, 0.0, switch / 4]


@pytest.mark.parametrize("variant", list(SWITCH))
def test_every_fragment_was_generated_by_the_version_the_plan_binds_it_to(switch_runs, variant):
    """One version per trajectory over all stages, at most one stale, and exactly the plan's: fragments
    below the switch with θ_{k−1}, TAG helpers only above it."""
    _, nproc, switch = SWITCH[variant]
    bound = StalenessBound(1, checkpoint_every=2, iterations=4, switch=switch)
    for out in (switch_runs / f"{variant}-slow-generator", switch_runs / f"{variant}-slow-trainer"):
        generated: dict[tuple[int, int], set[int]] = {}
        helped = set()
        for rank in range(nproc):
            for s in _spans(out, rank):
                if s["phase"] == "generate":
                    generated.setdefault((s["iteration"], s["fragment"]), set()).add(s["policy_version"])
                    if s["extra"].get("helper"):
                        helped.add((s["iteration"], s["fragment"]))
        assert sorted(generated) == [(k, f) for k in range(4) for f in range(4)]
        assert generated == {(k, f): {bound.version_of(k, f)} for k, f in generated}
        assert all(f >= switch or k in (0, 2) for k, f in helped), helped
        if variant == "d2+tag":
            assert helped, "no TAG helper generated a fragment"


@pytest.mark.parametrize("variant", list(SWITCH))
def test_a_run_resumed_with_the_planned_switch_replays_the_uninterrupted_run(switch_runs, tmp_path, variant):
    overrides, nproc, _ = SWITCH[variant]
    full = switch_runs / f"{variant}-slow-generator"  # resumed without the delay: other timing again
    resume_from_copy(full, tmp_path / "resumed", 2, [*overrides, *SWITCH_RUN], nproc=nproc, timeout_s=300)
    keys = (*RESUME_KEYS, "stale_fraction", "staleness_max")
    assert_resumed_exactly(full, tmp_path / "resumed", keys)


def test_a_killed_run_with_the_planned_switch_resumes_to_the_uninterrupted_run(switch_runs, tmp_path):
    """The trainer is SIGKILLed at the start of iteration 3 (after checkpoint step_2); ``resume=true`` in
    the same folder then computes what the uninterrupted run computed."""
    overrides, nproc, _ = SWITCH["tsp2"]
    out = tmp_path / "killed"
    kill = f"rank=0,iteration=3,kind=kill,after={out / 'checkpoints' / 'latest'}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIGENRL_INJECT_FAULT", kill)
        killed = run_train([*overrides, *SWITCH_RUN, f"out_dir={out}"], nproc=nproc, check=False)
    assert killed.returncode != 0
    assert [r["iteration"] for r in read_metrics(out)] == [0, 1, 2]
    run_train([*overrides, *SWITCH_RUN, "resume=true", f"out_dir={out}"], nproc=nproc, timeout_s=300)
    keys = (*RESUME_KEYS, "stale_fraction", "staleness_max")
    # the event logs too: every record reaches the file when it is written, so the SIGKILLed rank's spans
    # up to its death are on disk (digenrl/runtime/observe/events.py)
    assert_resumed_exactly(switch_runs / "tsp2-slow-generator", out, keys, copied=False)


def test_the_timing_switch_runs_and_a_checkpoint_taken_with_it_resumes_exactly(tmp_path, monkeypatch):
    """``tcss.switch=timing`` (opt-in): the iteration after a checkpoint is generated on-policy (nothing
    is in flight when the checkpoint is written), so resuming from it replays that iteration exactly;
    later iterations depend on timing and are checked for the invariants only."""
    monkeypatch.setenv("DIGENRL_INJECT_DELAY", TRAINER)
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    timing = [*TCSS, "tcss.switch=timing", "iterations=4", "checkpoint_every=2"]
    run_train([*timing, f"out_dir={full}"], nproc=3, timeout_s=300)
    shutil.copytree(full / "checkpoints" / "step_2", resumed / "checkpoints" / "step_2")
    (resumed / "checkpoints" / "latest").write_text("step_2\n")
    run_train([*timing, "resume=true", f"out_dir={resumed}"], nproc=3)
    a, b = read_metrics(full), read_metrics(resumed)
    assert [r["iteration"] for r in b] == [2, 3]
    assert a[2]["stale_fraction"] == b[0]["stale_fraction"] == 0  # drained at the checkpoint
    for key in (
        "reward_mean",
        "reward_std",
        "loss",
        "update_norm",
        "grad_norm",
        "ratio_mean",
        "policy_version",
    ):
        assert a[2][key] == b[0][key], key
    assert b[1]["staleness_max"] in (0, 1)


@pytest.mark.parametrize("kind", ["raise", "kill"])
def test_a_helper_failing_mid_generation_ends_the_job_naming_the_rank(tmp_path, monkeypatch, kind):
    monkeypatch.setenv("DIGENRL_INJECT_FAULT", f"rank=0,iteration=1,kind={kind},phase=tag")
    # a slow generator (timing only): TAG leaves the generators their share, so the helper generates (and
    # fails) only when the generator cannot finish the fragments in time
    monkeypatch.setenv("DIGENRL_INJECT_DELAY", "rank=1,phase=generate,seconds=0.3")
    start = time.monotonic()
    proc = run_train(
        [
            "system=digenrl",
            "profile=cpu-2",
            "tag.policy=always",
            "iterations=3",
            "runtime.timeout_s=30",
            f"out_dir={tmp_path}",
        ],
        nproc=2,
        check=False,
        timeout_s=120,
        # the job the elastic agent tears down, and its failure summary, on forked ranks: the real torchrun
        # command's teardown is tested in tests/systems/test_separate.py
    )
    assert proc.returncode != 0
    assert time.monotonic() - start < 100
    if kind == "raise":
        assert "[rank 0] FAILED: RuntimeError: injected fault on rank 0 at iteration 1 (tag)" in proc.stderr
    else:
        assert "rank      : 0" in proc.stderr or "local_rank: 0" in proc.stderr


def test_tag_with_sharded_full_finetuning_gathers_the_weights_and_computes_the_same_update(
    tmp_path, monkeypatch
):
    """FSDP2 full fine-tuning: the trainer ranks gather the full parameters together at the head of the
    iteration, generate fragments alone, release them, and the update is separate-sync's."""
    # a slow generator (timing only, no computed value changes): TAG claims fragments only when the
    # generator pool cannot finish them in time
    monkeypatch.setenv("DIGENRL_INJECT_DELAY", "rank=2,phase=generate,seconds=0.3")
    common = [
        "profile=cpu-4",
        "pools.trainers=2",
        "pools.generators=1",
        "trainer.mode=full",
        "trainer.backend=fsdp2",
        "trainer.lr=1e-4",
        "iterations=2",
        "seed=4",
    ]
    tag, reference = tmp_path / "tag", tmp_path / "reference"
    run_train([*common, "system=digenrl", "tag.policy=always", f"out_dir={tag}"], nproc=3)
    run_train(
        [*common, "system=separate-sync", "sampler.samples_per_forward=4", f"out_dir={reference}"], nproc=3
    )
    assert_same_update(reference, tag, rel=1e-4)
    assert all(r["tag_fragments"] >= 1 for r in read_metrics(tag))
    for rank in (0, 1):
        spans = _spans(tag, rank)
        assert any(s["phase"] == "generate" and s["extra"].get("helper") for s in spans)
        gathered = [
            s["extra"]["bytes"]
            for s in spans
            if s["phase"] == "tag_switch" and s["extra"]["direction"] == "in"
        ]
        assert gathered and all(b > 0 for b in gathered)  # the full weights moved in for generation
