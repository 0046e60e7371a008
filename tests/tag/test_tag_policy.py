"""TAG's budget (digenrl/tag/policy.py): ``always`` helps up to ``tag.max_fragments``; ``auto`` measures
first, then helps where the simulator predicts a shorter iteration from the costs this rank's own span
records carry, and predicts the run's own schedule."""

from __future__ import annotations

import pytest

from digenrl.config import load_config
from digenrl.plan import RunPlan
from digenrl.runtime.hardware.profiles import load_profile
from digenrl.sim.predict import SimPredictor
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
            RunPlan.from_config(cfg, profile),
            profile,
            trainer_ranks=(0, 1),
            generator_ranks=(2, 3),
            num_fragments=4,
            fragment_samples=4,
            trainer_type=trainer,
            predictor=SimPredictor.for_run(cfg, profile),
        )
        assert policy.predictor.plan.tcss_switch == switch
        predicted[switch] = [policy.predict(costs, budget) for budget in (0, 2)]
    assert predicted["2"][1] < predicted["auto"][1] < predicted["auto"][0]


def _span(phase: str, seconds: float, samples: int | None = None, **extra) -> dict:
    """A span record as this rank's event log writes it (runtime/observe/event_records.span_record)."""
    record = {
        "type": "span",
        "rank": 0,
        "role": "trainer",
        "phase": phase,
        "t_start": 5.0,
        "t_end": 5.0 + seconds,
    }
    if samples is not None:
        record["samples"] = samples
    if extra:
        record["extra"] = extra
    return record


def _policy(*overrides: str) -> TagPolicy:
    profile = load_profile("cpu-4")
    cfg = load_config(
        TINY, ["system=digenrl", "profile=cpu-4", "pools.trainers=2", "pools.generators=2", *overrides]
    )
    return TagPolicy(
        cfg,
        RunPlan.from_config(cfg, profile),
        profile,
        trainer_ranks=(0, 1),
        generator_ranks=(2, 3),
        num_fragments=4,
        fragment_samples=4,
        trainer_type=profile.device_type(0).name,
        predictor=SimPredictor.for_run(cfg, profile),
    )


def _observe_iteration(policy: TagPolicy, *, steps_s: float, unit_s: float) -> None:
    """One iteration's spans: 4 fragments from the generators (2, 3) of 8 units each, trained, one step."""
    for f in range(4):
        extra = {"producer": 2 + f % 2, "steps_s": steps_s, "score_s": 0.01, "bytes": 800}
        policy.observe(_span("wait_fragment", 0.01, samples=8, **extra))
        policy.observe(_span("train", 8 * unit_s, samples=8))
    policy.observe(_span("optimizer", 0.01))
    policy.observe(_span("sync", 0.02, bytes=4096))


@pytest.mark.parametrize(("max_fragments", "budget"), [(0, None), (3, 3)])
def test_always_helps_up_to_max_fragments_without_measuring(max_fragments, budget):
    policy = _policy("tag.policy=always", f"tag.max_fragments={max_fragments}")
    decision = policy.decide(0)
    assert decision.budget == budget and decision.predicted_s is None and "always" in decision.reason


def test_auto_does_not_help_before_every_cost_is_measured():
    policy = _policy("tag.policy=auto")
    assert policy.decide(0).budget == 0 and "measuring" in policy.decide(0).reason
    for _ in range(4):  # fragments arrived and trained, but no optimizer step yet
        policy.observe(_span("wait_fragment", 0.01, samples=8, producer=2, steps_s=1.0, score_s=0.01))
        policy.observe(_span("train", 0.08, samples=8))
    assert not policy.observed.ready and policy.decide(1).budget == 0
    policy.observe(_span("optimizer", 0.01))
    assert policy.observed.ready


def test_auto_helps_when_the_trainers_wait_for_generation_and_not_when_they_are_busy():
    slow_generation = _policy("tag.policy=auto")
    _observe_iteration(slow_generation, steps_s=2.0, unit_s=0.001)  # trainers idle most of the iteration
    helps = slow_generation.decide(1)
    assert helps.budget > 0 and helps.predicted_s < helps.predicted_off_s
    assert "predicted s/iteration by helper budget" in helps.reason

    slow_training = _policy("tag.policy=auto")
    _observe_iteration(slow_training, steps_s=0.01, unit_s=1.0)  # the trainers are the bottleneck
    idle = slow_training.decide(1)
    assert idle.budget == 0 and idle.predicted_s == idle.predicted_off_s


def test_observations_come_from_this_ranks_span_records():
    policy = _policy("tag.policy=auto")
    policy.observe(_span("wait_fragment", 0.5, samples=8, producer=3, steps_s=1.5, score_s=0.25, bytes=800))
    policy.observe(_span("wait_fragment", 0.5, samples=8, bytes=800))  # no producer named: bytes only
    policy.observe(_span("train", 0.4, samples=8))
    policy.observe(_span("train", 0.2, samples=4))
    policy.observe(_span("optimizer", 0.05))
    policy.observe(_span("tag_switch", 0.125, direction="in", bytes=0))
    policy.observe(_span("generate", 0.75, samples=4, helper=True))
    policy.observe(_span("generate", 9.0, samples=4, stage=0))  # another rank's kind of work: not a helper
    policy.observe(_span("sync", 0.1, bytes=4096))
    policy.observe(_span("sync", 0.1))  # the initial sync carries no bytes
    policy.observe(_span("train", 7.0, samples=8, error="RuntimeError"))  # interrupted: not a measurement
    o, cpu = policy.observed, policy.profile.device_type(3).name
    assert o.producer_steps_s == [(cpu, 1.5)] and o.score_s == [(cpu, 0.25)]
    assert o.unit_bytes == [100.0, 100.0] and o.sync_bytes == 4096
    assert o.train_units == 12 and o.train_s == pytest.approx(0.6)
    assert o.optimizer_s == [pytest.approx(0.05)] and o.switch_s == [pytest.approx(0.125)]
    assert o.helper_steps_s == [pytest.approx(0.75)]
