"""``model.fp8`` through the runtime: a separate generator rank converts its copy of the transformer as the
trainer does (digenrl/trainer/lora.py prepare_generator_model), so the trainer's FP8 forward reproduces the
rollout's and every unit trains on-policy; the adapter still learns (non-zero updates). With the generator's
conversion removed this run's ratio leaves 1 ± 1e-5 at iteration 0 (checked when the test was written)."""

from __future__ import annotations

import pytest

from digenrl.runtime.observe.metrics import read_metrics
from tests.systems.launcher import run_train

pytestmark = pytest.mark.needs("torchao")


def test_fp8_separate_run_stays_on_policy(tmp_path):
    overrides = ["iterations=2", "model.dtype=bfloat16", "model.autocast=true", "model.fp8=true"]
    overrides += ["system=separate-sync", "profile=cpu-2", "pools.trainers=1", "pools.generators=1"]
    proc = run_train([*overrides, f"out_dir={tmp_path}"], nproc=2)
    records = read_metrics(tmp_path)
    assert len(records) == 2
    for r in records:
        assert abs(r["ratio_min"] - 1) < 1e-5 and abs(r["ratio_max"] - 1) < 1e-5, r
        assert r["update_norm"] > 0
    assert "[rank 0] INFO digenrl.models.fp8: model.fp8:" in proc.stdout + proc.stderr
