"""Multi-node launch on one host: ``launch_torchrun(nnodes=2)`` starts two torchrun groups that meet
through torchrun's c10d rendezvous, as two machines of a cluster would.

The same run as 2 nodes x 2 processes and as 1 node x 4 gives every global rank the same role and the
same data, so the metrics must be bit-identical; each node group must have held its own two ranks. A
rank that fails on one node fails the whole job with a SystemExit that names that node. CPU, gloo, the
tiny model, one thread per process.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import ClassVar

import pytest

from digenrl.launch import launch_torchrun
from digenrl.runtime.observe.metrics import read_metrics
from tests.runtime.spawn import spawn_workers
from tests.systems.launcher import TINY, run_train

# Disjoint pools with traffic across the node boundary: trainers (ranks 0, 1) on node 0, generators
# (ranks 2, 3) on node 1; weight sync and GAP fragments cross it, TSP stages stay inside node 1.
RUN = [
    "iterations=2",
    "seed=11",
    "profile=cpu-4",
    "system=digenrl",
    "gap=true",
    "tsp_stages=2",
    "pools.trainers=2",
    "pools.generators=2",
    "checkpoint_every=100",
]
LEAKY_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DIGENRL_INJECT_FAULT")
COMPARED = ("reward_mean", "reward_std", "loss", "update_norm", "grad_norm", "ratio_mean", "samples")


@pytest.fixture
def clean_env(monkeypatch):
    """No torchrun variables leak into the launched jobs (pytest itself may run under a launcher)."""
    for name in LEAKY_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    root = tmp_path_factory.mktemp("multinode")
    with pytest.MonkeyPatch.context() as patch:
        for name in LEAKY_VARS:
            patch.delenv(name, raising=False)
        # torchrun's agents print their rendezvous result (group_rank, global_ranks) at INFO.
        patch.setenv("LOGLEVEL", "INFO")
        launch_torchrun(
            [*RUN, f"out_dir={root / 'two'}"],
            nproc=2,
            nnodes=2,
            config=TINY,
            timeout_s=240,
            label="2x2",
            log_dir=root / "logs",
        )
    # the 1 x 4 reference on ranks forked from the preloaded server: the same computation as torchrun's
    # (tests/systems/test_launchers.py), without four more interpreters importing torch and diffusers
    run_train([*RUN, f"out_dir={root / 'one'}"], nproc=4)
    return root


def test_two_nodes_compute_exactly_what_one_node_computes(launches):
    two, one = read_metrics(launches / "two"), read_metrics(launches / "one")
    assert [r["iteration"] for r in two] == [r["iteration"] for r in one] == [0, 1]
    for a, b in zip(one, two, strict=True):
        for key in COMPARED:
            assert a[key] == b[key], (a["iteration"], key, a[key], b[key])
    # Not a vacuous comparison: the policy learned something, so iteration 1 differs from iteration 0.
    assert two[1]["reward_mean"] != two[0]["reward_mean"]


def test_each_node_group_held_its_own_ranks(launches):
    logs = {node: (launches / "logs" / f"node{node}.log").read_text() for node in (0, 1)}
    assert "global_ranks=[0, 1]" in logs[0] and "group_rank=0" in logs[0]
    assert "global_ranks=[2, 3]" in logs[1] and "group_rank=1" in logs[1]
    metas = {}
    for rank in range(4):
        lines = (launches / "two" / "events" / f"rank{rank}.jsonl").read_text().splitlines()
        metas[rank] = json.loads(lines[0])
    assert {rank: meta["role"] for rank, meta in metas.items()} == {
        0: "trainer",
        1: "trainer",
        2: "generator",
        3: "generator",
    }
    assert len({meta["pid"] for meta in metas.values()}) == 4
    trace = json.loads((launches / "two" / "trace.json").read_text())
    phases = {(e["pid"], e["name"]) for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert {(0, "train"), (1, "train"), (2, "generate"), (3, "generate"), (2, "sync")} <= phases
    # The shared-out_dir check of a multi-node start leaves nothing behind.
    assert not list((launches / "two").glob(".shared-check-*"))


def test_a_failing_node_fails_the_job_and_is_named(tmp_path, clean_env):
    clean_env.setenv("DIGENRL_INJECT_FAULT", "rank=1,iteration=0,kind=raise")
    with pytest.raises(SystemExit) as info:
        launch_torchrun(
            ["iterations=2", "profile=cpu-2", "runtime.timeout_s=30", f"out_dir={tmp_path / 'run'}"],
            nproc=1,
            nnodes=2,
            config=TINY,
            timeout_s=120,  # the peer is stopped long before; a hang would end in "did not finish"
            label="fail",
        )
    message = str(info.value)
    assert "nodes failed, in order of exit" in message and "node 1 (exit 1)" in message, message
    assert "node 1: [rank 1] FAILED: RuntimeError: injected fault on rank 1 at iteration 0" in message


def _out_dir_check_rank(rank: int, world: int, root: str) -> None:
    """One rank of a 2-"node" gloo world whose nodes do not share a disk: each rank runs in its own folder
    and ``out_dir`` is relative, so the two ranks mean different directories."""
    from datetime import timedelta

    import torch.distributed as dist

    from digenrl.launch import _require_shared_out_dir
    from digenrl.runtime.comm.distributed import init_distributed

    home = Path(root) / f"node{rank}"
    home.mkdir()
    os.chdir(home)
    os.environ["LOCAL_WORLD_SIZE"] = "1"  # one process per node, two nodes
    store = dist.FileStore(str(Path(root) / "store"), 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=20))
    ctx = init_distributed()
    try:
        _require_shared_out_dir("run", ctx, timeout_s=2.0)
        outcome = "passed"
    except Exception as error:
        outcome = f"{type(error).__name__}: {error}"
    (Path(root) / f"rank{rank}.txt").write_text(outcome)


def test_a_node_local_out_dir_fails_at_start_naming_the_rank(tmp_path):
    spawn_workers(_out_dir_check_rank, 2, (str(tmp_path),))
    seen = (tmp_path / "rank1.txt").read_text()
    assert seen.startswith("ValueError: out_dir='run' is not shared: rank 1 on host"), seen
    assert "filesystem every node mounts" in seen
    # rank 0 learns from the barrier that rank 1 never arrived, and removes its marker all the same
    assert (tmp_path / "rank0.txt").read_text().startswith("DistributedTimeoutError"), seen
    assert not list((tmp_path / "node0" / "run").glob(".shared-check-*"))


class _FakeNode:
    """Stands in for one torchrun group: records its command line and environment, exits 0 at once."""

    started: ClassVar[list[_FakeNode]] = []

    def __init__(self, cmd, *, env, **_kwargs):
        self.cmd, self.env, self.pid, self.returncode = cmd, env, 0, 0
        _FakeNode.started.append(self)

    def poll(self):
        return 0


def test_node_groups_get_one_rendezvous_and_their_own_gpus(clean_env):
    _FakeNode.started = []
    clean_env.setattr(subprocess, "Popen", _FakeNode)
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7,1")
    launch_torchrun(["iterations=1"], nproc=2, nnodes=2, config=TINY, rdzv_port=29123)
    first, second = _FakeNode.started
    for node, group in enumerate((first, second)):
        assert "--nnodes=2" in group.cmd and "--nproc_per_node=2" in group.cmd
        assert "--rdzv-backend=c10d" in group.cmd and "--rdzv-endpoint=127.0.0.1:29123" in group.cmd
        assert f"--rdzv-conf=is_host={int(node == 0)}" in group.cmd
        assert "--standalone" not in group.cmd
        assert group.env["NCCL_NVLS_ENABLE"] == "0" and group.env["NVSHMEM_DISABLE_NVLS"] == "1"
    [rdzv_id] = {arg for arg in first.cmd if arg.startswith("--rdzv-id=")}
    assert rdzv_id in second.cmd
    assert first.env["CUDA_VISIBLE_DEVICES"] == "4,5" and second.env["CUDA_VISIBLE_DEVICES"] == "6,7"
    # Addresses sort in node order, which is how torchrun's c10d rendezvous assigns node ranks.
    addresses = [next(a for a in g.cmd if a.startswith("--local-addr=")) for g in (first, second)]
    assert addresses == sorted(addresses) and len(set(addresses)) == 2


@pytest.mark.parametrize(
    ("kwargs", "env", "needle"),
    [
        ({"nnodes": 0}, None, "nnodes must be a positive int"),
        ({"nnodes": 2, "nproc": True}, None, "nproc must be a positive int"),
        ({"nnodes": 2, "rdzv_port": 70000}, None, "rdzv_port"),
        ({"nnodes": 2}, "0,1,2", "CUDA_VISIBLE_DEVICES"),
    ],
)
def test_bad_launch_arguments_fail_before_starting_anything(clean_env, kwargs, env, needle):
    clean_env.setattr(subprocess, "Popen", None)  # starting a process would raise TypeError instead
    if env is not None:
        clean_env.setenv("CUDA_VISIBLE_DEVICES", env)
    arguments = {"nproc": 2, "config": TINY, **kwargs}
    with pytest.raises(ValueError, match=needle):
        launch_torchrun(["iterations=1"], **arguments)
