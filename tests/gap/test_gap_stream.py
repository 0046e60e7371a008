"""FragmentStream claims: dynamic tickets hand every fragment out exactly once, head and tail never
overlap, and round-robin claims follow the static plan."""

from __future__ import annotations

import contextlib
import random
import threading

import pytest
import torch

from digenrl.gap.fragments import FragmentPlan
from digenrl.gap.stream import FragmentStream
from digenrl.runtime.comm.control_plane import ControlPlane


def _stream(store, rank: int, plan: FragmentPlan) -> FragmentStream:
    plane = ControlPlane(store, rank, "generator")
    return FragmentStream(plan, plane, (0, 1), sharding="units", device=torch.device("cpu"), timeout_s=5)


TAILS = (0, 2, 4)  # of five producers, these claim from the tail (TAG helpers), the others from the head


def _claim_concurrently(plan: FragmentPlan, iteration: int, head_only: int = 0):
    """Five producers claim ``iteration`` at once; returns their streams, each one's claims, and the head
    claims in the order the store handed them out."""
    store = torch.distributed.HashStore()
    streams = [_stream(store, rank, plan) for rank in range(5)]
    claims: dict[int, list[int]] = {rank: [] for rank in range(5)}
    order: list[int] = []
    lock = threading.Lock()

    def produce(rank: int) -> None:
        tail = rank in TAILS
        while True:
            with contextlib.nullcontext() if tail else lock:
                f = streams[rank].claim(iteration, pipeline=0, tail=tail, head_only=head_only)
                if f is not None and not tail:
                    order.append(f)
            if f is None:
                return
            claims[rank].append(f)

    threads = [threading.Thread(target=produce, args=(r,)) for r in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return streams, claims, order


@pytest.mark.parametrize("fragments", [1, 2, 7, 16])
def test_dynamic_claims_from_head_and_tail_partition_the_iteration(fragments):
    streams, claims, _ = _claim_concurrently(FragmentPlan(fragments * 2, 2, 3), 3)
    everything = sorted(f for fs in claims.values() for f in fs)
    assert everything == list(range(fragments))  # each fragment exactly once
    for rank, fs in claims.items():
        assert fs == (sorted(fs, reverse=True) if rank in TAILS else sorted(fs))  # each end moves one way
    # the next iteration is a fresh queue
    assert streams[1].claim(4, pipeline=0) == 0


@pytest.mark.parametrize(("fragments", "head_only"), [(4, 2), (7, 3), (5, 5), (6, 1)])
def test_fragments_below_head_only_go_to_head_claims_in_index_order_before_the_rest(fragments, head_only):
    """TCSS's planned switch: the fragments bound to the previous version are claimed by generator
    pipelines (head) only and first; helpers (tail) get only the rest; every fragment exactly once."""
    streams, claims, order = _claim_concurrently(FragmentPlan(fragments, 1, 2), 2, head_only)
    assert sorted(f for fs in claims.values() for f in fs) == list(range(fragments))
    assert all(f >= head_only for rank in TAILS for f in claims[rank])
    assert order[:head_only] == list(range(head_only))  # the prefix first, in index order
    assert order == sorted(order)
    with pytest.raises(ValueError, match="head_only"):
        streams[1].claim(3, pipeline=0, head_only=fragments + 1)


def test_round_robin_claims_follow_the_plan_and_refuse_helpers():
    store = torch.distributed.HashStore()
    plan = FragmentPlan(12, 2, 4, "round-robin")
    stream = _stream(store, 0, plan)
    for pipeline in range(4):
        got = []
        while (f := stream.claim(0, pipeline=pipeline)) is not None:
            got.append(f)
        assert tuple(got) == plan.fragments_of(pipeline)
    with pytest.raises(ValueError, match="round-robin assignment has no shared queue"):
        stream.claim(1, tail=True)


def test_unit_and_sample_shards_cover_the_fragment():
    from tests.gap.test_gap_unit_sharding import _synthetic  # a random scored fragment

    batch = _synthetic(random.randint(4, 9), 3, 8, shared_steps=True)
    store = torch.distributed.HashStore()
    for sharding, expected in (("units", batch.num_units), ("samples", batch.batch_size)):
        stream = FragmentStream(
            FragmentPlan(4, 2),
            ControlPlane(store, 0, "generator"),
            (0, 1, 2),
            sharding=sharding,
            device=torch.device("cpu"),
            timeout_s=5,
        )
        shards = stream.shards(batch)
        assert len(shards) == 3 and sum(s.batch_size for s in shards) == expected
