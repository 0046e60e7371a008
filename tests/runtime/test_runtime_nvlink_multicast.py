"""NVLink multicast is off by default everywhere the project starts NCCL, and an exported value wins."""

from __future__ import annotations

import os
import subprocess

import pytest

from digenrl.launch import launch_torchrun
from digenrl.runtime.comm.distributed import (
    NVLINK_MULTICAST_OFF,
    disable_nvlink_multicast,
    init_distributed,
    shutdown_distributed,
)

OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@pytest.fixture
def unset(monkeypatch):
    """The three variables absent, and restored to their previous state (absent or not) afterwards."""
    for name in OFF:
        monkeypatch.setenv(name, "placeholder")  # records the original state for teardown
        monkeypatch.delenv(name)
    return monkeypatch


def test_the_three_switches_and_their_off_values():
    assert dict(NVLINK_MULTICAST_OFF) == OFF


def test_sets_every_missing_variable_of_a_given_mapping():
    env = {"PATH": "/bin"}
    assert disable_nvlink_multicast(env) == OFF
    assert env == {"PATH": "/bin", **OFF}


def test_an_exported_value_is_kept():
    env = {"NCCL_NVLS_ENABLE": "1", "NVSHMEM_DISABLE_NVLS": ""}
    in_force = disable_nvlink_multicast(env)
    assert env["NCCL_NVLS_ENABLE"] == "1" and env["NVSHMEM_DISABLE_NVLS"] == ""
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert in_force == env


def test_default_target_is_this_process_environment(unset):
    unset.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "0")
    disable_nvlink_multicast()
    assert os.environ["NCCL_NVLS_ENABLE"] == "0" and os.environ["NVSHMEM_DISABLE_NVLS"] == "1"
    assert os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "0"


def test_init_distributed_applies_it_before_any_process_group(unset):
    """So ``torchrun experiments/run_*.py`` without a wrapper script also runs with multicast off."""
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "LOCAL_RANK"):
        unset.delenv(name, raising=False)
    init_distributed()
    shutdown_distributed()
    assert {name: os.environ[name] for name in OFF} == OFF


def test_launch_torchrun_passes_it_to_its_children_and_keeps_one_node_standalone(unset):
    seen = {}

    class FakeTorchrun:
        """Records the command line and environment; a torchrun that exits 0 at once."""

        pid, returncode = 0, 0

        def __init__(self, cmd, *, env, **_kwargs):
            seen.update(cmd=cmd, env=env)

        def communicate(self, timeout=None):
            return "", ""

        def poll(self):
            return 0

    unset.setattr(subprocess, "Popen", FakeTorchrun)
    unset.setenv("NCCL_NVLS_ENABLE", "1")  # exported by the caller: wins
    launch_torchrun(["iterations=1"], nproc=3, config="experiments/configs/tiny.yaml")
    assert seen["env"]["NCCL_NVLS_ENABLE"] == "1"
    assert seen["env"]["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert seen["env"]["NVSHMEM_DISABLE_NVLS"] == "1"
    assert seen["cmd"][3:5] == ["--standalone", "--nproc_per_node=3"]
    assert seen["cmd"][5:7] == ["-m", "digenrl.launch"]  # the package's module, not a file of the checkout
