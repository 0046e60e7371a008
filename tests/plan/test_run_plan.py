"""One plan (digenrl/plan/run_plan.py): ``RunPlan.from_config`` and ``to_config`` are exact inverses over
generated valid configs, every knob that decides the schedule survives the config round trip, plan.json and
the command line hold the same plan, and ``simulate.py validate`` prices the knobs the old hand translation
dropped (``gap.fragment_samples``, ``tcss.switch``)."""

from __future__ import annotations

import json
import random

import pytest

from digenrl.config import (
    COLOCATED_SPLITS,
    COLOCATED_SYSTEMS,
    DEEPSPEED_STAGES,
    GAP_ASSIGNMENTS,
    SYSTEMS,
    TAG_POLICIES,
    TRAIN_ORDERS,
    TRAINER_BACKENDS,
    Config,
    dotted_items,
    load_config,
    save_config,
)
from digenrl.costs.cost_model import CostModel
from digenrl.plan import RunPlan, Workload, is_schedule_key
from digenrl.reports.validation import compare_run
from digenrl.runtime.hardware.profiles import load_profile
from digenrl.sim.simulator import simulate
from digenrl.trainer.run_dir import PLAN_FILE
from experiments import simulate as simulate_cli

PROFILES = {name: load_profile(name) for name in ("cpu-4", "h200-8")}
QUICK_COST_FILE = simulate_cli.FOLDERS.results / "costs" / "cpu-tiny-sd3.json"


def _random_config(rng: random.Random) -> Config:
    """A valid config with every schedule knob drawn, those of other systems included (a plan ignores
    them)."""
    cfg = Config()
    cfg.system = rng.choice(SYSTEMS)
    cfg.profile = rng.choice(sorted(PROFILES))
    cfg.seed = rng.randint(0, 99)
    cfg.algo.group_size = rng.choice([2, 4])
    cfg.runtime.share_device = cfg.profile == "h200-8" and rng.random() < 0.5
    cfg.trainer.backend = rng.choice(TRAINER_BACKENDS)
    cfg.trainer.deepspeed_stage = rng.choice(DEEPSPEED_STAGES)
    cfg.trainer.micro_batch_size = rng.randint(1, 16)
    cfg.trainer.activation_checkpointing = rng.random() < 0.5
    cfg.sampler.samples_per_forward = rng.randint(0, 8)
    cfg.residency.train_resident = rng.random() < 0.5
    cfg.residency.reward_resident = rng.random() < 0.5
    cfg.colocated.split = rng.choice(COLOCATED_SPLITS)
    cfg.engine.offload = rng.random() < 0.5
    if cfg.system not in COLOCATED_SYSTEMS or rng.random() < 0.3:
        cfg.pools.trainers, cfg.pools.generators = rng.randint(1, 3), rng.randint(1, 4)
        cfg.pools.scorers = rng.randint(0, 1)
    cfg.asynchrony.max_staleness = rng.randint(0, 3)
    cfg.asynchrony.max_inflight = rng.randint(1, 2)
    cfg.gap.enabled = rng.random() < 0.7
    cfg.gap.fragment_groups = rng.choice([1, 2, 4])
    cfg.gap.fragment_samples = rng.choice([0, 0, 1, 2, 3])
    cfg.gap.assignment = rng.choice(GAP_ASSIGNMENTS)
    cfg.gap.train_order = rng.choice(TRAIN_ORDERS)
    cfg.tsp.stages = rng.randint(1, 3)
    cfg.tsp.boundaries = rng.choice([None, [0, 3, 8]])
    cfg.tag.enabled = rng.random() < 0.5
    cfg.tag.policy = rng.choice(TAG_POLICIES)
    cfg.tag.max_fragments = rng.randint(0, 4)
    cfg.tag.park_grads = rng.random() < 0.5
    cfg.tcss.enabled = rng.random() < 0.5
    cfg.tcss.switch = rng.choice(["auto", "timing", "0", "2"])
    cfg.iterations = rng.randint(1, 9)
    return cfg


def _value(value):
    return list(value) if isinstance(value, tuple) else value


@pytest.mark.parametrize("seed", range(6))
def test_from_config_and_to_config_are_exact_inverses(seed):
    rng = random.Random(seed)
    for _ in range(60):
        cfg = _random_config(rng)
        profile = PROFILES[cfg.profile]
        plan = RunPlan.from_config(cfg, profile)
        # the plan → config → plan round trip, from a default config and from the run's own
        assert RunPlan.from_config(plan.to_config(), profile) == plan
        again = plan.to_config(base=cfg)
        assert RunPlan.from_config(again, profile) == plan
        # every knob the plan sets is the config's value; every other key of the run is kept
        settings = dotted_items(cfg.to_dict())
        for key, value in plan.config_items().items():
            assert settings[key] == _value(value), key
        kept = dotted_items(again.to_dict())
        assert {k: v for k, v in kept.items() if not is_schedule_key(k)} == {
            k: v for k, v in settings.items() if not is_schedule_key(k)
        }
        # plan.json and the command line hold the same plan
        assert RunPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
        assert RunPlan.from_config(load_config(None, plan.overrides()), profile) == plan


def test_a_plan_reads_only_its_systems_knobs():
    """Knobs of other systems stay at their defaults, so one schedule has one plan."""
    cfg = load_config(
        None, ["system=colocated-sync", "profile=cpu-4", "tag.enabled=true", "tcss.enabled=true"]
    )
    cfg.pools.trainers = 3
    cfg.gap.fragment_samples = 2
    assert RunPlan.from_config(cfg, PROFILES["cpu-4"]) == RunPlan(
        "colocated-sync",
        profile="cpu-4",
        world_size=4,
        micro_batch_size=4,
        activation_checkpointing=False,
        samples_per_forward=0,
    )


def test_a_simulator_what_if_is_not_handed_out_as_a_config():
    what_if = RunPlan("digenrl", trainers=1, generators=1, transport="rendezvous")
    assert not what_if.runnable
    with pytest.raises(ValueError, match="transport=rendezvous"):
        what_if.to_config()
    assert RunPlan("digenrl", trainers=1, generators=1, transport="buffered").runnable  # the runtime's own
    with pytest.raises(ValueError, match="not RunPlan fields"):
        RunPlan.from_json({"system": "digenrl", "fragment_size": 3})


def _digenrl_config(**keys) -> Config:
    cfg = load_config(
        None,
        [
            "system=digenrl",
            "profile=cpu-2",
            "iterations=5",
            "pools.trainers=1",
            "pools.generators=1",
            "algo.prompts_per_iteration=4",
            "sampler.num_steps=4",
            "tag.enabled=false",
            *(f"{k}={v}" for k, v in keys.items()),
        ],
    )
    return cfg


def test_validate_prices_fragment_samples_and_the_tcss_switch(tmp_path):
    """A run with gap.fragment_samples and tcss.switch set: its simulation by a plan written by hand with
    those knobs has the run's events exactly (zero error in every phase), and dropping either knob, as the
    old hand translation did, predicts something else."""
    cfg = _digenrl_config(**{"gap.fragment_samples": 2, "tcss.enabled": "true", "tcss.switch": 3})
    profile = load_profile("cpu-2")
    costs = CostModel.load(QUICK_COST_FILE)
    workload = Workload.from_config(cfg, iterations=5, warmup_iterations=1, cooldown_iterations=0)
    by_hand = RunPlan(
        "digenrl", trainers=1, generators=1, fragment_samples=2, tcss=True, tcss_switch="3", tag=False
    )
    run = tmp_path / "run"
    run.mkdir()
    save_config(cfg, run / "config.yaml", run_id="test")
    RunPlan.from_config(cfg, profile).write(run / PLAN_FILE)  # what systems/base.py writes
    simulate(profile, costs, workload, by_hand).write_events(run)
    row = compare_run(run, cost_file=QUICK_COST_FILE)
    assert row["relative_error"] == pytest.approx(0.0, abs=1e-9)
    errors = [v["relative_error"] for by in row["phases"].values() for v in by.values()]
    assert errors and all(e is None or abs(e) < 1e-9 for e in errors)
    assert "2 samples/fragment" in row["plan"] and "switch 3" in row["plan"]
    for dropped in ({"fragment_samples": 0}, {"tcss_switch": "auto"}):
        other = simulate(profile, costs, workload, by_hand.with_(**dropped))
        assert other.spans != simulate(profile, costs, workload, by_hand).spans, dropped


def test_what_the_simulator_does_not_model_is_refused_or_named():
    """A plan's knobs are all priced, refused, or named in the result (never silently dropped)."""
    costs = CostModel.load(QUICK_COST_FILE)
    profile = load_profile("cpu-4")
    w = Workload(prompts_per_iteration=4, group_size=4, num_steps=4, train_steps=3, cfg=False)
    separate = RunPlan("separate-async", trainers=1, generators=2, max_staleness=1)
    with pytest.raises(ValueError, match="max_inflight"):
        simulate(profile, costs, w, separate.with_(max_inflight=2))
    named = simulate(profile, costs, w, separate.with_(scorers=1, share_device=True))
    assert "pools.scorers=1" in named.info["scorers"] and "share_device" in named.info["share_device"]


def test_unset_pools_are_the_runtimes_split():
    """Separate systems with no pools.* set run half the ranks as trainers (systems/separate.py), and so
    does their plan (a TAG prediction of such a run divided by zero trainers before)."""
    cfg = load_config(None, ["system=digenrl", "profile=cpu-4"])
    plan = RunPlan.from_config(cfg, PROFILES["cpu-4"])
    assert (plan.trainers, plan.generators, plan.scorers) == (2, 2, 0)
    assert plan.trainer_ranks() == (0, 1) and plan.generator_ranks() == (2, 3)


def test_a_systems_plan_is_on_the_launched_ranks():
    """A run launched on fewer ranks than its profile's devices runs (and records) the plan of those ranks:
    unset pools split them, a colocated plan uses them all (the plan a system builds, systems/base.py)."""
    separate = load_config(None, ["system=digenrl", "profile=cpu-4"])
    plan = RunPlan.from_config(separate, PROFILES["cpu-4"], world_size=2)
    assert (plan.world_size, plan.trainers, plan.generators) == (2, 1, 1)
    colocated = load_config(None, ["system=colocated-sync", "profile=cpu-4"])
    assert RunPlan.from_config(colocated, PROFILES["cpu-4"], world_size=3).trainer_ranks() == (0, 1, 2)
    assert RunPlan.from_config(colocated, PROFILES["cpu-4"]).world_size == 4  # default: the profile's
