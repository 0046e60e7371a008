"""``model.autocast`` through the runtime: a generator-only rank (LoRA added by weight sync after the
model was optimised) and a trainer rank must both run the transformer under autocast, or the trainer's
forward would not reproduce the rollout's and the on-policy ratio would drift from 1."""

from __future__ import annotations

import pytest

from digenrl.runtime.observe.metrics import read_metrics
from tests.systems.launcher import run_train

AUTOCAST = ["iterations=2", "model.dtype=bfloat16", "model.autocast=true", "sampler.guidance_scale=4.5"]


@pytest.mark.parametrize(
    ("system", "nproc", "extra"),
    [
        ("colocated-sync", 0, ["profile=cpu-1"]),
        ("separate-sync", 2, ["profile=cpu-2", "pools.trainers=1", "pools.generators=1"]),
    ],
)
def test_bf16_autocast_run_stays_on_policy(tmp_path, system, nproc, extra):
    run_train([*AUTOCAST, f"system={system}", *extra, f"out_dir={tmp_path}"], nproc=nproc)
    records = read_metrics(tmp_path)
    assert len(records) == 2
    # one optimizer step per iteration: every unit of a logical batch is trained on-policy
    for r in records:
        assert abs(r["ratio_min"] - 1) < 1e-3 and abs(r["ratio_max"] - 1) < 1e-3, r
        assert r["update_norm"] > 0
