"""How units fall into micro-batches is one rule (digenrl/data/micro_batches.py split_units): the trainer's
cut of a unit shard, GAP's packer and the simulator's prices all follow it."""

from __future__ import annotations

import random

import pytest

from digenrl.data.micro_batches import plan_micro_batches, split_units


def test_split_units_is_how_the_trainer_cuts_a_unit_shard():
    for _ in range(20):
        units, micro_batch_size = random.randint(0, 50), random.randint(1, 9)
        full, rest = split_units(units, micro_batch_size)
        sizes = [len(m) for m in plan_micro_batches(units, 1, micro_batch_size)]  # K = 1: a unit shard
        assert sizes == [micro_batch_size] * full + ([rest] if rest else [])


def test_split_units_refuses_what_no_trainer_runs():
    with pytest.raises(ValueError, match="micro_batch_size"):
        split_units(4, 0)
    with pytest.raises(ValueError, match="units"):
        split_units(-1, 4)
