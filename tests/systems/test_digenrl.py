"""``digenrl`` (GAP + TSP + TAG, TCSS off) computes what ``separate-sync`` computes, with trainer work
overlapping generation and trainers generating fragments themselves; bad mechanism settings fail at
startup.

Reference: separate-sync with ``sampler.samples_per_forward=4`` so that each forward batches one prompt
group, as a one-group GAP fragment does (on a generator pipeline or a TAG helper alike): the trajectories
are then bit-identical on CPU, whoever generated them.
"""

from __future__ import annotations

import json

import pytest

from digenrl.config import ConfigError, load_config
from digenrl.runtime.observe.metrics import read_metrics
from digenrl.validation import validate_config
from tests.systems.equivalence import assert_same_update
from tests.systems.launcher import RESUME_KEYS, TINY, assert_resumed_exactly, resume_from_copy, run_train

COMMON = [
    "iterations=2",
    "checkpoint_every=1",
    "seed=9",
    "profile=cpu-4",
    "pools.trainers=2",
    "pools.generators=2",
    "runtime.record_batches=true",  # first_rewards_exact checks the batches (tests/systems/equivalence.py)
]
VARIANTS = {
    "separate-sync": ["system=separate-sync", "sampler.samples_per_forward=4"],
    # two one-stage pipelines claiming fragments dynamically, no helper work
    "gap": ["system=digenrl", "gap.fragment_groups=1", "tag=false"],
    # one two-stage pipeline; both trainers claim fragments from the tail while they wait
    "gap+tsp2+tag": ["system=digenrl", "tsp_stages=2", "tag.policy=always"],
}


#: TAG helps only while a trainer has nothing ready to train: slowed, pipeline stage 0 leaves both trainers
#: idle at the head of every iteration (on a loaded machine the trainers, busy with iteration 0's checkpoint,
#: found iteration 1's fragments all made and never helped). A delay changes no trajectory or update.
DELAYS = {"gap+tsp2+tag": "rank=2,phase=generate,seconds=0.2"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("digenrl")
    for name, overrides in VARIANTS.items():
        with pytest.MonkeyPatch.context() as patch:
            if name in DELAYS:
                patch.setenv("DIGENRL_INJECT_DELAY", DELAYS[name])
            run_train([*COMMON, *overrides, f"out_dir={root / name}"], nproc=4)
    return {name: root / name for name in VARIANTS}


def _spans(out_dir, rank: int) -> list[dict]:
    lines = (out_dir / "events" / f"rank{rank}.jsonl").read_text().splitlines()
    return [s for s in map(json.loads, lines) if s.get("type") == "span"]


@pytest.mark.parametrize("variant", ["gap", "gap+tsp2+tag"])
def test_same_trajectories_and_update_as_separate_sync(runs, variant):
    assert_same_update(
        runs["separate-sync"],
        runs[variant],
        rel=1e-4,
        samples=16,
        first_rewards_exact=True,  # bit-identical trajectories
        ratio_abs=1e-5,
        zero=("staleness_max", "stale_fraction"),
    )


def test_trainer_ranks_generate_fragments_and_the_rest_come_from_the_pipeline(runs):
    out = runs["gap+tsp2+tag"]
    records = read_metrics(out)
    assert all(r["tag_fragments"] >= 1 for r in records)
    helper = {
        (s["iteration"], s["fragment"])
        for rank in (0, 1)
        for s in _spans(out, rank)
        if s["phase"] == "generate" and s["extra"].get("helper")
    }
    assert helper, "no trainer rank generated a fragment"
    assert any(s["phase"] == "tag_switch" for s in _spans(out, 0) + _spans(out, 1))
    # stage 1 (rank 3) finishes the pipeline's fragments; together with the helpers that is every fragment
    pipeline = {(s["iteration"], s["fragment"]) for s in _spans(out, 3) if s["phase"] == "generate"}
    assert not helper & pipeline
    assert helper | pipeline == {(k, f) for k in range(2) for f in range(4)}
    # TAG leaves the generators their share: the pipeline made fragments in every iteration
    assert {k for k, _ in pipeline} == {0, 1}
    # TAG claims from the tail: helpers made the last fragments, the pipeline the first
    assert min(f for _, f in helper) > max(f for _, f in pipeline) - 1


def test_trainer_work_overlaps_generation(runs):
    """GAP's point: a trainer trains fragment f while a generator produces a later fragment."""
    out = runs["gap"]
    trains = [s for s in _spans(out, 0) if s["phase"] == "train"]
    generates = [s for r in (2, 3) for s in _spans(out, r) if s["phase"] == "generate"]
    assert trains and generates
    overlapping = [
        (t["fragment"], g["fragment"])
        for t in trains
        for g in generates
        if t["iteration"] == g["iteration"] and t["t_start"] < g["t_end"] and g["t_start"] < t["t_end"]
    ]
    assert overlapping, "no trainer span overlaps a generator span: the pipeline is serialised"
    # dynamic claiming: both pipelines produced fragments, each fragment once
    made = [
        (s["iteration"], s["fragment"]) for r in (2, 3) for s in _spans(out, r) if s["phase"] == "generate"
    ]
    assert sorted(made) == [(k, f) for k in range(2) for f in range(4)]
    assert all(any(s["phase"] == "generate" for s in _spans(out, r)) for r in (2, 3))


def test_a_resumed_run_with_gap_tsp_and_tag_replays_the_uninterrupted_run_exactly(runs, tmp_path):
    """TCSS off: nothing runs ahead of the trainer, so checkpoint step_1 holds everything; who generates
    which fragment after the resume (pipeline or TAG helper) never changes a trajectory."""
    variant = [*COMMON, *VARIANTS["gap+tsp2+tag"]]
    resume_from_copy(runs["gap+tsp2+tag"], tmp_path / "resumed", 1, variant, nproc=4)
    assert_resumed_exactly(runs["gap+tsp2+tag"], tmp_path / "resumed", (*RESUME_KEYS, "stale_fraction"))


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["tsp_stages=9"], ["tsp.stages"]),
        (["tsp_stages=3"], ["tsp.stages", "pools.generators"]),
        (["gap.fragment_groups=3"], ["gap.fragment_groups", "algo.prompts_per_iteration"]),
        (["algo.adv_std=global"], ["algo.adv_std", "gap.enabled"]),
        (["gap.fragment_groups=0"], ["gap.fragment_groups"]),
        (["gap.assignment=round-robin"], ["tag.enabled", "gap.assignment=dynamic"]),
        (
            ["trainer.mode=full", "trainer.backend=deepspeed", "tag.policy=always"],
            ["trainer.backend=deepspeed", "every rank", "colocated-sync"],
        ),
        (["tsp_stages=2", "tsp.boundaries=[0, 9, 8]"], ["tsp.boundaries"]),
        (["tcss.switch=2"], ["tcss.switch='2'", "tcss.enabled=true"]),
        (["tcss=true", "tcss.switch=5"], ["tcss.switch='5'", "[0, 4]"]),
        (["tcss=true", "tcss.switch=soon"], ["tcss.switch='soon'", "auto, timing"]),
    ],
)
def test_bad_mechanism_settings_fail_at_startup(overrides, needles):
    cfg = load_config(TINY, [*COMMON, "system=digenrl", *overrides])
    with pytest.raises(ConfigError) as info:
        validate_config(cfg, world_size=4)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))
