"""``digenrl`` (GAP + TSP) computes what ``separate-sync`` computes, with trainer work overlapping
generation; bad mechanism settings fail at startup.

Reference: separate-sync with ``sampler.samples_per_forward=4`` so that each forward batches one
prompt group, as a one-group GAP fragment does: the trajectories are then bit-identical on CPU.
"""

from __future__ import annotations

import json

import pytest

from digenrl.config import ConfigError, load_config, validate_config
from digenrl.runtime.metrics import read_metrics
from tests.systems.launcher import TINY, run_train

COMMON = ["iterations=2", "seed=9", "profile=cpu-4", "pools.trainers=2", "pools.generators=2"]
VARIANTS = {
    "separate-sync": ["system=separate-sync", "sampler.samples_per_forward=4"],
    "gap": ["system=digenrl", "gap=true", "gap.fragment_groups=1"],
    "gap+tsp2": ["system=digenrl", "gap=true", "tsp_stages=2"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("digenrl")
    for name, overrides in VARIANTS.items():
        run_train([*COMMON, *overrides, f"out_dir={root / name}"], nproc=4)
    return {name: root / name for name in VARIANTS}


@pytest.mark.parametrize("variant", ["gap", "gap+tsp2"])
def test_same_trajectories_and_update_as_separate_sync(runs, variant):
    reference, other = read_metrics(runs["separate-sync"]), read_metrics(runs[variant])
    assert other[0]["reward_mean"] == reference[0]["reward_mean"]  # bit-identical trajectories
    for a, b in zip(reference, other, strict=True):
        assert a["samples"] == b["samples"] == 16
        assert b["reward_mean"] == pytest.approx(a["reward_mean"], abs=1e-6)
        assert b["reward_std"] == pytest.approx(a["reward_std"], abs=1e-6)
        assert b["update_norm"] == pytest.approx(a["update_norm"], rel=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
        assert b["ratio_mean"] == pytest.approx(1.0, abs=1e-5)


def _spans(out_dir, rank: int) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "events" / f"rank{rank}.jsonl").read_text().splitlines()]


def test_trainer_work_overlaps_generation(runs):
    """GAP's point: a trainer trains fragment f while a generator produces a later fragment."""
    out = runs["gap+tsp2"]
    trains = [s for s in _spans(out, 0) if s.get("phase") == "train"]
    generates = [s for r in (2, 3) for s in _spans(out, r) if s.get("phase") == "generate"]
    assert trains and generates
    overlapping = [
        (t["fragment"], g["fragment"])
        for t in trains
        for g in generates
        if t["iteration"] == g["iteration"] and t["t_start"] < g["t_end"] and g["t_start"] < t["t_end"]
    ]
    assert overlapping, "no trainer span overlaps a generator span: the pipeline is serialised"
    # TSP: stage 0 (rank 2) and stage 1 (rank 3) each run part of every fragment's steps
    assert {s["fragment"] for s in _spans(out, 2) if s.get("phase") == "generate"} == {0, 1, 2, 3}
    assert {s["fragment"] for s in _spans(out, 3) if s.get("phase") == "generate"} == {0, 1, 2, 3}


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["tsp_stages=9"], ["tsp.stages"]),
        (["tsp_stages=3"], ["tsp.stages", "pools.generators"]),
        (["gap.fragment_groups=3"], ["gap.fragment_groups", "algo.prompts_per_iteration"]),
        (["algo.adv_std=global"], ["algo.adv_std", "gap.enabled"]),
        (["tcss=true"], ["tcss.enabled"]),
        (["gap.fragment_groups=0"], ["gap.fragment_groups"]),
    ],
)
def test_bad_mechanism_settings_fail_at_startup(overrides, needles):
    cfg = load_config(TINY, [*COMMON, "system=digenrl", *overrides])
    with pytest.raises(ConfigError) as info:
        validate_config(cfg, world_size=4)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))
