"""Scorer pools: ranks that only run the reward model (``pools.scorers``), fed by the generators' last
stage over the same transport. digenrl and separate-sync with a scorer rank compute the same update on
the same trajectories; separate-async runs with one too; the scorer rank's timeline shows the scoring."""

from __future__ import annotations

import json

import pytest

from digenrl.runtime.metrics import read_metrics
from tests.rewards.tiny_clip import save_tiny_clip
from tests.systems.launcher import run_train

POOLS = [
    "profile=cpu-4",
    "pools.trainers=1",
    "pools.generators=2",
    "pools.scorers=1",
    "iterations=2",
    "seed=3",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("scorers")
    reward = ["reward=pickscore", f"reward.weights_path={save_tiny_clip(root / 'tiny_clip')}"]
    variants = {
        "digenrl": ["system=digenrl", "tsp_stages=2", "tag=false"],
        "separate-sync": ["system=separate-sync", "sampler.samples_per_forward=4"],
        "separate-async": ["system=separate-async", "asynchrony.max_staleness=1"],
    }
    for name, overrides in variants.items():
        run_train([*POOLS, *reward, *overrides, f"out_dir={root / name}"], nproc=4)
    return {name: root / name for name in variants}


def test_digenrl_and_separate_sync_score_on_the_scorer_rank_and_agree(runs):
    reference, other = read_metrics(runs["separate-sync"]), read_metrics(runs["digenrl"])
    for a, b in zip(reference, other, strict=True):
        # same trajectories and reward model; scored in batches of 4 (fragments) vs 8 (a generator's share)
        assert b["reward_mean"] == pytest.approx(a["reward_mean"], abs=1e-6)
        assert b["reward_std"] == pytest.approx(a["reward_std"], abs=1e-6)
        assert b["update_norm"] == pytest.approx(a["update_norm"], rel=1e-4)


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
