"""The robustness tests' fault injection: which rank and iteration it fires on, and ``after=PATH``, which
holds the fault until a file exists (a published checkpoint), or names the file when it never comes."""

from __future__ import annotations

import threading
import time

import pytest

from digenrl.runtime.faults import fault_injection
from digenrl.runtime.faults.fault_injection import DELAY_VAR, FAULT_VAR, inject_delay, inject_fault


def test_fires_only_on_its_rank_iteration_and_phase(monkeypatch):
    monkeypatch.setenv(FAULT_VAR, "rank=1,iteration=2,phase=train")
    inject_fault(0, 2, "train")
    inject_fault(1, 1, "train")
    inject_fault(1, 2, "start")
    with pytest.raises(RuntimeError, match=r"injected fault on rank 1 at iteration 2 \(train\)"):
        inject_fault(1, 2, "train")


def test_unknown_kind_is_named(monkeypatch):
    monkeypatch.setenv(FAULT_VAR, "rank=0,iteration=0,kind=explode")
    with pytest.raises(ValueError, match="kind='explode'"):
        inject_fault(0, 0)


def test_after_holds_the_fault_until_the_file_exists(monkeypatch, tmp_path):
    marker = tmp_path / "checkpoints" / "latest"
    monkeypatch.setenv(FAULT_VAR, f"rank=3,iteration=1,after={marker}")
    created: list[float] = []

    def publish() -> None:
        time.sleep(0.3)
        marker.parent.mkdir()
        marker.write_text("step_1")
        created.append(time.monotonic())

    writer = threading.Thread(target=publish)
    writer.start()
    with pytest.raises(RuntimeError, match="injected fault on rank 3 at iteration 1"):
        inject_fault(3, 1)
    raised = time.monotonic()
    writer.join()
    assert created and raised >= created[0]


def test_after_names_the_file_that_never_came(monkeypatch, tmp_path):
    monkeypatch.setattr(fault_injection, "AFTER_TIMEOUT_S", 0.1)
    monkeypatch.setenv(FAULT_VAR, f"rank=2,iteration=0,after={tmp_path / 'never'}")
    with pytest.raises(TimeoutError, match=r"\[rank 2\] DIGENRL_INJECT_FAULT: after=.*never did not appear"):
        inject_fault(2, 0)


def test_several_delays_each_slow_their_own_rank_and_phase(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(fault_injection.time, "sleep", slept.append)
    monkeypatch.setenv(DELAY_VAR, "rank=0,phase=train,seconds=1.5;rank=2,phase=generate,seconds=3")
    for rank, phase in [(0, "train"), (0, "generate"), (2, "generate"), (2, "train"), (1, "train")]:
        inject_delay(rank, phase)
    assert slept == [1.5, 3.0]
