"""The hang guard of the spawned-worker tests (tests/runtime/spawn.py) fails a hung worker without
waiting for the wall-clock backstop, and says it is hung."""

from __future__ import annotations

import os
import time

import pytest

from tests.runtime.spawn import process_cpu_s, spawn_workers


def _sleeping_worker(rank: int, world: int) -> None:
    time.sleep(600)  # a rank blocked forever uses no CPU, like one waiting in a collective


def test_a_worker_that_makes_no_progress_fails_as_hung():
    start = time.monotonic()
    hung = r"1-process test is hung: its workers used 0\.\d\d s of CPU in the last \d+ s "
    hung += r"\(ranks still running: \[0\]\)"
    with pytest.raises(pytest.fail.Exception, match=hung):
        spawn_workers(_sleeping_worker, 1, (), limit_s=3)
    assert time.monotonic() - start < 60


def test_cpu_seconds_of_a_process():
    assert process_cpu_s(os.getpid()) > 0
    assert process_cpu_s(None) is None
