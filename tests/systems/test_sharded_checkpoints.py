"""FSDP2 full fine-tuning on 2 ranks writes sharded checkpoints (``trainer.checkpoint_format=auto``) and a
resume from one replays the uninterrupted run exactly."""

from __future__ import annotations

from digenrl.trainer.checkpoint import latest_checkpoint_dir, read_meta
from tests.systems.launcher import assert_resumed_exactly, resume_from_copy, run_train

FSDP2_FULL = [
    "system=colocated-sync",
    "profile=cpu-2",
    "trainer.mode=full",
    "iterations=3",
    "checkpoint_every=2",
]


def test_two_rank_sharded_checkpoint_resumes_exactly(tmp_path):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    run_train([*FSDP2_FULL, f"out_dir={full}"], nproc=2)
    meta = read_meta(latest_checkpoint_dir(full))
    assert meta["trainer_format"] == "sharded"
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(meta["sharded_files"])
    resume_from_copy(full, resumed, 2, FSDP2_FULL, nproc=2)
    assert read_meta(resumed / "checkpoints" / "step_2")["trainer_format"] == "sharded"
    assert_resumed_exactly(full, resumed)
