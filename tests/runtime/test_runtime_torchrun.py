"""The runtime under a real torchrun launch: env:// rendezvous, torchrun's TCPStore as the control plane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("torchrun_smoke.py")
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.distributed
def test_torchrun_two_cpu_workers(tmp_path):
    env = dict(os.environ, DIGENRL_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO_ROOT))
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(name, None)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(SCRIPT),
        "--out",
        str(tmp_path),
    ]
    completed = subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]

    results = [json.loads((tmp_path / f"result_rank{rank}.json").read_text()) for rank in range(2)]
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["backend"] == "gloo" and r["world_size"] == 2 and r["device"] == "cpu" for r in results)
    assert results[0]["origin"] == results[1]["origin"]
    assert sorted(r["ticket"] for r in results) == [0, 1]
    assert [r["peer_value"] for r in results] == [10, 0]  # each rank read the other's published value
    assert all(r["policy_version_seen"] == 1 for r in results)
    assert not any(r["telemetry_enabled"] for r in results)  # no GPU: a no-op, not a failure

    trace = json.loads((tmp_path / "trace.json").read_text())
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {0: "rank 0 (trainer)", 1: "rank 1 (generator)"}
    summary = json.loads((tmp_path / "summary.json").read_text())
    iteration = summary["0"]
    assert set(iteration["busy_fraction"]) == {"trainer", "generator"}
    assert all(0.0 < fraction <= 1.0 for fraction in iteration["busy_fraction"].values())
    assert iteration["samples"] == {"train": 2, "generate": 2}
