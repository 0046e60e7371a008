"""The GPipe fill/drain schedule: every (fragment, stage) once, in dependency order, F + S − 1 ticks."""

from __future__ import annotations

import random

import pytest

from digenrl.tsp.timeline import bubble_fraction, stage_timeline


def test_schedule_runs_each_fragment_through_every_stage_in_order():
    for _ in range(30):
        f, s = random.randint(1, 9), random.randint(1, 5)
        ticks = stage_timeline(f, s)
        assert len(ticks) == f + s - 1
        when = {}
        for tick, work in enumerate(ticks):
            stages = [stage for _, stage in work]
            assert stages == sorted(set(stages))  # one fragment per stage per tick
            for pair in work:
                assert pair not in when
                when[pair] = tick
        assert set(when) == {(i, j) for i in range(f) for j in range(s)}
        for (i, j), tick in when.items():
            if j > 0:
                assert when[(i, j - 1)] < tick  # a stage gets a fragment after the previous stage
            if i > 0:
                assert when[(i - 1, j)] < tick  # fragments keep their order on a stage
        assert bubble_fraction(f, s) == pytest.approx((s - 1) / (f + s - 1))


def test_small_cases_and_errors():
    assert stage_timeline(2, 2) == [[(0, 0)], [(1, 0), (0, 1)], [(1, 1)]]
    assert stage_timeline(0, 3) == [] and bubble_fraction(0, 3) == 0.0
    with pytest.raises(ValueError, match="stages must be an int >= 1"):
        stage_timeline(3, 0)
