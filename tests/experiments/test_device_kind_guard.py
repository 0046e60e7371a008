"""experiments/gpu/steps.sh's ``require_device_kind``: a device script that names its cost files after
``DEVICE`` stops before any step when GPU 0 is another kind (the device tool may start an H100 for a call that
asked for an H200; on 2026-12-07 an H100's timings were written as ``h200-flux.1-dev.json``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _run(tmp_path: Path, gpu_name: str, device: str) -> subprocess.CompletedProcess[str]:
    """Source steps.sh with a stand-in ``nvidia-smi`` that reports ``gpu_name`` and require ``device``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/usr/bin/env bash\necho '{gpu_name}'\n")
    smi.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    env |= {"OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work")}
    script = f"source experiments/gpu/steps.sh; require_device_kind {device}; echo STEPS-RAN"
    return subprocess.run(
        ["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_a_call_on_another_kind_stops_before_any_step_naming_both(tmp_path):
    done = _run(tmp_path, "NVIDIA H100 80GB HBM3", "h200")
    assert done.returncode == 3
    assert "STEPS-RAN" not in done.stdout
    assert "DEVICE=h200 but GPU 0 is 'h100'" in done.stdout
    assert "rerun with DEVICE=h100" in done.stdout


@pytest.mark.parametrize(("gpu_name", "device"), [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100")])
def test_a_call_on_the_named_kind_goes_on(tmp_path, gpu_name, device):
    done = _run(tmp_path, gpu_name, device)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "STEPS-RAN" in done.stdout
