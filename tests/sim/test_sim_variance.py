"""Per-sample variance (docs/design.md §5): distributions as data, seeded draws, barriers that wait for the
slowest member, and no change at all without a distribution."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from digenrl.costs.sample_costs import SampleCostDistribution, SampleVariance
from digenrl.plan import RunPlan
from digenrl.plan.workload import Workload
from digenrl.sim.sample_draws import SampleDraws
from digenrl.sim.simulator import simulate
from tests.sim.toy_costs import toy_costs

ASSUMED = "assumed (test)"
PLANS = (
    RunPlan("colocated-sync"),
    RunPlan("colocated-overlap", overlap_sub_batches=2),
    RunPlan("colocated-engine"),
    RunPlan("separate-sync", trainers=4, generators=4),
    RunPlan("separate-async", trainers=4, generators=4, max_staleness=1),
    RunPlan("digenrl", trainers=4, generators=4, fragment_groups=1),
    RunPlan("digenrl", trainers=2, generators=6, fragment_groups=1, tsp_stages=3),
    RunPlan("digenrl", trainers=4, generators=4, fragment_groups=1, tcss=True),
    RunPlan("digenrl", trainers=4, generators=4, fragment_groups=1, tag=True, tag_policy="always"),
)


def _variance(sigma: float = 0.5, reward_sigma: float = 0.0, per: str = "sample", seed: int = 0):
    dists = [SampleCostDistribution("generate", "lognormal", ASSUMED, sigma=sigma, per=per)]
    if reward_sigma:
        dists.append(SampleCostDistribution("reward", "lognormal", ASSUMED, sigma=reward_sigma))
    return SampleVariance("test", tuple(dists), seed=seed)


def _workload(**kw) -> Workload:
    base = dict(
        prompts_per_iteration=8, group_size=4, num_steps=4, train_steps=2, cfg=False, micro_batch_size=2
    )
    return Workload(**{**base, **kw})


def test_distributions_have_mean_one_and_reject_bad_input(tmp_path):
    grid = [(i + 0.5) / 20000 for i in range(20000)]
    lognormal = SampleCostDistribution("reward", "lognormal", ASSUMED, sigma=0.6)
    assert sum(map(lognormal.factor, grid)) / len(grid) == pytest.approx(1.0, rel=2e-3)
    assert lognormal.quantile(0.99) > 3 * lognormal.quantile(0.5) * 0.9 > 1.0 > lognormal.quantile(0.5)
    # empirical: any unit (seconds here); mean 1 exactly under the piecewise-linear inverse CDF
    empirical = SampleCostDistribution("generate", "empirical", "measured: x", values=(2.0, 3.0, 7.0, 4.0))
    assert sum(map(empirical.factor, grid)) / len(grid) == pytest.approx(1.0, rel=1e-6)
    assert empirical.factor(1e-12) < empirical.factor(0.5) < empirical.factor(1 - 1e-12)
    buckets = SampleCostDistribution("generate", "discrete", ASSUMED, values=(1.0, 3.0), per="prompt")
    assert {buckets.factor(u) for u in grid} == {0.5, 1.5}
    variance = SampleVariance("v", (lognormal, empirical), seed=3)
    assert SampleVariance.load(variance.save(tmp_path / "v.json")) == variance
    with pytest.raises(ValueError, match="source must start with"):
        SampleCostDistribution("reward", "lognormal", "measured on an H100", sigma=0.5)
    with pytest.raises(ValueError, match=r"variance.train.phase='train' is not allowed"):
        SampleCostDistribution("train", "lognormal", ASSUMED, sigma=0.5)
    with pytest.raises(ValueError, match="values must hold >= 2"):
        SampleCostDistribution("reward", "empirical", ASSUMED, values=(1.0,))
    with pytest.raises(ValueError, match="unknown key"):
        SampleVariance.from_dict({"format": 1, "phases": {"reward": {"kind": "lognormal", "sigm": 1}}})


def test_variance_off_and_zero_spread_price_exactly_the_cost_file():
    costs = toy_costs(step=0.125, decode=0.03, reward=0.05, unit=0.01, optimizer=0.02)
    w = _workload(samples_per_forward=3)
    for plan in PLANS:
        off = simulate("h200-8", costs, w, plan)
        flat = simulate("h200-8", costs, replace(w, variance=_variance(0.0, reward_sigma=1e-300)), plan)
        assert flat.iteration_end_s == pytest.approx(off.iteration_end_s, rel=1e-12), plan.describe()
        # and every schedule reads the draws: with spread, its iterations change
        spread = simulate("h200-8", costs, replace(w, variance=_variance(0.7, reward_sigma=0.7)), plan)
        assert spread.iteration_end_s != off.iteration_end_s, plan.describe()


def test_draws_are_seeded_and_shared_by_every_schedule():
    costs = toy_costs(step=0.125, reward=0.05, unit=0.01)
    w = replace(_workload(), variance=_variance(0.5, reward_sigma=0.8, seed=7))
    for plan in PLANS[:1] + PLANS[5:6]:
        first, again = (simulate("h200-8", costs, w, plan).iteration_end_s for _ in range(2))
        assert first == again
        other = simulate("h200-8", costs, replace(w, variance=w.variance.with_seed(8)), plan)
        assert other.iteration_end_s != first
    draws = SampleDraws(w.variance, w)
    assert draws.factors("generate", (2, 4), 4) == SampleDraws(w.variance, w).factors("generate", (2, 4), 4)
    assert draws.factors("generate", (2, 0), 8)[4:] == draws.factors("generate", (2, 4), 4)
    per_prompt = SampleDraws(_variance(0.5, per="prompt"), w).factors("generate", (0, 0), 8)
    assert per_prompt[:4] == [per_prompt[0]] * 4 and per_prompt[4:] == [per_prompt[4]] * 4
    assert per_prompt[0] != per_prompt[4]
    with pytest.raises(ValueError, match="outside its 32 samples"):
        draws.factors("generate", (0, 30), 4)


def test_colocated_iteration_waits_for_the_slowest_sample_of_the_slowest_rank():
    """8 ranks, 4 samples each in one forward: the generate phase of a rank lasts T·step·4·max(its factors);
    the advantages barrier holds every rank until the slowest one is done."""
    step, unit = 0.125, 0.01
    costs = toy_costs(step=step, unit=unit)
    base = _workload()
    w = replace(base, variance=_variance(0.7))
    result = simulate("h200-8", costs, w, RunPlan("colocated-sync"))
    nominal = simulate("h200-8", costs, base, RunPlan("colocated-sync"))
    draws = SampleDraws(w.variance, w)
    train = unit * 4 * w.train_steps
    for k in range(w.iterations):
        per_rank = [max(draws.factors("generate", (k, 4 * r), 4)) for r in range(8)]
        expected = w.num_steps * step * 4 * max(per_rank) + train
        assert result.iteration_s[k] == pytest.approx(expected, rel=1e-12)
        waits = [
            s for s in result.spans if s["phase"] == "wait_advantages" and s["iteration"] == k
        ]  # every rank but the slowest waits at the barrier
        assert len(waits) == 7
    assert result.steady_iteration_s > nominal.steady_iteration_s
    assert nominal.iteration_s[1] == pytest.approx(w.num_steps * step * 4 + train)


def test_reward_calls_and_separate_pools_wait_for_their_slowest_member():
    """A batched reward call ends with its slowest sample; separate-sync trainers wait for every generator."""
    step, reward = 0.125, 0.5
    costs = toy_costs(step=step, reward=reward)
    w = replace(
        _workload(),
        variance=SampleVariance("r", (SampleCostDistribution("reward", "lognormal", ASSUMED, sigma=1.0),)),
    )
    result = simulate("h200-8", costs, w, RunPlan("separate-sync", trainers=4, generators=4))
    draws = SampleDraws(w.variance, w)
    k = 1
    ends = []
    for g, rank in enumerate(range(4, 8)):
        (score,) = [
            s for s in result.spans if s["rank"] == rank and s["phase"] == "score" and s["iteration"] == k
        ]
        assert score["t_end"] - score["t_start"] == pytest.approx(
            reward * 8 * max(draws.factors("reward", (k, 8 * g), 8))
        )
        ends.append(score["t_end"])
    trains = [s for s in result.spans if s["phase"] == "train" and s["iteration"] == k]
    assert len(trains) == 4 and all(s["t_start"] == pytest.approx(max(ends)) for s in trains)


def test_streaming_trains_fragments_before_the_slowest_one_is_scored():
    """digenrl's trainers take each fragment as it is scored (group completion is per fragment): with
    variance the first fragment trains before the slowest fragment of the iteration is in. Whether that
    makes it lose less than colocated-sync is the simulator's answer, printed, not asserted."""
    costs = toy_costs(step=0.125, reward=0.05, unit=0.02)
    w = replace(_workload(prompts_per_iteration=16), variance=_variance(0.7, reward_sigma=0.7))
    plan = RunPlan("digenrl", trainers=4, generators=4, fragment_groups=1)
    result = simulate("h200-8", costs, w, plan)
    k = 1
    scored = [s["t_end"] for s in result.spans if s["phase"] == "score" and s["iteration"] == k]
    trained = [s["t_start"] for s in result.spans if s["phase"] == "train" and s["iteration"] == k]
    assert len(scored) == 16 and min(trained) < max(scored)
    off = replace(w, variance=None)
    for p in (RunPlan("colocated-sync"), plan):
        slowdown = (
            simulate("h200-8", costs, w, p).steady_iteration_s
            / simulate("h200-8", costs, off, p).steady_iteration_s
        )
        assert slowdown > 1.0
        print(f"{p.system}: {slowdown:.3f}x the iteration time without variance")
    assert math.isfinite(result.samples_per_s)
