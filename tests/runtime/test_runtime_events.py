"""EventLogger -> JSONL -> Chrome trace, and summarize_events on synthetic logs with known answers."""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest

from digenrl.runtime.observe.event_records import load_events
from digenrl.runtime.observe.event_summary import steady_window, union_length
from digenrl.runtime.observe.events import EventLogger, merge_chrome_trace, summarize_events
from digenrl.runtime.observe.span_phases import is_idle_phase


def _coverage_union(intervals, lo, hi):
    """Independent reference for the busy time: +1/-1 sweep over endpoints, counting covered length."""
    points = []
    for a, b in intervals:
        a, b = max(a, lo), min(b, hi)
        if b > a:
            points += [(a, +1), (b, -1)]
    points.sort()
    covered, depth, previous = 0.0, 0, None
    for x, delta in points:
        if depth > 0 and previous is not None:
            covered += x - previous
        depth += delta
        previous = x
    return covered


def test_spans_trace_and_records(tmp_path):
    origin = time.time()
    generator = EventLogger(tmp_path, 0, "generator", origin)
    trainer = EventLogger(tmp_path, 1, "trainer", origin)
    version = random.randint(0, 9)
    with generator.span("iteration", iteration=0):
        with generator.span("generate", iteration=0, fragment=0, policy_version=version) as notes:
            notes["samples"] = 4
            notes["steps"] = 10
        with generator.span("transfer", iteration=0, fragment=0, policy_version=version):
            pass
    with trainer.span("wait_fragment", iteration=0):
        pass
    with pytest.raises(RuntimeError), trainer.span("train", iteration=0, fragment=0, policy_version=version):
        raise RuntimeError("boom")
    trainer.counter("gpu", {"util_pct": 87.5, "power_w": 512.0})
    trainer.note("GPU telemetry disabled", reason="test")
    generator.close()
    trainer.close()

    records = load_events(tmp_path)
    spans = [r for r in records if r["type"] == "span"]
    assert next(r["type"] for r in records if r["rank"] == 0) == "meta"
    assert {(r["rank"], r["phase"]) for r in spans} == {
        (0, "iteration"),
        (0, "generate"),
        (0, "transfer"),
        (1, "wait_fragment"),
        (1, "train"),
    }
    generated = next(r for r in spans if r["phase"] == "generate")
    outer = next(r for r in spans if r["phase"] == "iteration")
    assert generated["samples"] == 4 and generated["extra"] == {"steps": 10}
    assert generated["policy_version"] == version and generated["fragment"] == 0
    assert outer["t_start"] <= generated["t_start"] <= generated["t_end"] <= outer["t_end"]
    failed = next(r for r in spans if r["phase"] == "train")
    assert failed["extra"]["error"] == "RuntimeError"

    trace_path = merge_chrome_trace(tmp_path)
    assert trace_path == tmp_path / "trace.json"
    trace = json.loads(trace_path.read_text())
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in complete} == {0, 1}
    assert len(complete) == len(spans)
    assert all(e["dur"] >= 0 and isinstance(e["ts"], float | int) for e in complete)
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0 (generator)", 1: "rank 1 (trainer)"}
    x_generate = next(e for e in complete if e["name"] == "generate")
    assert x_generate["ts"] == pytest.approx(generated["t_start"] * 1e6, abs=1e-3)
    assert x_generate["dur"] == pytest.approx((generated["t_end"] - generated["t_start"]) * 1e6, abs=2e-3)
    assert x_generate["args"]["iteration"] == 0 and x_generate["args"]["policy_version"] == version
    assert x_generate["args"]["samples"] == 4
    # Different phase categories go to different tracks of the rank; nested spans never share one.
    x_iteration = next(e for e in complete if e["name"] == "iteration")
    x_send = next(e for e in complete if e["name"] == "transfer")
    assert len({x_iteration["tid"], x_generate["tid"], x_send["tid"]}) == 3
    counters = {e["name"]: e["args"] for e in events if e["ph"] == "C"}
    assert counters == {"gpu.util_pct": {"util_pct": 87.5}, "gpu.power_w": {"power_w": 512.0}}
    thread_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert thread_names[(1, next(e["tid"] for e in complete if e["name"] == "wait_fragment"))] == "wait"


def test_every_record_survives_a_sigkill_of_its_process(tmp_path):
    """A rank killed without warning (SIGKILL: no Python teardown, no flush) leaves every record it wrote
    in its log (each write reaches the OS at once; the log used to flush every 2 s, and lost them all)."""
    pid = os.fork()
    if pid == 0:  # the child: a rank that logs two spans and a note, then dies at once
        try:
            events = EventLogger(tmp_path, 3, "trainer", time.time())
            for iteration in range(2):
                with events.span("train", iteration=iteration):
                    pass
            events.note("about to die")
        finally:
            os.kill(os.getpid(), signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    records = load_events(tmp_path)
    assert [r["type"] for r in records] == ["meta", "span", "span", "note"]
    assert [r["iteration"] for r in records if r["type"] == "span"] == [0, 1]


def test_logger_rejects_bad_spans(tmp_path):
    logger = EventLogger(tmp_path, 0, "trainer", time.time())
    with pytest.raises(ValueError, match="t_end"):
        logger.record_span("train", 2.0, 1.0)
    with pytest.raises(ValueError, match="span phase '' is not declared"):
        logger.record_span("", 1.0, 2.0)
    logger.close()
    with pytest.raises(ValueError, match="closed"):
        logger.record_span("train", 1.0, 2.0)
    with pytest.raises(ValueError, match="role must be a non-empty string"):
        EventLogger(tmp_path, 1, "", time.time())


def test_truncated_last_line_is_tolerated(tmp_path):
    logger = EventLogger(tmp_path, 0, "trainer", time.time())
    logger.record_span("train", 0.0, 1.0, iteration=0)
    logger.close()
    with logger.path.open("a") as handle:
        handle.write('{"type":"span","rank":0,"ro')  # killed mid-write
    assert sum(r["type"] == "span" for r in load_events(tmp_path)) == 1


def test_damaged_lines_inside_a_log_are_skipped_and_the_trace_is_still_written(tmp_path, caplog):
    """Issue 35, item 4: garbage, a wrong type and a span without times are each skipped, named by line."""
    logger = EventLogger(tmp_path, 0, "trainer", time.time())
    logger.record_span("train", 0.0, 1.0, iteration=0)
    logger.close()
    with logger.path.open("a") as handle:
        handle.write('garbage\n{"type":"bogus"}\n{"type":"span","phase":"x","t_start":"a","t_end":1}\n7\n')
    logger = EventLogger(tmp_path, 0, "trainer", time.time(), append=True, start_iteration=1)
    logger.record_span("train", 2.0, 3.0, iteration=1)
    logger.close()
    with caplog.at_level("WARNING"):
        spans = [r for r in load_events(tmp_path) if r["type"] == "span"]
        merge_chrome_trace(tmp_path)
    assert [s["iteration"] for s in spans] == [0, 1]
    message = next(r.getMessage() for r in caplog.records if "rank0.jsonl" in r.getMessage())
    assert "skipped 4 damaged line(s)" in message
    for number, why in ((3, "not valid JSON"), (4, "type 'bogus'"), (5, "t_start='a'"), (6, "a int")):
        assert f"line {number}: " in message and why in message
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]


def test_summary_on_hand_computed_log(tmp_path):
    """Generators 0, 1 and trainers 2, 3 over an iteration window [0, 10]."""
    loggers = [
        EventLogger(tmp_path, r, role, 0.0)
        for r, role in enumerate(["generator", "generator", "trainer", "trainer"])
    ]
    for logger in loggers:
        logger.record_span("iteration", 0.0, 10.0, iteration=0)
    g0, g1, t2, t3 = loggers
    g0.record_span("generate", 0.0, 4.0, iteration=0, samples=8)
    g0.record_span("score", 3.0, 5.0, iteration=0)  # overlaps generate: union 0..5
    g0.record_span("wait_sync", 5.0, 10.0, iteration=0)  # idle
    g1.record_span("generate", 0.0, 10.0, iteration=0, samples=8)
    g1.record_span("generate", 9.5, 12.0, iteration=1, samples=8)  # next iteration, inside the window
    t2.record_span("wait_fragment", 0.0, 6.0, iteration=0)
    t2.record_span("train", 6.0, 10.0, iteration=0, samples=16)
    t3.record_span("train", 12.0, 13.0, iteration=1)  # outside the window: rank 3 idle in iteration 0
    for logger in loggers:
        logger.close()

    summary = summarize_events(tmp_path)
    it0 = summary[0]
    assert it0["wall_s"] == pytest.approx(10.0)
    assert it0["ranks"] == {"generator": [0, 1], "trainer": [2, 3]}
    assert it0["busy_fraction"]["generator"] == pytest.approx((5.0 + 10.0) / 20.0)
    assert it0["busy_fraction"]["trainer"] == pytest.approx((4.0 + 0.0) / 20.0)
    assert it0["phase_seconds"]["generator"] == pytest.approx(
        {"generate": 14.0, "score": 2.0, "wait_sync": 5.0}
    )
    assert it0["phase_seconds"]["trainer"] == pytest.approx({"wait_fragment": 6.0, "train": 4.0})
    assert it0["samples"] == {"generate": 16, "train": 16}
    assert it0["samples_per_s"]["train"] == pytest.approx(1.6)
    assert it0["busy_gpu_s"] == pytest.approx(19.0)
    assert it0["bubble_free_bound_s"] == pytest.approx(19.0 / 4)
    # Iteration 1 has no markers: its window is the extent of its spans, [9.5, 13].
    assert summary[1]["wall_s"] == pytest.approx(3.5)
    # Rank 2's iteration-0 train span [6, 10] still makes it busy for 0.5 s inside this window.
    assert summary[1]["busy_fraction"]["trainer"] == pytest.approx((0.5 + 1.0) / (2 * 3.5))


def test_summary_busy_fraction_matches_reference_on_random_logs(tmp_path):
    roles = ["generator"] * 3 + ["trainer"] * 2
    loggers = [EventLogger(tmp_path, r, role, 0.0) for r, role in enumerate(roles)]
    window = (random.uniform(0, 2), random.uniform(20, 30))
    spans_by_rank = {}
    for rank, logger in enumerate(loggers):
        logger.record_span("iteration", *window, iteration=0)
        spans = []
        for _ in range(random.randint(0, 12)):
            a = random.uniform(-5, 35)
            b = a + random.uniform(0, 8)
            phase = random.choice(["generate", "train", "transfer", "wait_fragment", "wait_sync"])
            logger.record_span(phase, a, b, iteration=random.choice([0, 1, None]))
            spans.append((phase, a, b))
        spans_by_rank[rank] = spans
        logger.close()
    summary = summarize_events(tmp_path)[0]
    for role in ("generator", "trainer"):
        ranks = [r for r, x in enumerate(roles) if x == role]
        busy = sum(
            _coverage_union([(a, b) for phase, a, b in spans_by_rank[r] if not is_idle_phase(phase)], *window)
            for r in ranks
        )
        expected = busy / (len(ranks) * (window[1] - window[0]))
        assert summary["busy_fraction"][role] == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_union_length_against_reference():
    intervals = [(random.uniform(0, 10), 0.0) for _ in range(30)]
    intervals = [(a, a + random.uniform(0, 3)) for a, _ in intervals]
    lo, hi = random.uniform(0, 3), random.uniform(7, 12)
    assert union_length(intervals, lo, hi) == pytest.approx(_coverage_union(intervals, lo, hi), abs=1e-12)
    assert union_length([], 0.0, 1.0) == 0.0


def _write_log(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def _meta(rank, origin, start):
    return {
        "type": "meta",
        "rank": rank,
        "role": "colocated",
        "clock_origin": origin,
        "start_iteration": start,
    }


def _span(rank, phase, iteration, t0, t1):
    return {"type": "span", "rank": rank, "role": "colocated", "phase": phase, "iteration": iteration,
            "t_start": t0, "t_end": t1}  # fmt: skip


def test_a_resumed_log_is_read_on_one_clock_without_the_redone_iterations(tmp_path):
    """A process ran iterations 0-2 (checkpoint after 1) and crashed in 2; the resumed process appended a
    new segment 100 s later on its own clock, starting at iteration 2."""
    first = [_meta(0, 1000.0, 0)]
    for k in range(3):
        first += [_span(0, "iteration", k, k, k + 1.0), _span(0, "train", k, k, k + 0.5)]
    first += [_span(0, "optimizer", k, k + 0.5, k + 1.0) for k in range(2)]
    second = [_meta(0, 1100.0, 2)]
    for k in (2, 3):
        t = k - 2.0
        second += [_span(0, "iteration", k, t, t + 1.0), _span(0, "train", k, t, t + 0.25)]
        second += [_span(0, "optimizer", k, t + 0.25, t + 1.0)]
    _write_log(tmp_path / "events" / "rank0.jsonl", first + second)

    records = load_events(tmp_path)
    assert [r["t"] for r in records if r["type"] == "meta"] == [0.0, 100.0]
    train = [(r["iteration"], r["t_start"]) for r in records if r.get("phase") == "train"]
    assert train == [(0, 0.0), (1, 1.0), (2, 100.0), (3, 101.0)]  # the crashed iteration 2 is gone
    everything = load_events(tmp_path, superseded=True)
    lost = [(r["iteration"], r["t_start"]) for r in everything if r.get("superseded")]
    assert lost == [(2, 2.0), (2, 2.0)]  # its marker and its train span, at their own time

    summary = summarize_events(tmp_path)
    assert summary[2]["wall_s"] == pytest.approx(1.0) and summary[2]["t_start"] == pytest.approx(100.0)
    assert summary[2]["phase_seconds"]["colocated"]["train"] == pytest.approx(0.25)
    # the steady window of the resumed part starts with it, not before the crash
    window = steady_window(tmp_path, 2)
    assert window["window_s"] == pytest.approx(2.0) and window["busy_gpu_s"] == pytest.approx(2.0)

    trace = json.loads(merge_chrome_trace(tmp_path).read_text())
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["name"] == "train"]
    assert [(e["args"]["iteration"], e["ts"], e["args"].get("superseded")) for e in spans] == [
        (0, 0.0, None),
        (1, 1e6, None),
        (2, 2e6, True),
        (2, 100e6, None),
        (3, 101e6, None),
    ]
    assert trace["otherData"]["clock_origin_unix_s"] == 1000.0


def test_an_appending_logger_starts_a_new_segment_after_a_torn_line(tmp_path):
    first = EventLogger(tmp_path, 0, "trainer", 50.0, run_id="r", start_iteration=0)
    first.record_span("train", 1.0, 2.0, iteration=0)
    first.close()
    with first.path.open("a") as f:
        f.write('{"type": "span", "rank": 0, "phase": "tr')  # killed mid-write
    second = EventLogger(tmp_path, 0, "trainer", 60.0, append=True, run_id="r", start_iteration=1)
    second.record_span("train", 1.0, 2.0, iteration=1)
    second.close()
    records = load_events(tmp_path)
    metas = [r for r in records if r["type"] == "meta"]
    assert [(m["start_iteration"], m["run_id"], m["t"]) for m in metas] == [(0, "r", 0.0), (1, "r", 10.0)]
    assert [(r["iteration"], r["t_start"]) for r in records if r["type"] == "span"] == [(0, 1.0), (1, 11.0)]
    fresh = EventLogger(tmp_path, 0, "trainer", 70.0)  # not appending: a new log
    fresh.close()
    assert [r["type"] for r in load_events(tmp_path)] == ["meta"]


def test_a_subscriber_hears_every_span_record_after_it_is_written(tmp_path):
    events = EventLogger(tmp_path, 2, "trainer", time.time())
    heard = []

    def listen(record):
        heard.append((record, len(events.path.read_text().splitlines())))  # records on disk by then

    events.subscribe(listen)
    with events.span("train", iteration=1, samples=4) as span:
        span["bytes"] = 8
    events.record_span("sync", 0.0, 0.5, iteration=1)
    events.counter("gpu", {"util": 50.0})
    events.note("not a span")
    with pytest.raises(RuntimeError), events.span("optimizer", iteration=1):
        raise RuntimeError("interrupted")
    events.close()
    # meta, train, sync, counter, note, optimizer: each span heard once it is in the file, nothing else heard
    assert [(r["phase"], written) for r, written in heard] == [("train", 2), ("sync", 3), ("optimizer", 6)]
    assert heard[0][0]["samples"] == 4 and heard[0][0]["extra"] == {"bytes": 8}
    assert heard[2][0]["extra"] == {"error": "RuntimeError"}
    assert heard[0][0] == load_events(tmp_path)[1]  # what the log holds (after its meta record)
