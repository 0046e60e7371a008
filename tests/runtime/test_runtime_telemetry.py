"""GpuTelemetry: a clean no-op without a GPU, and a sampling thread that lands samples in the event log."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from digenrl.runtime.observe.event_records import load_events
from digenrl.runtime.observe.events import EventLogger
from digenrl.runtime.observe.telemetry import GpuTelemetry


def test_no_gpu_is_a_logged_noop(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    logger = EventLogger(tmp_path, 0, "trainer", time.time())
    with GpuTelemetry(logger, interval_s=0.01) as telemetry:
        assert not telemetry.enabled
        assert "CUDA is not available" in telemetry.disabled_reason
    logger.close()
    records = load_events(tmp_path)
    notes = [r for r in records if r["type"] == "note"]
    assert len(notes) == 1 and "CUDA is not available" in notes[0]["reason"]
    assert not [r for r in records if r["type"] == "counter"]


def test_sampler_thread_writes_counters(tmp_path):
    logger = EventLogger(tmp_path, 3, "generator", time.time())
    produced: list[dict[str, float]] = []
    enough = threading.Event()

    def sampler() -> dict[str, float]:
        values = {"util_pct": random.uniform(0, 100), "power_w": random.uniform(50, 700)}
        produced.append(values)
        if len(produced) >= 3:
            enough.set()
        return values

    telemetry = GpuTelemetry(logger, interval_s=0.01, sampler=sampler).start()
    assert telemetry.enabled
    assert enough.wait(timeout=30)
    telemetry.stop()
    logger.close()
    counters = [r for r in load_events(tmp_path) if r["type"] == "counter"]
    assert [c["values"] for c in counters] == produced  # JSON round-trips floats exactly
    assert all(c["name"] == "gpu" and c["rank"] == 3 for c in counters)
    times = [c["t"] for c in counters]
    assert times == sorted(times)


def test_failing_sampler_disables_itself(tmp_path):
    logger = EventLogger(tmp_path, 0, "trainer", time.time())

    def sampler() -> dict[str, float]:
        raise OSError("NVML_ERROR_GPU_IS_LOST")

    telemetry = GpuTelemetry(logger, interval_s=0.01, sampler=sampler).start()
    telemetry.stop()  # joins the thread, which exits after the first failed sample
    logger.close()
    assert "NVML_ERROR_GPU_IS_LOST" in telemetry.disabled_reason
    notes = [r for r in load_events(tmp_path) if r["type"] == "note"]
    assert len(notes) == 1 and "NVML_ERROR_GPU_IS_LOST" in notes[0]["reason"]


def test_interval_validation(tmp_path):
    logger = EventLogger(tmp_path, 0, "trainer", time.time())
    with pytest.raises(ValueError, match="interval_s must be a positive number"):
        GpuTelemetry(logger, interval_s=0)
    logger.close()
