"""Shared-device mode (``runtime.share_device``, docs/operations.md "Shared-device mode"): the start-up
refusals, each naming the key and the numbers, the memory sum over the ranks, and the host staging every
gloo point-to-point transfer goes through (on CPU with host tensors; the CUDA round trip where a GPU is)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from digenrl.config import ConfigError, load_config
from digenrl.planning.shared_device import GIB, shared_device_estimates
from digenrl.runtime.comm.distributed import configured_backend, planned_device_type
from digenrl.runtime.comm.transfer import host_buffers, stage_to_host
from digenrl.validation import check_shared_device_memory, validate_config, validate_devices

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "experiments" / "configs" / "tiny.yaml"
SEPARATE = ["system=separate-sync", "pools.trainers=1", "pools.generators=1", "profile=h200-8"]


def test_sharing_with_nccl_is_refused_naming_both_keys():
    cfg = load_config(TINY, [*SEPARATE, "runtime.share_device=true", "runtime.backend=nccl"])
    with pytest.raises(ConfigError, match=r"runtime\.share_device=true with runtime\.backend='nccl'"):
        validate_config(cfg, world_size=2)


def test_sharing_needs_a_gpu_profile_and_a_gpu():
    with pytest.raises(
        ConfigError, match=r"runtime\.share_device=true .* is not read: .*GPU hardware profile"
    ):
        validate_config(load_config(TINY, ["runtime.share_device=true"]), world_size=2)  # profile cpu-2
    cfg = load_config(TINY, [*SEPARATE, "runtime.share_device=true"])
    validate_config(cfg, world_size=2)
    with pytest.raises(ConfigError, match=r"share_device=true .* no CUDA device"):
        validate_devices(cfg, 2, distributed=True, cuda_devices=0)


def test_two_ranks_on_one_gpu_without_the_mode_are_refused(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    cfg = load_config(TINY, SEPARATE)
    with pytest.raises(
        ConfigError, match=r"2 ranks on this node would share 1 GPU.*profile='h200-8'.*share_device"
    ):
        validate_devices(cfg, 2, distributed=True, cuda_devices=1)


def test_the_mode_runs_gloo_on_the_gpu():
    assert configured_backend(None, "nccl", share_device=True) == "gloo"
    assert configured_backend(None, "nccl", share_device=False) == "nccl"
    assert planned_device_type("gloo", distributed=True, cuda_available=True, share_device=True) == "cuda"
    assert planned_device_type("gloo", distributed=True, cuda_available=True) == "cpu"


def test_a_layout_that_does_not_fit_is_refused_naming_every_rank_and_its_estimate():
    cfg = load_config(
        TINY,
        [
            "system=digenrl",
            "pools.trainers=1",
            "pools.generators=2",
            "profile=h200-8",
            "runtime.share_device=true",
        ],
    )
    estimates, counted = shared_device_estimates(cfg, 3)
    assert [e.role for e in estimates] == ["trainer", "generator", "generator"]
    assert not counted  # no measured cost file for tiny-sd3 on an H200: activations not counted, and said
    total = sum(e.bytes for e in estimates)
    assert estimates[0].bytes > estimates[1].bytes > 0  # the trainer holds the adapter's training state
    check_shared_device_memory(cfg, 3, free_bytes=2 * total)  # fits
    with pytest.raises(ConfigError) as info:
        check_shared_device_memory(cfg, 3, free_bytes=total)  # 92 % of it is usable: does not fit
    message = str(info.value)
    for needle in (
        "runtime.share_device=true",
        "rank 0 (trainer)",
        "rank 1 (generator)",
        "rank 2 (generator)",
        f"{total / GIB:.1f} GiB together",
        "activations not counted",
    ):
        assert needle in message, (needle, message)


def test_host_staging_keeps_host_tensors_and_allocates_receive_buffers():
    tensors = [torch.arange(6, dtype=torch.float32).view(2, 3), torch.ones(4, dtype=torch.bfloat16)]
    staged = stage_to_host(tensors)
    assert all(s is t for s, t in zip(staged, tensors, strict=True))  # host tensors travel as they are
    buffers = host_buffers([([2, 3], torch.float32), ([0], torch.bool)], pin=False)
    assert [tuple(b.shape) for b in buffers] == [(2, 3), (0,)] and buffers[1].dtype == torch.bool
    assert all(b.device.type == "cpu" and not b.is_pinned() for b in buffers)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU side of host staging needs CUDA")
def test_gpu_tensors_stage_through_pinned_host_memory_exactly():
    t = torch.randn(3, 5, device="cuda").to(torch.bfloat16)
    (staged,) = stage_to_host([t])
    assert staged.device.type == "cpu" and staged.is_pinned() and torch.equal(staged, t.cpu())
    (buffer,) = host_buffers([([3, 5], torch.bfloat16)], pin=True)
    assert buffer.is_pinned()


def test_activations_are_priced_from_the_measured_cost_file_in_runtime_costs_dir():
    overrides = ["system=digenrl", "pools.trainers=1", "pools.generators=1", "runtime.share_device=true"]
    sd35 = REPO / "experiments" / "configs" / "sd35-medium-lora.yaml"
    costs = f"runtime.costs_dir={REPO / 'experiments' / 'results' / 'costs'}"
    estimates, counted = shared_device_estimates(load_config(sd35, [*overrides, "profile=h200-8", costs]), 2)
    assert counted and all(e.parts["activations"] > 0 for e in estimates)
    assert all(e.parts["model"] > 14 * GIB for e in estimates)  # SD3.5-medium's bundle in bf16: 14.7 GiB


def test_a_scorer_rank_on_a_gpu_builds_its_weight_sync_without_joining_the_sync_group():
    """A scorer rank holds no sync-group handle; on a GPU (shared-device mode) it must still build."""
    from digenrl.config import SyncConfig
    from digenrl.runtime.comm.weight_sync import WeightSync
    from digenrl.runtime.launch.layout import Layout, ProcessGroups

    layout = Layout("separate", 3, (0,), (1,), (2,))
    sync = WeightSync(
        SyncConfig(),
        layout=layout,
        groups=ProcessGroups(layout, 2),
        device=torch.device("cuda", 0),
        mode="lora",
    )
    assert sync.role == "scorer" and not sync._pin
