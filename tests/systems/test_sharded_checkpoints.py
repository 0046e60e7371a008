"""FSDP2 full fine-tuning on 2 ranks writes sharded checkpoints (``trainer.checkpoint_format=auto``) and a
resume from one replays the uninterrupted run exactly (the run, with an EMA, is tests/systems/conftest.py's
``fsdp2_full_ema_runs``; test_export_runs.py checks its EMA)."""

from __future__ import annotations

from digenrl.trainer.checkpoint import latest_checkpoint_dir, read_meta
from tests.systems.launcher import assert_resumed_exactly


def test_two_rank_sharded_checkpoint_resumes_exactly(fsdp2_full_ema_runs):
    full, resumed = fsdp2_full_ema_runs
    meta = read_meta(latest_checkpoint_dir(full))
    assert meta["trainer_format"] == "sharded"
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(meta["sharded_files"])
    assert read_meta(resumed / "checkpoints" / "step_2")["trainer_format"] == "sharded"
    assert_resumed_exactly(full, resumed)
