"""Background NVML sampling of the local GPU into the event log (docs/design.md §5, "Event logs and traces").

Every ``interval_s`` a daemon thread reads, for this rank's GPU, the NVML utilisation rates (percent of
the last sample period in which a kernel ran / device memory was read or written), memory in use and
board power, and writes them as a ``gpu`` counter record. Utilisation is NVML's coarse "a kernel was
running" signal, not SM occupancy: span-based busy fractions remain the primary bubble measure.

Without NVML (no ``pynvml`` module, no driver, no GPU — CPU CI) the telemetry is a no-op: it says so once
in the process log and once as a note in the event log, and never raises.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping

import torch

from digenrl.runtime.observe.events import EventLogger

_log = logging.getLogger(__name__)
_disabled_reason_logged = False

Sampler = Callable[[], Mapping[str, float]]


class GpuTelemetry:
    """Sample one GPU every ``interval_s`` into ``logger`` as ``gpu`` counters, from a daemon thread.

    Args:
        logger: the rank's event log.
        interval_s: sampling period (NVML updates utilisation about every 1/6–1 s; 0.5 s is plenty).
        device_index: CUDA ordinal as torch sees it (None: the current device).
        sampler: replaces the NVML reader (tests; other vendors). Returns the values of one sample.
    """

    def __init__(
        self,
        logger: EventLogger,
        interval_s: float = 0.5,
        *,
        device_index: int | None = None,
        sampler: Sampler | None = None,
    ) -> None:
        if isinstance(interval_s, bool) or not isinstance(interval_s, int | float) or interval_s <= 0:
            raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s!r}")
        self.logger = logger
        self.interval_s = float(interval_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml_handle: object | None = None
        self.disabled_reason: str | None = None
        if sampler is not None:
            self._sampler: Sampler | None = sampler
        else:
            self._sampler = self._open_nvml(device_index)

    @property
    def enabled(self) -> bool:
        return self._sampler is not None

    def start(self) -> GpuTelemetry:
        if self._sampler is None or self._thread is not None:
            return self
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"gpu-telemetry-rank{self.logger.rank}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling and wait for the thread; call before closing the logger."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self._nvml_handle is not None:
            import pynvml

            pynvml.nvmlShutdown()
            self._nvml_handle = None
            self._sampler = None

    def __enter__(self) -> GpuTelemetry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        assert self._sampler is not None
        while not self._stop.is_set():
            try:
                values = self._sampler()
            except Exception as error:  # a GPU fault must not kill the run through its profiler
                self._disable(f"sampling failed: {type(error).__name__}: {error}")
                return
            self.logger.counter("gpu", values)
            self._stop.wait(self.interval_s)

    def _disable(self, reason: str) -> None:
        global _disabled_reason_logged
        self.disabled_reason = reason
        if not _disabled_reason_logged:
            _log.info("GPU telemetry disabled: %s", reason)
            _disabled_reason_logged = True
        self.logger.note("GPU telemetry disabled", reason=reason)

    def _open_nvml(self, device_index: int | None) -> Sampler | None:
        if not torch.cuda.is_available():
            self._disable("CUDA is not available")
            return None
        try:
            import pynvml
        except ImportError:
            self._disable("pynvml (nvidia-ml-py) is not installed")
            return None
        try:
            pynvml.nvmlInit()
        except Exception as error:
            self._disable(f"nvmlInit failed: {error}")
            return None
        index = torch.cuda.current_device() if device_index is None else device_index
        try:
            handle = _nvml_handle_of(pynvml, index)
        except Exception as error:
            pynvml.nvmlShutdown()
            self._disable(f"no NVML handle for cuda:{index}: {error}")
            return None
        self._nvml_handle = handle

        def sample() -> dict[str, float]:
            rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            return {
                "util_pct": float(rates.gpu),
                "mem_util_pct": float(rates.memory),
                "mem_used_gib": memory.used / 2**30,
                "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,  # NVML reports milliwatts
            }

        return sample


def _nvml_handle_of(pynvml: object, cuda_index: int) -> object:
    """NVML handle of the device torch calls ``cuda:<cuda_index>``.

    NVML numbers devices physically and ignores CUDA_VISIBLE_DEVICES, so match by UUID (torch exposes it
    as ``get_device_properties(i).uuid``); fall back to the visible-devices list, then to the index.
    """
    uuid = getattr(torch.cuda.get_device_properties(cuda_index), "uuid", None)
    if uuid is not None:
        text = str(uuid)
        return pynvml.nvmlDeviceGetHandleByUUID(text if text.startswith("GPU-") else f"GPU-{text}")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
        entry = entries[cuda_index]
        if entry.isdigit():
            return pynvml.nvmlDeviceGetHandleByIndex(int(entry))
        return pynvml.nvmlDeviceGetHandleByUUID(entry)
    return pynvml.nvmlDeviceGetHandleByIndex(cuda_index)
