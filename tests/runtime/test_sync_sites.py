"""Host syncs by Python call site (digenrl/runtime/observe/sync_sites.py).

The sync debug mode is a CUDA feature: the recording test runs where a GPU is and says why it skips here. On
the CPU: what a recorded stack turns into (the innermost frame and the innermost frame of the package), the
table, and that the context changes nothing on a CPU device."""

from __future__ import annotations

import traceback
import warnings

import pytest
import torch

from digenrl.runtime.observe.sync_sites import SyncSites, format_sync_sites, recorded_sync_sites


def _frame(path: str, line: int, name: str) -> traceback.FrameSummary:
    return traceback.FrameSummary(path, line, name, lookup_line=False)


def test_a_sync_inside_a_library_is_named_with_the_package_line_that_led_to_it():
    sites = SyncSites()
    from_trainer = [
        _frame("/repo/experiments/run_train.py", 16, "<module>"),
        _frame("/repo/digenrl/trainer/trainer.py", 118, "index"),
        _frame("/usr/lib/python3.11/site-packages/diffusers/models/embeddings.py", 40, "forward"),
    ]
    for _ in range(3):
        sites.add(from_trainer)
    sites.add([_frame("/repo/digenrl/rollout/engine.py", 352, "_advance")])
    sites.add([_frame("/usr/lib/python3.11/warnings.py", 1, "warn")])  # nothing but the warning machinery
    assert sites.rows() == [
        {
            "site": "diffusers/models/embeddings.py:40 (forward)",
            "caller": "/repo/digenrl/trainer/trainer.py:118 (index)",
            "count": 3,
        },
        {
            "site": "/repo/digenrl/rollout/engine.py:352 (_advance)",
            "caller": "/repo/digenrl/rollout/engine.py:352 (_advance)",
            "count": 1,
        },
    ]
    lines = format_sync_sites(sites.rows())
    assert "Host syncs by Python call site (4 in all" in lines[1]
    row = "| 3 | `diffusers/models/embeddings.py:40 (forward)` | "
    row += "`/repo/digenrl/trainer/trainer.py:118 (index)` |"
    assert row in lines
    assert format_sync_sites([]) == []


def test_a_package_file_is_named_from_the_repository_root():
    sites = SyncSites()
    here = traceback.extract_stack()
    sites.add(here)
    (row,) = sites.rows()
    assert row["site"].startswith("tests/runtime/test_sync_sites.py:")
    assert row["caller"] is None  # no frame of the digenrl package on this stack


def test_on_a_cpu_device_nothing_is_recorded_and_warnings_pass_through():
    with recorded_sync_sites(torch.device("cpu")) as sites, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("an ordinary warning", UserWarning, stacklevel=1)
        torch.zeros(3).sum().item()
    assert sites.rows() == [] and [str(w.message) for w in caught] == ["an ordinary warning"]


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="torch.cuda.set_sync_debug_mode needs a CUDA device"
)
def test_an_item_of_a_device_tensor_is_recorded_at_its_line():
    x = torch.ones(4, device="cuda")
    before = torch.cuda.get_sync_debug_mode()
    with recorded_sync_sites(torch.device("cuda")) as sites:
        line = traceback.extract_stack()[-1].lineno + 1
        x.sum().item()
        x.add_(1)  # no sync
    assert torch.cuda.get_sync_debug_mode() == before
    (row,) = sites.rows()
    name = "test_an_item_of_a_device_tensor_is_recorded_at_its_line"
    assert row["site"] == f"tests/runtime/test_sync_sites.py:{line} ({name})"
    assert row["count"] == 1
