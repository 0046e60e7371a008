"""The event kernel and the link model."""

from __future__ import annotations

import random

import pytest

from digenrl.runtime.hardware.profiles import load_profile
from digenrl.sim.des import Delay, Mailbox, Simulation
from digenrl.sim.network import Network


def test_processes_interleave_in_time_order_and_mailbox_is_fifo():
    sim = Simulation()
    box = Mailbox(sim, "box")
    log = []

    def producer():
        for i in range(3):
            yield Delay(1.0)
            box.put(i)

    def consumer(name):
        while True:
            item = yield box.get()
            log.append((sim.now, name, item))
            if item == 2:
                return

    sim.spawn(consumer("a"), "a")
    sim.spawn(producer(), "producer")
    assert sim.run() == 3.0
    assert log == [(1.0, "a", 0), (2.0, "a", 1), (3.0, "a", 2)]


def test_deadlock_is_reported_with_the_blocked_process():
    sim = Simulation()

    def stuck():
        yield sim.signal("never")

    sim.spawn(stuck(), "stuck rank 3")
    with pytest.raises(RuntimeError, match="stuck rank 3"):
        sim.run()


def test_transfers_sharing_a_port_serialise_and_disjoint_ones_run_in_parallel():
    profile = load_profile("a100-16")  # 2 nodes x 8
    net = Network(profile)
    rng = random.Random(2027)
    nbytes = rng.uniform(1e8, 1e9)
    intra = profile.link_gbps(0, 1) * 1e9
    inter = profile.link_gbps(0, 8) * 1e9
    assert net.reserve_transfer(0.0, 0, 1, nbytes) == (0.0, pytest.approx(nbytes / intra))
    # same sender egress: queued behind the first
    start, end = net.reserve_transfer(0.0, 0, 2, nbytes)
    assert start == pytest.approx(nbytes / intra) and end == pytest.approx(2 * nbytes / intra)
    # disjoint ports: in parallel, and across nodes at the network rate
    assert net.reserve_transfer(0.0, 3, 9, nbytes) == (0.0, pytest.approx(nbytes / inter))
    # a rank's egress and ingress are independent (full duplex)
    assert net.reserve_transfer(0.0, 1, 4, nbytes)[0] == 0.0
    assert net.reserve_transfer(0.0, 5, 5, nbytes) == (0.0, 0.0)  # local hand-over


def test_ring_collectives_follow_the_bus_bandwidth_formulas():
    profile = load_profile("a100-16")
    net = Network(profile)
    nbytes = 3e9
    ranks = list(range(4))
    intra = profile.link_gbps(0, 1) * 1e9
    assert net.allreduce_s(ranks, nbytes) == pytest.approx(2 * 3 / 4 * nbytes / intra)
    assert net.broadcast_s(ranks, nbytes) == pytest.approx(nbytes / intra)
    cross = [6, 7, 8, 9]  # the ring crosses the network
    assert net.broadcast_s(cross, nbytes) == pytest.approx(nbytes / (profile.link_gbps(7, 8) * 1e9))
    assert net.allreduce_s([3], nbytes) == 0.0
    assert net.host_copy_s(nbytes) == pytest.approx(nbytes / (profile.links.host_device_gbps * 1e9))
