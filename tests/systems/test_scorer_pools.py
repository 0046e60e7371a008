"""Scorer pools: ranks that only run the reward model (``pools.scorers``), fed by the generators' last
stage over the same transport. digenrl and separate-sync with a scorer rank compute the same update on
the same trajectories; separate-async runs with one too, through the interleaving that once deadlocked it;
the scorer rank's timeline shows the scoring. Every run evaluates (``eval.every=1``): its rewards come from
the scorer rank too, equal to those a run without scorer ranks computes on its trainer."""

from __future__ import annotations

import json

import pytest

from digenrl.runtime.observe.metrics import read_metrics
from tests.rewards.tiny_clip import save_tiny_clip
from tests.systems.equivalence import assert_same_update
from tests.systems.launcher import run_train

POOLS = [
    "profile=cpu-4",
    "pools.trainers=1",
    "pools.generators=2",
    "pools.scorers=1",
    "iterations=2",
    "seed=3",
    # evaluations of θ_0 and θ_2, each in two rollout calls of the one trainer (2 + 1 prompts)
    "eval.every=1",
    "eval.num_prompts=3",
    "eval.batch_size=2",
]


#: The interleaving that deadlocked separate-async with a scorer rank: the trainer (rank 0) announces θ1
#: while generator 1 has its rewards of batch 1 and sits in the generator pool's reward gather, and
#: generator 2 is still generating batch 1 (then waits for its rewards). A generator that joined the push
#: from inside its reward wait left the two generators in different collectives until the timeout.
DELAYS = {"separate-async": "rank=0,phase=train,seconds=1.5;rank=2,phase=generate,seconds=3.5"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("scorers")
    reward = ["reward=pickscore", f"reward.weights_path={save_tiny_clip(root / 'tiny_clip')}"]
    variants = {
        "digenrl": ["system=digenrl", "tsp_stages=2", "tag=false"],
        "separate-sync": ["system=separate-sync", "sampler.samples_per_forward=4"],
        # the same run scoring on its generators: a scorer rank decodes with the same (random) VAE
        "separate-sync-no-scorer": [
            "system=separate-sync",
            "sampler.samples_per_forward=4",
            "pools.scorers=0",
        ],
        # a regression shows as a timeout after a minute, not as a hang of the whole test
        "separate-async": ["system=separate-async", "asynchrony.max_staleness=1", "runtime.timeout_s=60"],
    }
    for name, overrides in variants.items():
        with pytest.MonkeyPatch.context() as patch:
            if name in DELAYS:
                patch.setenv("DIGENRL_INJECT_DELAY", DELAYS[name])
            nproc = 3 if "pools.scorers=0" in overrides else 4
            proc = run_train([*POOLS, *reward, *overrides, f"out_dir={root / name}"], nproc=nproc)
            (root / f"{name}.stdout").write_text(proc.stdout)
    return {name: root / name for name in variants}


def _spans(out_dir, rank: int) -> list[dict]:
    lines = (out_dir / "events" / f"rank{rank}.jsonl").read_text().splitlines()
    return [s for s in map(json.loads, lines) if s.get("type") == "span"]


def _first(spans: list[dict], phase: str, **fields) -> dict:
    return next(s for s in spans if s["phase"] == phase and all(s[k] == v for k, v in fields.items()))


def test_a_scorer_rank_scores_what_the_generators_would(runs):
    """Issue 33: with random weights a scorer rank built another VAE than the other ranks, so the same
    trajectories got other rewards than without scorer ranks."""
    assert_same_update(runs["separate-sync-no-scorer"], runs["separate-sync"], rel=1e-6)


def test_digenrl_and_separate_sync_score_on_the_scorer_rank_and_agree(runs):
    # same trajectories and reward model; scored in batches of 4 (fragments) vs 8 (a generator's share)
    assert_same_update(runs["separate-sync"], runs["digenrl"], rel=1e-4)


@pytest.mark.parametrize("system", ["digenrl", "separate-sync", "separate-async"])
def test_the_scorer_rank_scores_every_fragment_and_the_generators_do_not(runs, system):
    out = runs[system]
    spans = {
        rank: [s for s in map(json.loads, (out / "events" / f"rank{rank}.jsonl").read_text().splitlines())
               if s.get("type") == "span"]
        for rank in range(4)
    }  # fmt: skip
    scored = {(s["iteration"], s["fragment"]) for s in spans[3] if s["phase"] == "score"}
    fragments = 4 if system == "digenrl" else 2  # GAP: 4 one-group fragments; baselines: one per generator
    assert scored == {(k, f) for k in range(2) for f in range(fragments)}
    assert all(s["role"] == "scorer" for s in spans[3])
    assert not any(s["phase"] == "score" for rank in (1, 2) for s in spans[rank])  # generators only wait
    assert len(read_metrics(out)) == 2


@pytest.mark.parametrize("system", ["digenrl", "separate-sync", "separate-async"])
def test_evaluation_scores_on_the_scorer_rank(runs, system):
    """Issue 33: evaluation with scorer ranks scored on the trainers, which so held the reward model too."""
    out = runs[system]
    calls = {(s["iteration"], s["extra"]["call"]) for s in _spans(out, 3) if s["phase"] == "eval"}
    assert calls == {(0, 0), (0, 1), (1, 0), (1, 1)}  # both evaluations, each of its rollout calls
    assert [s["iteration"] for s in _spans(out, 0) if s["phase"] == "eval"] == [0, 1]  # the trainer's
    banner = (out.parent / f"{system}.stdout").read_text()
    assert "3 held-out prompt(s)" in banner and ", scored on scorer rank(s) [3]" in banner
    records = read_metrics(out)
    assert records[0]["eval_policy_version"] == 0 and records[-1]["eval_policy_version"] == 2


def test_evaluation_on_the_scorer_rank_gives_what_the_trainer_computes_without_one(runs):
    pooled, local = read_metrics(runs["separate-sync"]), read_metrics(runs["separate-sync-no-scorer"])
    assert (
        "scored on"
        not in (runs["separate-sync-no-scorer"].parent / "separate-sync-no-scorer.stdout").read_text()
    )
    for a, b in ((pooled[0], local[0]), (pooled[-1], local[-1])):
        assert a["eval_samples"] == b["eval_samples"] == 3
        assert a["eval_reward_mean"] == pytest.approx(b["eval_reward_mean"], rel=1e-6)
        assert a["eval_reward_std"] == pytest.approx(b["eval_reward_std"], rel=1e-5, abs=1e-9)


def test_a_colocated_run_parks_the_reward_model_around_scoring_and_measures_each_swap(tmp_path):
    clip = save_tiny_clip(tmp_path / "clip")
    out = tmp_path / "parked"
    overrides = ["system=colocated-sync", "profile=cpu-1", "iterations=2", "residency.reward_resident=false"]
    run_train([*overrides, "reward=pickscore", f"reward.weights_path={clip}", f"out_dir={out}"])
    lines = (out / "events" / "rank0.jsonl").read_text().splitlines()
    swaps = [
        s for s in map(json.loads, lines) if s.get("phase") == "residency" and s["extra"]["role"] == "reward"
    ]
    # built on the device, parked for the first generation, then onloaded for scoring and parked when
    # scoring ends, every iteration; each transition moves the CLIP weights
    assert [(s["iteration"], s["extra"]["kind"]) for s in swaps] == [
        (0, "offload"), (0, "onload"), (0, "offload"), (1, "onload"), (1, "offload")
    ]  # fmt: skip
    assert all(s["extra"]["bytes"] > 0 for s in swaps)


def test_separate_async_generators_join_a_push_announced_during_scoring_after_the_reward_gather(runs):
    out = runs["separate-async"]
    push = _first(_spans(out, 0), "sync", iteration=0, policy_version=1)
    scored_first = _first(_spans(out, 3), "score", iteration=1, fragment=0)
    generated_last = _first(_spans(out, 2), "generate", iteration=1)
    # the delays forced the interleaving: θ1 was announced after generator 1's rewards of batch 1 were
    # back and before generator 2 had generated batch 1
    assert scored_first["t_end"] < push["t_start"] < generated_last["t_end"], (
        "the injected delays did not force the interleaving (a very loaded machine?)"
    )
    for rank in (1, 2):
        spans = _spans(out, rank)
        joined = _first(spans, "sync", policy_version=1)
        rollout = _first(spans, "wait_score", iteration=1)  # scoring and the reward gather
        assert joined["t_start"] >= rollout["t_end"], f"generator {rank} joined θ1 before its reward gather"
    assert len(read_metrics(out)) == 2
