"""ControlPlane on in-process stores: tickets, values, versions, barriers, timeouts and failure reports."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch.distributed as dist

from digenrl.runtime.comm.control_plane import ControlPlane
from digenrl.runtime.comm.errors import DistributedTimeoutError, PeerFailureError


@pytest.fixture(params=["hash", "file"])
def store(request, tmp_path):
    if request.param == "hash":
        return dist.HashStore()
    return dist.FileStore(str(tmp_path / "store"), 1)


def _plane(store, rank=0, role="trainer", **kwargs) -> ControlPlane:
    kwargs.setdefault("namespace", f"run-{uuid.uuid4().hex[:8]}")
    return ControlPlane(store, rank, role, 5.0, **kwargs)


def test_tickets_are_atomic_and_increasing(store):
    plane = _plane(store)
    views = [ControlPlane(store, rank, "generator", 5.0, namespace=plane.namespace) for rank in range(4)]
    draws_per_thread = 25

    def draw(view: ControlPlane) -> list[int]:
        return [view.ticket("fragments") for _ in range(draws_per_thread)]

    with ThreadPoolExecutor(max_workers=4) as pool:
        per_thread = list(pool.map(draw, views))
    everything = sorted(t for tickets in per_thread for t in tickets)
    assert everything == list(range(4 * draws_per_thread))  # no duplicates, no gaps, 0-based
    for tickets in per_thread:
        assert tickets == sorted(tickets) and len(set(tickets)) == len(tickets)
    assert plane.ticket("other-counter") == 0  # counters are independent


def test_publish_wait_for_roundtrip_and_types(store):
    plane = _plane(store)
    payload = uuid.uuid4().bytes
    plane.publish("blob", payload)
    plane.publish("text", "héllo")
    plane.publish("number", 42)
    assert plane.wait_for("blob", peer=1, what="a blob", timeout_s=1) == payload
    assert plane.wait_for("text", peer=1, what="text", timeout_s=1).decode() == "héllo"
    assert int(plane.wait_for("number", peer=1, what="n", timeout_s=1)) == 42
    assert plane.try_get("missing") is None
    with pytest.raises(ValueError, match="value must be bytes, str or int"):
        plane.publish("bad", 1.5)


def test_wait_for_returns_value_published_later_by_another_thread(store):
    plane = _plane(store)
    value = uuid.uuid4().hex
    timer = threading.Timer(0.1, plane.publish, args=("late", value))
    timer.start()
    try:
        assert plane.wait_for("late", peer=3, what="late value", timeout_s=5).decode() == value
    finally:
        timer.cancel()


def test_wait_for_timeout_names_rank_role_key_peer(store):
    plane = _plane(store, rank=3, role="generator").scoped("iter7")
    with pytest.raises(DistributedTimeoutError) as info:
        plane.wait_for("fragment/2/ready", peer=5, what="fragment 2 of iteration 7", timeout_s=0.2)
    message = str(info.value)
    assert "rank 3 (generator)" in message
    assert f"{plane.namespace}/iter7/fragment/2/ready" in message  # the full, namespaced key
    assert "rank 5" in message
    assert "fragment 2 of iteration 7" in message
    assert "0.2 s" in message


def test_scopes_do_not_collide(store):
    plane = _plane(store)
    plane.scoped("iter0").publish("ready", "a")
    assert plane.scoped("iter1").try_get("ready") is None
    assert plane.scoped("iter0").try_get("ready") == b"a"
    assert plane.try_get("ready") is None


def test_flags(store):
    plane = _plane(store)
    assert not plane.flag_is_set("weights-published")
    plane.set_flag("weights-published")
    assert plane.flag_is_set("weights-published")
    plane.wait_flag("weights-published", peer="trainer pool", what="weights", timeout_s=1)


def test_versions_are_monotonic_and_waitable(store):
    plane = _plane(store)
    assert plane.read_version("policy") is None
    plane.publish_version("policy", 0)
    plane.publish_version("policy", 2)
    plane.publish_version("policy", 2)  # republishing the same version is harmless
    assert plane.read_version("policy") == 2
    assert plane.wait_version("policy", 1, peer=0, timeout_s=1) == 2  # newer than asked is fine
    with pytest.raises(ValueError, match="must not go backwards"):
        plane.publish_version("policy", 1)
    timer = threading.Timer(0.1, plane.publish_version, args=("policy", 3))
    timer.start()
    try:
        assert plane.wait_version("policy", 3, peer=0, timeout_s=5) == 3
    finally:
        timer.cancel()
    with pytest.raises(DistributedTimeoutError, match=r"version >= 9 of 'policy'"):
        plane.wait_version("policy", 9, peer=0, timeout_s=0.1)


def test_failure_report_surfaces_in_waiting_peer(store):
    waiter = _plane(store, rank=0, role="trainer")
    reporter = ControlPlane(store, 2, "generator", 5.0, namespace=waiter.namespace).scoped("iter3")
    reason = f"CUDA out of memory on fragment {uuid.uuid4().hex[:6]}"
    assert waiter.failure() is None
    timer = threading.Timer(0.1, reporter.report_failure, args=(2, reason))
    timer.start()
    try:
        with pytest.raises(PeerFailureError) as info:
            waiter.scoped("iter3").wait_for("fragment/0", peer=2, what="fragment 0", timeout_s=30)
    finally:
        timer.cancel()
    error = info.value
    assert error.failed_rank == 2 and error.failed_role == "generator" and error.reason == reason
    assert reason in str(error) and "rank 0 (trainer)" in str(error) and "rank 2 (generator)" in str(error)
    report = waiter.failure()
    assert report is not None and report.rank == 2 and report.message == reason
    reporter.report_failure(1, "second failure", role="scorer")
    assert [r.message for r in waiter.failures()] == [reason, "second failure"]
    assert waiter.failure().message == reason  # the first report stays the headline


def test_store_barrier_passes_and_names_missing_ranks(store):
    namespace = f"run-{uuid.uuid4().hex[:8]}"
    planes = [ControlPlane(store, rank, "generator", 5.0, namespace=namespace) for rank in range(3)]
    for _ in range(2):  # reusable: two generations of the same barrier name
        with ThreadPoolExecutor(max_workers=3) as pool:
            list(pool.map(lambda p: p.barrier("sync", range(3), timeout_s=5), planes))
    # Now only ranks 0 and 2 arrive; rank 1 never does.
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(planes[r].barrier, "sync", range(3), timeout_s=0.3) for r in (0, 2)]
        errors = [f.exception() for f in futures]
    for error in errors:
        assert isinstance(error, DistributedTimeoutError)
        assert "ranks that never arrived: [1]" in str(error)
        assert "barrier 'sync'" in str(error)
    with pytest.raises(ValueError, match="must include this rank"):
        planes[0].barrier("other", [1, 2], timeout_s=1)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"rank": -1}, "rank must be a non-negative int"),
        ({"role": ""}, "role must be a non-empty string"),
        ({"default_timeout_s": 0}, "default_timeout_s must be a positive number"),
    ],
)
def test_constructor_validation(kwargs, expected):
    args = {"rank": 0, "role": "trainer", "default_timeout_s": 1.0} | kwargs
    with pytest.raises(ValueError, match=expected):
        ControlPlane(dist.HashStore(), args["rank"], args["role"], args["default_timeout_s"])
