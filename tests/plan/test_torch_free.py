"""Planning needs no torch (issue 33): ``import digenrl.sim, digenrl.planning`` and ``simulate.py plan`` /
``throughput`` run in a process where importing torch fails (an import blocker stands in for a torch-less
virtual environment)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: Prepended to the child's code: any import of torch (or of what only runs on it) raises.
BLOCKER = """
import importlib.abc, sys
class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "diffusers", "transformers", "torchvision"):
            raise ImportError(f"{name} is blocked: this process stands for an install without torch")
sys.meta_path.insert(0, _NoTorch())
"""


def _run_without_torch(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + code],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_blocker_blocks_torch(tmp_path):
    done = _run_without_torch("import torch", tmp_path)
    assert done.returncode != 0 and "is blocked" in done.stderr


def test_the_simulator_and_the_planner_import_and_plan_without_torch(tmp_path):
    out = tmp_path / "throughput"
    code = f"""
import json, sys
import digenrl.sim, digenrl.planning, digenrl.plan, digenrl.rules
from experiments import simulate
assert simulate.main(["plan", "--profile", "cpu-4", "--costs", "experiments/results/costs/cpu-tiny-sd3.json",
                      "--config", "experiments/configs/tiny.yaml", "--json"]) == 0
assert simulate.main(["throughput", "--quick", "--profiles", "cpu-4", "--out", {str(out)!r}]) == 0
assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
"""
    done = _run_without_torch(code, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    plan = json.loads(done.stdout[: done.stdout.rindex("}") + 1])
    assert plan["profile"] == "cpu-4" and plan["world_size"] == 4
    assert any(out.iterdir())
