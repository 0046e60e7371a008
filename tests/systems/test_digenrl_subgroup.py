"""``digenrl`` with fragments smaller than a prompt group and fewer units than trainers (issue 24 items 1–2):
3 trainers + 1 generator, groups of 2, one sample per fragment. With TCSS off the update equals
``colocated-sync``'s on the same data: a group's advantages are computed by the trainers once all its
rewards are in (:class:`digenrl.algo.group_completion.GroupCompletion`), a trainer with no unit of a
fragment skips it, and every unit keeps its global weight.

Reference: ``colocated-sync`` on one rank with ``sampler.samples_per_forward=1``, so each forward batches
one sample, as a one-sample fragment does (on the generator or a TAG helper alike).
"""

from __future__ import annotations

import json

import pytest

from digenrl.config import ConfigError, load_config
from digenrl.runtime.observe.metrics import read_metrics
from digenrl.validation import validate_config
from tests.systems.equivalence import assert_same_update
from tests.systems.launcher import TINY, run_train

COMMON = ["iterations=2", "seed=9", "algo.group_size=2", "sampler.samples_per_forward=1"]
POOLS = [
    "system=digenrl",
    "profile=cpu-4",
    "pools.trainers=3",
    "pools.generators=1",
    "gap.fragment_samples=1",
]
VARIANTS = {
    "colocated-sync": (["system=colocated-sync", "profile=cpu-1"], 0),
    # 7 trained steps: every trainer gets units of every one-sample fragment; the generator makes them all
    "half-group": ([*POOLS, "tag=false"], 4),
    # 1 trained step: one unit per fragment, so two of three trainers skip each; trainers also generate
    "one-unit+tag": ([*POOLS, "sampler.num_steps=2", "tag.policy=always"], 4),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("subgroup")
    out = {}
    for name, (overrides, nproc) in VARIANTS.items():
        out[name] = root / name
        run_train([*COMMON, *overrides, f"out_dir={out[name]}"], nproc=nproc)
    out["colocated-sync-2steps"] = root / "colocated-sync-2steps"
    run_train(
        [
            *COMMON,
            *VARIANTS["colocated-sync"][0],
            "sampler.num_steps=2",
            f"out_dir={out['colocated-sync-2steps']}",
        ]
    )
    return out


@pytest.mark.parametrize(
    ("variant", "reference"),
    [("half-group", "colocated-sync"), ("one-unit+tag", "colocated-sync-2steps")],
)
def test_same_update_as_colocated_sync(runs, variant, reference):
    assert_same_update(runs[reference], runs[variant], rel=1e-4, samples=8, zero=("staleness_max",))


def _generated(out, rank: int) -> list[dict]:
    lines = (out / "events" / f"rank{rank}.jsonl").read_text().splitlines()
    return [s for s in map(json.loads, lines) if s.get("type") == "span" and s["phase"] == "generate"]


def test_trainers_without_units_skip_fragments_and_helpers_leave_the_generator_its_share(runs):
    out = runs["one-unit+tag"]
    assert all(r["tag_fragments"] >= 1 for r in read_metrics(out))
    # TAG never claims before the generator holds θ_k, and only what it cannot finish sooner: the
    # generator (rank 3) makes fragments in every iteration
    assert {s["iteration"] for s in _generated(out, 3)} == {0, 1}
    spans = [
        s
        for rank in (0, 1, 2)
        for s in map(json.loads, (out / "events" / f"rank{rank}.jsonl").read_text().splitlines())
        if s.get("type") == "span" and s["phase"] == "wait_fragment"
    ]
    assert len(spans) == 3 * 2 * 8  # every trainer took every fragment of both iterations
    assert sum(s.get("samples") == 0 for s in spans) == 2 * 2 * 8  # ... two of three with no unit in it


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["gap.fragment_samples=3"], ["gap.fragment_samples=3", "does not divide", "[1, 2, 4, 8]"]),
        (
            ["gap.fragment_samples=2", "gap.fragment_groups=2"],
            ["gap.fragment_groups=2", "gap.fragment_samples"],
        ),
    ],
)
def test_bad_fragment_sizes_fail_at_startup(overrides, needles):
    cfg = load_config(TINY, [*COMMON, *POOLS[:-1], *overrides])
    with pytest.raises(ConfigError) as info:
        validate_config(cfg, world_size=4)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))
