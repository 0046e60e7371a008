"""Runs that tests in several files of tests/systems read (session fixtures)."""

from __future__ import annotations

import pytest

from tests.systems.launcher import resume_from_copy, run_train

#: FSDP2 full fine-tuning on 2 ranks with an EMA: sharded checkpoints (``trainer.checkpoint_format=auto``)
FSDP2_FULL_EMA = [
    "system=colocated-sync",
    "profile=cpu-2",
    "trainer.mode=full",
    "iterations=3",
    "checkpoint_every=2",
    "trainer.ema_decay=0.9",
]


@pytest.fixture(scope="session")
def fsdp2_full_ema_runs(tmp_path_factory):
    """The uninterrupted 2-rank run and a copy resumed from its sharded checkpoint step_2 (read by
    tests/systems/test_sharded_checkpoints.py and test_export_runs.py: one pair of runs, not two)."""
    root = tmp_path_factory.mktemp("fsdp2-full-ema")
    full, resumed = root / "full", root / "resumed"
    run_train([*FSDP2_FULL_EMA, f"out_dir={full}"], nproc=2)
    resume_from_copy(full, resumed, 2, FSDP2_FULL_EMA, nproc=2)
    return full, resumed
