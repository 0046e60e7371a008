"""TAG's ``auto`` budget predicts the run's own schedule (digenrl/tag/policy.py)."""

from __future__ import annotations

from digenrl.config import load_config
from digenrl.runtime.profiles import load_profile
from digenrl.sim.predict import run_plan
from digenrl.tag.policy import TagPolicy
from tests.sim.toy_costs import toy_costs
from tests.systems.launcher import TINY


def test_the_prediction_follows_the_runs_tcss_switch():
    """With tcss.switch=auto (s = F) every fragment of a one-stale iteration is bound to θ_{k−1}, which a
    helper no longer holds, so helping shortens the predicted iteration less than with s = 2 of 4."""
    profile = load_profile("cpu-4")
    trainer = profile.device_type(0).name
    costs = toy_costs(step=0.1, unit=0.01, optimizer=0.05, device=trainer)
    predicted = {}
    for switch in ("auto", "2"):
        cfg = load_config(
            TINY, ["system=digenrl", "profile=cpu-4", "pools.trainers=2", "pools.generators=2", "tcss=true"]
        )
        cfg.tcss.switch = switch
        policy = TagPolicy(
            cfg,
            profile,
            trainer_ranks=(0, 1),
            generator_ranks=(2, 3),
            num_fragments=4,
            fragment_samples=4,
            trainer_type=trainer,
        )
        assert run_plan(cfg, trainers=2, generators=2, tag_budget=2).tcss_switch == switch
        predicted[switch] = [policy.predict(costs, budget) for budget in (0, 2)]
    assert predicted["2"][1] < predicted["auto"][1] < predicted["auto"][0]
