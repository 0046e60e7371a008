"""paper_figures.timeline: window, lanes, bubbles, busy fractions, and the rendered PNG."""

from __future__ import annotations

import itertools
import random

import pytest

from digenrl.runtime.observe.events import EventLogger
from paper_figures.logs import load_run
from paper_figures.timeline import (
    assign_lanes,
    fragment_label,
    idle_gaps,
    parse_iteration_window,
    plot_timeline,
    time_window,
    timeline_rows,
)


def _random_intervals(n):
    intervals = []
    for _ in range(n):
        start = random.uniform(0, 10)
        intervals.append((start, start + random.uniform(0.01, 3)))
    return intervals


def _elementary_segments(intervals, lo, hi):
    """All pieces between consecutive endpoints inside [lo, hi]: each is fully covered or fully free."""
    points = sorted({lo, hi, *(p for iv in intervals for p in iv if lo < p < hi)})
    return list(itertools.pairwise(points))


def test_assign_lanes_never_overlaps_and_uses_max_depth_lanes():
    for _ in range(20):
        intervals = _random_intervals(random.randint(1, 25))
        lanes, count = assign_lanes(intervals)
        for i, (a0, a1) in enumerate(intervals):
            for j, (b0, b1) in enumerate(intervals):
                if i < j and lanes[i] == lanes[j]:
                    assert a1 <= b0 or b1 <= a0, "two overlapping spans share a lane"
        # Max overlap depth, by brute force at every start point (depth peaks at some start).
        depth = max(sum(1 for s, e in intervals if s <= t < e) for t, _ in intervals)
        assert count == depth
        assert set(lanes) == set(range(count))


def test_assign_lanes_reuses_a_lane_when_spans_touch():
    # Back-to-back phases (end == next start) are one lane, as in every sequential schedule.
    assert assign_lanes([(0.0, 1.0), (1.0, 2.0), (0.5, 1.5)]) == ([0, 0, 1], 2)
    assert assign_lanes([]) == ([], 1)


def test_idle_gaps_are_exactly_the_uncovered_time():
    for _ in range(20):
        intervals = _random_intervals(random.randint(0, 12))
        lo, hi = sorted(random.uniform(-1, 12) for _ in range(2))
        gaps = idle_gaps(intervals, lo, hi)
        for a, b in _elementary_segments(intervals, lo, hi):
            mid = (a + b) / 2
            covered = any(s <= mid < e for s, e in intervals)
            in_gap = any(g0 <= mid < g1 for g0, g1 in gaps)
            assert covered != in_gap
        assert all(lo <= g0 < g1 <= hi for g0, g1 in gaps)


def test_rows_of_the_real_sample_log(sample_run):
    run = load_run(sample_run)
    rows, t0, t1 = timeline_rows(run)
    assert [row.rank for row in rows] == [0, 1]
    assert [row.label.splitlines()[0] for row in rows] == ["rank 0 (colocated)", "rank 1 (colocated)"]
    assert t0 == min(s["t_start"] for s in run.spans) and t1 == max(s["t_end"] for s in run.spans)
    for row in rows:
        mine = [s for s in run.spans if s["rank"] == row.rank]
        assert len(row.spans) == len(mine) == 16
        assert row.lane_count == 1  # colocated-sync: one phase at a time on a rank
        # Independent float64 reference: spans on a rank don't overlap here, so busy = sum of durations.
        busy = sum(s["t_end"] - s["t_start"] for s in mine) / (t1 - t0)
        assert row.busy_fraction == pytest.approx(busy, rel=1e-12)
        assert sum(b - a for a, b in row.bubbles) == pytest.approx((1 - busy) * (t1 - t0), rel=1e-9)


def test_iteration_window_and_its_errors(sample_run):
    run = load_run(sample_run)
    start, end = time_window(run.spans, (1, 2))
    chosen = [s for s in run.spans if s["iteration"] in (1, 2)]
    assert (start, end) == (min(s["t_start"] for s in chosen), max(s["t_end"] for s in chosen))
    rows, _, _ = timeline_rows(run, (1, 2))
    assert sum(len(row.spans) for row in rows) == 16
    with pytest.raises(ValueError, match=r"has iterations \[0, 1, 2, 3\]"):
        time_window(run.spans, (7, 9))
    assert parse_iteration_window("3") == (3, 3) and parse_iteration_window("1:4") == (1, 4)
    for bad in ("a", "4:1", "1:2:3", "-1:2"):
        with pytest.raises(ValueError, match="iterations="):
            parse_iteration_window(bad)


def test_timeline_png_of_the_real_sample(tmp_path, sample_run, png_ok):
    out = plot_timeline(sample_run, tmp_path / "sub" / "timeline.png", figsize=(8.0, 3.0), dpi=100)
    assert out == tmp_path / "sub" / "timeline.png"
    png_ok(out, (800, 300))
    default = plot_timeline(sample_run, tmp_path / "default.png", iterations=(1, 2))
    png_ok(default, (1650, round(150 * max(2.4, 0.55 * 2 + 1.6))))


def _write_disaggregated_log(out_dir):
    """A synthetic 2-generator + 1-trainer log with fragments, markers, waits and overlap, written by the
    runtime's own EventLogger (so the figure reads exactly what the runtime writes)."""
    loggers = [
        EventLogger(out_dir, r, role, 0.0) for r, role in enumerate(["generator", "generator", "trainer"])
    ]
    for k in range(3):
        base = 4.0 * k
        for logger in loggers:
            logger.record_span("iteration", base, base + 4.0, iteration=k)
        for f in range(3):
            for g in (0, 1):
                loggers[g].record_span(
                    "generate", base + f, base + f + 0.9, iteration=k, fragment=f, policy_version=k
                )
                loggers[g].record_span("score", base + f + 0.5, base + f + 0.95, iteration=k, fragment=f)
            loggers[2].record_span(
                "train", base + f + 1, base + f + 1.8, iteration=k, fragment=f, policy_version=k
            )
        loggers[2].record_span(
            "generate", base, base + 0.9, iteration=k, fragment=3, policy_version=k, extra={"helper": True}
        )
        for g in (0, 1):
            loggers[g].record_span("wait_sync", base + 3.0, base + 4.0, iteration=k)
    for logger in loggers:
        logger.close()


def test_timeline_of_a_disaggregated_log(tmp_path, png_ok):
    _write_disaggregated_log(tmp_path / "run")
    run = load_run(tmp_path / "run")
    rows, t0, t1 = timeline_rows(run, (1, 1))
    assert (t0, t1) == (4.0, 8.0)  # the iteration marker defines the window
    assert [row.role for row in rows] == ["generator", "generator", "trainer"]
    assert rows[0].lane_count == 2  # score overlaps generate on the generator: two sub-lanes
    # Generator work is [4, 4.95) ∪ [5, 5.95) ∪ [6, 6.95) of [4, 8); the wait span is idle, not work.
    assert rows[0].busy_fraction == pytest.approx(3 * 0.95 / 4.0)
    assert rows[0].bubbles == [pytest.approx(gap) for gap in [(4.95, 5.0), (5.95, 6.0), (6.95, 8.0)]]
    labels = {fragment_label(s, show_versions=True) for s in rows[2].spans}
    assert {"f0 v1", "f1 v1", "f2 v1", "f3 v1"} <= labels
    out = plot_timeline(
        run, tmp_path / "t.png", iterations=(1, 2), show_versions=True, figsize=(6, 3), dpi=80
    )
    png_ok(out, (480, 240))


def test_fragment_label():
    assert fragment_label({"fragment": None, "policy_version": 3}) is None
    assert fragment_label({"fragment": 2, "policy_version": 3}) == "f2"
    assert fragment_label({"fragment": 2, "policy_version": 3}, show_versions=True) == "f2 v3"
    assert fragment_label({"fragment": 0, "policy_version": None}, show_versions=True) == "f0"


def test_command_line(tmp_path, sample_run, png_ok, capsys):
    from paper_figures.timeline import main

    assert main([str(sample_run), "--out", str(tmp_path / "cli.png"), "--iterations", "2"]) == 0
    png_ok(tmp_path / "cli.png")
    with pytest.raises(SystemExit) as exit_info:
        main([str(sample_run), "--out", str(tmp_path / "bad.png"), "--iterations", "9"])
    assert exit_info.value.code == 2 and "match no spans" in capsys.readouterr().err
    assert not (tmp_path / "bad.png").exists()
