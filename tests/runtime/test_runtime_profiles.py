"""Hardware profiles: every shipped profile loads, has the documented size, and bad input names its key."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import yaml

import digenrl
from digenrl.runtime.hardware.profiles import (
    PROFILE_DIR,
    available_profiles,
    load_profile,
    profile_from_dict,
)

EXPECTED = {
    # name: (backend, world size, nodes, device type of each node in order)
    "cpu-1": ("gloo", 1, 1, ["cpu-worker"]),
    "cpu-2": ("gloo", 2, 1, ["cpu-worker"]),
    "cpu-4": ("gloo", 4, 1, ["cpu-worker"]),
    "cpu-2-hetero": ("gloo", 2, 2, ["cpu-fast", "cpu-slow"]),
    "cpu-4-2node": ("gloo", 4, 2, ["cpu-worker"] * 2),
    "h100-1": ("nccl", 1, 1, ["h100"]),
    "h100-8": ("nccl", 8, 1, ["h100"]),
    "h200-1": ("nccl", 1, 1, ["h200"]),
    "h200-8": ("nccl", 8, 1, ["h200"]),
    "a100-16": ("nccl", 16, 2, ["a100"] * 2),
    "h800-32": ("nccl", 32, 4, ["h800"] * 4),
    "hetero-h100-a100-16": ("nccl", 16, 2, ["h100", "a100"]),
    "hetero-h100-h200-16": ("nccl", 16, 2, ["h100", "h200"]),
}


def test_available_profiles_lists_every_shipped_profile():
    assert set(available_profiles()) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_profile_sizes_and_rank_placement(name):
    backend, world_size, num_nodes, node_types = EXPECTED[name]
    profile = load_profile(name)
    assert profile.name == name
    assert profile.backend == backend
    assert profile.world_size == world_size
    assert profile.num_nodes == num_nodes
    # Independent reference: ranks fill node 0 first, then node 1, ... (torchrun's default placement).
    per_node = world_size // num_nodes
    for rank in range(world_size):
        assert profile.node_of(rank) == rank // per_node
        assert profile.local_rank_of(rank) == rank % per_node
        assert profile.device_type(rank).name == node_types[rank // per_node]
        assert rank in profile.ranks_of_node(rank // per_node)
    with pytest.raises(ValueError, match="rank must be an int"):
        profile.device_type(world_size)
    profile.check_world_size(world_size)
    with pytest.raises(ValueError, match="does not match hardware profile"):
        profile.check_world_size(world_size + 1)


def test_gpu_profiles_use_spec_sheet_numbers():
    h200 = load_profile("h200-8").gpu_types["h200"]
    assert h200.relative_speed == 1.0
    assert h200.bf16_tflops == 989.0 and h200.hbm_gbps == 4800.0
    assert h200.measured_bf16_tflops is not None and h200.measured_bf16_tflops < h200.bf16_tflops
    assert load_profile("a100-16").gpu_types["a100"].bf16_tflops == 312.0
    assert load_profile("h800-32").links.intra_node_gbps == 200.0  # 400 GB/s bidirectional, per direction
    for name in EXPECTED:
        text = (PROFILE_DIR / f"{name}.yaml").read_text()
        if load_profile(name).backend == "nccl":
            assert "spec sheet" in text, name  # each stated number says where it comes from
    # the H100 profiles' device numbers were measured on an H100 (measure.py device, h100-refresh/)
    h100 = load_profile("h100-1").gpu_types["h100"]
    assert h100.measured_bf16_tflops == 782.0 and h100.memory_gib == 79.2
    assert "measured: torch total_memory" in (PROFILE_DIR / "h100-1.yaml").read_text()


def test_hetero_links_follow_the_node():
    profile = load_profile("hetero-h100-a100-16")
    assert profile.link_gbps(0, 7) == 450.0  # both on the H100 node: NVLink 4
    assert profile.link_gbps(8, 15) == 300.0  # both on the A100 node: NVLink 3
    assert profile.link_gbps(3, 12) == profile.links.inter_node_gbps
    assert profile.device_type(3).relative_speed > profile.device_type(12).relative_speed


def test_load_profile_by_path(tmp_path):
    raw = yaml.safe_load((PROFILE_DIR / "cpu-2.yaml").read_text())
    workers = random.randint(1, 6)
    raw["name"] = "custom"
    raw["nodes"][0]["workers_per_node"] = workers
    path = tmp_path / "custom.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert load_profile(path).world_size == workers
    assert load_profile(str(path)).world_size == workers


def test_unknown_profile_lists_allowed():
    with pytest.raises(ValueError) as info:
        load_profile("h300-64")
    message = str(info.value)
    assert "h300-64" in message
    for name in EXPECTED:
        assert name in message


def _base() -> dict:
    return copy.deepcopy(yaml.safe_load((PROFILE_DIR / "hetero-h100-a100-16.yaml").read_text()))


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("nodes", 1, "gpus_per_node"), 0, r"profile\.nodes\[1\]\.gpus_per_node must be a positive int"),
        (("nodes", 1, "gpus_per_node"), True, r"profile\.nodes\[1\]\.gpus_per_node must be a positive int"),
        (("nodes", 0, "count"), 1.5, r"profile\.nodes\[0\]\.count must be a positive int"),
        (("nodes", 0, "gpu"), "b200", r"profile\.nodes\[0\]\.gpu 'b200' is not in profile\.gpu_types"),
        (("nodes", 0, "workers_per_node"), 8, r"profile\.nodes\[0\] must set exactly one of"),
        (("nodes", 0, "gpus_per_node"), _DELETE, r"profile\.nodes\[0\] must set exactly one of"),
        (("backend",), "mpi", r"profile\.backend must be one of \['gloo', 'nccl'\]"),
        (("gpu_types", "a100", "memory_gib"), -1, r"profile\.gpu_types\.a100\.memory_gib must be a positive"),
        (
            ("gpu_types", "h100", "hbm_gbps"),
            _DELETE,
            r"profile\.gpu_types\.h100\.hbm_gbps must be a positive",
        ),
        (("links", "inter_node_gbps"), "fast", r"profile\.links\.inter_node_gbps must be a positive number"),
        (("nodez",), [], r"profile has unknown key\(s\) \['nodez'\]"),
        (("nodes",), [], r"profile\.nodes must be a non-empty list"),
        (("name",), _DELETE, r"profile\.name must be a non-empty string"),
    ],
)
def test_validation_errors_name_the_key(path, value, expected):
    raw = _base()
    profile_from_dict(raw)  # the unmodified profile is valid
    parent = raw
    for part in path[:-1]:
        parent = parent[part]
    if value is _DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    with pytest.raises(ValueError, match=expected):
        profile_from_dict(raw)


def test_profiles_ship_with_the_package():
    """The profiles are package data (an installed package finds them), not a folder of the checkout."""
    package = Path(digenrl.__file__).resolve().parent
    assert PROFILE_DIR.is_relative_to(package) and sorted(EXPECTED) == available_profiles()
    assert '"hardware_profiles/*.yaml"' in (package.parent / "setup.py").read_text()
