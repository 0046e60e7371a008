"""How a colocated iteration's samples are shared over ranks (digenrl/data/rank_shares.py)."""

from __future__ import annotations

import itertools

import pytest

from digenrl.data.micro_batches import plan_micro_batches
from digenrl.data.rank_shares import RankShare, rank_shares


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


def test_speed_split_follows_the_speeds_with_the_same_micro_batch_steps_on_every_rank():
    speeds = [0.9] * 8 + [0.32] * 8  # hetero-h100-a100-16
    shares = rank_shares(16, 8, speeds, 4, "speed")
    _cover(shares, 128)
    assert sum(s.samples for s in shares) == 128
    assert shares[0].samples > 2 * shares[8].samples  # H100s take about 2.8x an A100's share
    assert max(s.micro_batch_size for s in shares) <= 4
    k = 7
    steps = {len(plan_micro_batches(s.samples, k, s.micro_batch_size)) for s in shares}
    assert len(steps) == 1, steps  # FSDP2's collectives stay in lockstep
    two = rank_shares(1, 4, [0.002, 0.001], 8, "speed")  # the cpu-2-hetero test profile
    assert [s.samples for s in two] == [3, 1] and [s.micro_batch_size for s in two] == [3, 1]


def test_speed_split_of_equal_devices_is_the_equal_split():
    for prompts, g, ranks, m in ((4, 4, 2, 8), (16, 8, 32, 4), (8, 8, 16, 2)):
        assert rank_shares(prompts, g, [0.5] * ranks, m, "speed") == rank_shares(
            prompts, g, [1.0] * ranks, m, "equal"
        )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((1, 3, [1.0, 1.0], 4, "equal"), "do not divide evenly over 2 ranks"),
        ((1, 2, [1.0, 1.0, 1.0], 4, "speed"), "cannot be shared over 3 ranks"),
        ((1, 4, [1.0, 0.0], 4, "speed"), "positive and finite"),
        ((1, 4, [1.0], 4, "fastest"), "split='fastest'"),
    ],
)
def test_a_batch_that_cannot_be_shared_is_refused_saying_why(args, needle):
    with pytest.raises(ValueError, match=needle):
        rank_shares(*args)
