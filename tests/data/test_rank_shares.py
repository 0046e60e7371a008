"""How a colocated iteration's samples are shared over ranks (digenrl/data/rank_shares.py)."""

from __future__ import annotations

import itertools

import pytest

from digenrl.data.micro_batches import plan_micro_batches
from digenrl.data.rank_shares import RankShare, rank_shares, split_backend_conflict


def _cover(shares: list[RankShare], total: int) -> None:
    assert shares[0].start == 0 and shares[-1].stop == total
    assert all(a.stop == b.start for a, b in itertools.pairwise(shares))


def test_equal_split_gives_whole_groups_when_they_divide_and_cuts_a_group_when_groups_are_fewer():
    whole = rank_shares(4, 4, [1.0, 1.0], 8, "equal")
    assert [s.picks(4) for s in whole] == [
        [(0, [0, 1, 2, 3]), (1, [0, 1, 2, 3])],
        [(2, [0, 1, 2, 3]), (3, [0, 1, 2, 3])],
    ]
    cut = rank_shares(1, 4, [1.0] * 4, 8, "equal")  # 1 group, 4 ranks: one sample each
    assert [s.picks(4) for s in cut] == [[(0, [j])] for j in range(4)]
    _cover(cut, 4)
    # 16 groups x 8 samples on 32 ranks (the h800-32 video rows): 4 samples each, half a group
    video = rank_shares(16, 8, [1.0] * 32, 4, "equal")
    assert {s.samples for s in video} == {4} and video[1].picks(8) == [(0, [4, 5, 6, 7])]
    assert {s.micro_batch_size for s in video} == {4}


def test_speed_lockstep_split_follows_the_speeds_with_the_same_micro_batch_steps_on_every_rank():
    speeds = [0.9] * 8 + [0.32] * 8  # hetero-h100-a100-16
    shares = rank_shares(16, 8, speeds, 4, "speed-lockstep")
    _cover(shares, 128)
    assert sum(s.samples for s in shares) == 128
    assert shares[0].samples > 2 * shares[8].samples  # H100s take about 2.8x an A100's share
    assert max(s.micro_batch_size for s in shares) <= 4
    k = 7
    steps = {len(plan_micro_batches(s.samples, k, s.micro_batch_size)) for s in shares}
    assert len(steps) == 1, steps  # FSDP2's collectives stay in lockstep
    two = rank_shares(1, 4, [0.002, 0.001], 8, "speed-lockstep")  # the cpu-2-hetero test profile
    assert [s.samples for s in two] == [3, 1] and [s.micro_batch_size for s in two] == [3, 1]


def test_speed_split_gives_full_size_micro_batches_in_numbers_proportional_to_speed():
    speeds = [0.9] * 8 + [0.32] * 8  # hetero-h100-a100-16
    shares = rank_shares(16, 8, speeds, 4, "speed")
    _cover(shares, 128)
    assert {s.micro_batch_size for s in shares} == {4}  # never shrunk: the memory the planner checked
    fast, slow = shares[0].samples, shares[8].samples
    assert (fast, slow) == (12, 4)  # 128 x 0.9 / 9.76 = 11.8 and 128 x 0.32 / 9.76 = 4.2, largest remainder
    k = 7
    counts = [len(plan_micro_batches(s.samples, k, s.micro_batch_size)) for s in shares]
    assert counts[0] == 3 * counts[8]  # uneven counts: the H100 runs 3x the A100's micro-batches
    two = rank_shares(1, 4, [0.002, 0.001], 8, "speed")  # the cpu-2-hetero test profile
    assert [s.samples for s in two] == [3, 1] and [s.micro_batch_size for s in two] == [8, 8]


def test_speed_needs_a_backend_that_reduces_once_per_step():
    assert split_backend_conflict("speed", "ddp") is None and split_backend_conflict("speed", "none") is None
    assert "speed-lockstep" in split_backend_conflict("speed", "fsdp2")
    assert split_backend_conflict("speed", "deepspeed", deepspeed_stage=1) is None
    assert split_backend_conflict("speed", "deepspeed", deepspeed_stage=3) is not None
    assert split_backend_conflict("speed-lockstep", "fsdp2") is None


def test_speed_splits_of_equal_devices_are_the_equal_split():
    for split in ("speed", "speed-lockstep"):
        for prompts, g, ranks, m in ((4, 4, 2, 8), (16, 8, 32, 4), (8, 8, 16, 2)):
            assert rank_shares(prompts, g, [0.5] * ranks, m, split) == rank_shares(
                prompts, g, [1.0] * ranks, m, "equal"
            )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((1, 3, [1.0, 1.0], 4, "equal"), "do not divide evenly over 2 ranks"),
        ((1, 2, [1.0, 1.0, 1.0], 4, "speed-lockstep"), "cannot be shared over 3 ranks"),
        ((1, 2, [1.0, 1.0, 1.0], 4, "speed"), "at least one sample"),
        ((1, 4, [1.0, 0.0], 4, "speed"), "positive and finite"),
        ((1, 4, [1.0], 4, "fastest"), "split='fastest'"),
    ],
)
def test_a_batch_that_cannot_be_shared_is_refused_saying_why(args, needle):
    with pytest.raises(ValueError, match=needle):
        rank_shares(*args)
