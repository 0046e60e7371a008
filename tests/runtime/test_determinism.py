"""``runtime.deterministic``: PyTorch's deterministic kernels in every rank, said in the banner."""

from __future__ import annotations

import os
import subprocess
import sys

from digenrl.config import load_config
from digenrl.runtime.observe.run_report import start_banner
from digenrl.runtime.reproducibility.determinism import CUBLAS_WORKSPACE_CONFIG

PROBE = (
    "import os, torch; "
    "from digenrl.runtime.reproducibility.determinism import use_deterministic_kernels as use; "
    "assert not torch.are_deterministic_algorithms_enabled(); use(); "
    "print(torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark, "
    "os.environ['CUBLAS_WORKSPACE_CONFIG'])"
)


def _probe(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    if env_value is not None:
        env["CUBLAS_WORKSPACE_CONFIG"] = env_value
    return subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()


def test_switches_the_process_to_deterministic_kernels():
    # a fresh process each: the switch is process-wide and must not leak into the other tests
    assert _probe(None) == f"True False {CUBLAS_WORKSPACE_CONFIG}"
    assert _probe(":16:8") == "True False :16:8"  # a setting the user chose is kept


def test_banner_says_the_mode_only_when_on():
    on = load_config(None, ["runtime.deterministic=true"])
    off = load_config(None, [])
    assert "deterministic kernels (runtime.deterministic=true)" in start_banner(on, 1, "colocated")
    assert "deterministic" not in start_banner(off, 1, "colocated")
