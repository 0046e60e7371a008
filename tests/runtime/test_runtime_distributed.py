"""init_distributed / barrier / agree_clock_origin, single-process and in a real 2-process gloo world."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from digenrl.runtime.comm.control_plane import ControlPlane
from digenrl.runtime.comm.distributed import barrier, init_distributed, named_collective, shutdown_distributed
from digenrl.runtime.comm.errors import DistributedTimeoutError, PeerFailureError
from digenrl.runtime.observe.events import agree_clock_origin
from tests.runtime.spawn import spawn_workers

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")


@pytest.fixture
def no_torchrun_env(monkeypatch):
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)


def test_single_process_context(no_torchrun_env, monkeypatch):
    monkeypatch.delenv("DIGENRL_THREADS", raising=False)
    ctx = init_distributed()
    assert not ctx.is_distributed and ctx.rank == 0 and ctx.world_size == 1 and ctx.local_rank == 0
    assert not dist.is_initialized()
    ctx.barrier("nothing to wait for", timeout_s=1)  # a no-op without a process group
    before = time.time()
    assert before - 1 <= agree_clock_origin(ctx) <= time.time() + 1
    shutdown_distributed()  # safe without a group


def test_threads_env_var(no_torchrun_env, monkeypatch):
    previous = torch.get_num_threads()
    try:
        monkeypatch.setenv("DIGENRL_THREADS", "2")
        init_distributed()
        assert torch.get_num_threads() == 2
        monkeypatch.setenv("DIGENRL_THREADS", "zero")
        with pytest.raises(ValueError, match="DIGENRL_THREADS must be a positive int"):
            init_distributed()
    finally:
        torch.set_num_threads(previous)


def test_bad_arguments(no_torchrun_env, monkeypatch):
    with pytest.raises(ValueError, match=r"backend must be one of \['gloo', 'nccl'\]"):
        init_distributed(backend="mpi")
    with pytest.raises(ValueError, match="timeout_s must be a positive"):
        init_distributed(timeout_s=0)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match=r"torchrun environment is incomplete.*WORLD_SIZE"):
        init_distributed()


def _worker(rank: int, world_size: int, store_path: str, result_dir: str) -> None:
    """One rank of a 2-process gloo world on a FileStore (what torchrun does with a TCPStore)."""
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=30)
    )
    ctx = init_distributed()  # describes the existing group instead of creating one
    result: dict = {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "backend": ctx.backend,
        "is_distributed": ctx.is_distributed,
        "own_time": time.time(),
    }
    result["origin"] = agree_clock_origin(ctx)
    ctx.barrier("everyone arrives", timeout_s=20)
    plane = ControlPlane(store, rank, "trainer" if rank == 0 else "generator", 20.0, namespace="test")
    if rank == 0:
        try:
            ctx.barrier("rank 1 never comes", timeout_s=2)
        except DistributedTimeoutError as error:
            result["gloo_barrier_error"] = str(error)
        # The store-based barrier (what NCCL runs use) on the same world, rank 1 absent again.
        try:
            barrier(dataclasses.replace(ctx, backend="nccl"), "store barrier", timeout_s=2)
        except DistributedTimeoutError as error:
            result["store_barrier_error"] = str(error)
        plane.set_flag("rank0-barriers-done")
        try:
            plane.wait_for("fragment/0", peer=1, what="fragment 0", timeout_s=20)
        except PeerFailureError as error:
            result["peer_failure_error"] = str(error)
    else:
        plane.wait_flag("rank0-barriers-done", peer=0, what="rank 0's barrier tests", timeout_s=20)
        plane.report_failure(rank, "generator crashed: simulated")
    Path(result_dir, f"rank{rank}.json").write_text(json.dumps(result))
    shutdown_distributed()


@pytest.mark.distributed
def test_two_process_gloo_world(tmp_path):
    started = time.time()
    spawn_workers(_worker, 2, (str(tmp_path / "store"), str(tmp_path)))
    finished = time.time()
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]

    for rank, result in enumerate(results):
        assert result["rank"] == rank and result["world_size"] == 2
        assert result["backend"] == "gloo" and result["is_distributed"]
    # Clock origin: every rank holds rank 0's clock reading, not its own.
    assert results[0]["origin"] == results[1]["origin"]
    assert started <= results[0]["origin"] <= finished

    gloo_error = results[0]["gloo_barrier_error"]
    assert "rank 0" in gloo_error and "rank 1 never comes" in gloo_error
    # monitored_barrier (rank 0) names the ranks that did not arrive: "Ranks 1 failed to pass ...".
    assert re.search(r"Ranks? 1 failed to pass monitoredBarrier", gloo_error)
    store_error = results[0]["store_barrier_error"]
    assert "rank 0" in store_error and "store barrier" in store_error
    assert "ranks that never arrived: [1]" in store_error
    failure_error = results[0]["peer_failure_error"]
    assert "rank 1 (generator) reported failure: generator crashed: simulated" in failure_error
    assert "rank 0 (trainer)" in failure_error and "fragment 0" in failure_error


def test_named_collective_says_who_waited_for_what():
    what = "rank 1 gathering X over ranks [1, 2]"
    timeout = RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 3000ms for recv")
    expected = r"^rank 1 gathering X over ranks \[1, 2\]: \[gloo.*3000ms"
    with pytest.raises(DistributedTimeoutError, match=expected), named_collective(what):
        raise timeout
    closed = RuntimeError("Connection closed by peer [127.0.0.1]:9623")
    with pytest.raises(RuntimeError, match=r"^rank 1 .*: Connection") as caught, named_collective(what):
        raise closed
    assert not isinstance(caught.value, DistributedTimeoutError)

    class OwnError(RuntimeError):
        pass

    with pytest.raises(OwnError, match=r"^as it was$"), named_collective(what, passthrough=(OwnError,)):
        raise OwnError("as it was")
