"""The heartbeat watchdog on in-process stores: a silent rank is named with its role and phase, a running
or finished one never is, a peer's failure report ends the watch, and the failure line is printed once.

The end-to-end case (torchrun, a SIGSTOPped rank, a survivor blocked in a gloo collective) is
tests/systems/test_watchdog.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta

import pytest
import torch.distributed as dist

from digenrl.runtime.comm.control_plane import ControlPlane
from digenrl.runtime.faults.watchdog import HeartbeatWatchdog, heartbeat_timing
from digenrl.runtime.observe.events import EventLogger

INTERVAL, THRESHOLD = 0.05, 0.4


def _watchdog(store, rank, namespace, failures: list[str], world=2) -> HeartbeatWatchdog:
    """A watchdog that records its failure line in ``failures`` (never ``os._exit`` inside pytest)."""
    return HeartbeatWatchdog(
        store,
        rank,
        world,
        timeout_s=30,
        interval_s=INTERVAL,
        threshold_s=THRESHOLD,
        namespace=namespace,
        on_failure=failures.append,
    )


def _wait_for(failures: list, seconds: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if failures:
            return time.monotonic() - start
        time.sleep(0.01)
    return None


def test_timing_follows_runtime_timeout():
    assert heartbeat_timing(300) == (5.0, 100.0)  # one store write every 5 s, a hang named after 100 s
    assert heartbeat_timing(15) == (1.0, 5.0)
    interval, threshold = heartbeat_timing(0.9)
    assert interval == pytest.approx(0.06) and threshold == pytest.approx(0.3)
    for bad in (0, -1, float("nan"), True):
        with pytest.raises(ValueError, match=r"runtime\.timeout_s"):
            heartbeat_timing(bad)


def test_current_span_is_the_innermost_open_one(tmp_path):
    events = EventLogger(tmp_path, 0, "trainer", time.time())
    assert events.current_span() == (None, None, None)
    with events.span("iteration", iteration=4):
        with events.span("train", iteration=4, fragment=1):
            assert events.current_span() == ("train", 4, None)
        assert events.current_span() == ("iteration", 4, "train")
        entered, leave = threading.Event(), threading.Event()

        def helper() -> None:  # a span on another thread (colocated-overlap scores on one)
            with events.span("score", iteration=4):
                entered.set()
                leave.wait(5)

        thread = threading.Thread(target=helper)
        thread.start()
        entered.wait(5)
        assert events.current_span() == ("score", 4, "train")
        leave.set()
        thread.join()
        assert events.current_span() == ("iteration", 4, "score")
    assert events.current_span() == (None, None, "iteration")
    events.close()


def test_a_silent_rank_is_named_with_its_role_and_phase(tmp_path):
    store, namespace = dist.HashStore(), f"run-{uuid.uuid4().hex[:8]}"
    failures: list[str] = []
    watcher = _watchdog(store, 0, namespace, failures).start()
    silent = _watchdog(store, 1, namespace, [])  # never started: it beats once, by hand, then goes quiet
    events = EventLogger(tmp_path, 1, "generator", time.time())
    silent.follow(events)
    try:
        with events.span("generate", iteration=3, fragment=2):
            silent.beat()
        took = _wait_for(failures, 10 * THRESHOLD)
    finally:
        watcher.stop()
        events.close()
    assert took is not None, "the watchdog never named the silent rank"
    assert THRESHOLD * 0.9 < took < THRESHOLD + 4 * INTERVAL + 0.3, took
    [line] = failures
    assert line.startswith("[rank 0] FAILED: watchdog: rank 1 (generator) is stopped or hung")
    assert "last phase 'generate' (iteration 3)" in line and "limit 0.4 s" in line
    report = ControlPlane(store, 0, "trainer", 5.0, namespace=namespace).failure()
    assert report is not None and (report.rank, report.role) == (1, "generator")
    assert "'generate' (iteration 3)" in report.message and "rank 0's watchdog" in report.message


def test_the_heartbeat_carries_a_new_role_and_phase_at_once_not_at_the_next_period(tmp_path):
    """A trainer that freezes between two periodic beats is named with the role and phase it froze in: the
    heartbeat is written when the role is known and on every span change, not only every ``interval_s``
    (a 30 s period here: the old heartbeat still said "unassigned", phase 'setup')."""
    store, namespace = dist.HashStore(), f"run-{uuid.uuid4().hex[:8]}"
    dog = HeartbeatWatchdog(store, 1, 2, timeout_s=300, interval_s=30, threshold_s=90, namespace=namespace)
    beats = ControlPlane(store, 0, "test", 5.0, namespace=namespace).scoped("watchdog0")
    events = EventLogger(tmp_path, 1, "trainer", time.time())

    def published_within(seconds: float, **expected: object) -> dict:
        deadline = time.monotonic() + seconds
        while True:
            record = json.loads(beats.try_get("rank1"))
            if all(record[key] == value for key, value in expected.items()) or time.monotonic() > deadline:
                return record
            time.sleep(0.01)

    dog.start()
    try:
        assert published_within(0, role="unassigned")["phase"] == "setup"
        dog.follow(events)
        assert published_within(2, role="trainer")["role"] == "trainer"
        for iteration in range(3):
            with events.span("train", iteration=iteration):
                record = published_within(2, phase="train", iteration=iteration)
                assert (record["phase"], record["iteration"]) == ("train", iteration), record
            record = published_within(2, phase=None, after="train")
            assert (record["phase"], record["after"]) == (None, "train"), record
    finally:
        dog.stop()
        events.close()
    assert events.on_span_change is None  # a stopped watchdog no longer listens


def test_running_and_finished_ranks_are_never_called_hung():
    store, namespace = dist.HashStore(), f"run-{uuid.uuid4().hex[:8]}"
    failures: list[str] = []
    dogs = [_watchdog(store, rank, namespace, failures, world=3).start() for rank in range(3)]
    try:
        assert _wait_for(failures, 3 * THRESHOLD) is None, failures
        dogs[2].stop()  # rank 2 finishes first: "done", not dead
        dogs[1].stop()
        assert _wait_for(failures, 3 * THRESHOLD) is None, failures  # rank 0, last to finish, stays calm
    finally:
        for dog in dogs:
            dog.stop()
    assert failures == []


def test_a_main_thread_blocked_on_the_store_does_not_stall_the_heartbeat():
    """A TCPStore client serialises its operations; the watchdog's own connection keeps beating while the
    main thread sits in a long blocking ``get`` (process-group creation does that)."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))
    namespace, failures = f"run-{uuid.uuid4().hex[:8]}", []
    watcher = _watchdog(server, 0, namespace, failures).start()
    blocked = _watchdog(client, 1, namespace, failures).start()
    client.set_timeout(timedelta(seconds=3 * THRESHOLD))
    try:
        with pytest.raises(RuntimeError):  # DistStoreError: the key never comes
            client.get("never-set")
        assert failures == []
    finally:
        blocked.stop()
        watcher.stop()


def test_a_peer_failure_report_ends_the_watch_with_its_reason():
    store, namespace = dist.HashStore(), f"run-{uuid.uuid4().hex[:8]}"
    failures: list[str] = []
    peer = _watchdog(store, 1, namespace, []).start()
    watcher = _watchdog(store, 0, namespace, failures).start()
    try:
        ControlPlane(store, 1, "trainer", 5.0, namespace=namespace).report_failure(
            1, "RuntimeError: CUDA error", role="trainer"
        )
        assert _wait_for(failures, 10 * INTERVAL) is not None
    finally:
        watcher.stop()
        peer.stop()
    assert failures == [
        "[rank 0] FAILED: watchdog: rank 1 (trainer) failed: RuntimeError: CUDA error "
        "(this rank: unassigned, phase 'setup'; stopping)"
    ]


def test_end_process_prints_once_even_when_two_threads_fail():
    script = (
        "import threading, time\n"
        "from digenrl.runtime.faults.watchdog import end_process\n"
        "go = threading.Event()\n"
        "def fail(who):\n"
        "    go.wait()\n"
        "    end_process(f'[rank 0] FAILED: {who}', 'details of ' + who)\n"
        "threads = [threading.Thread(target=fail, args=(w,)) for w in ('main', 'watchdog')]\n"
        "[t.start() for t in threads]\n"
        "go.set()\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.count("[rank 0] FAILED:") == 1, proc.stderr
    assert proc.stderr.count("details of") == 1
