"""Hardware profiles: a typed, validated description of a testbed.

Design: docs/design.md §2, "Hardware profile and pool sizes".

A profile says how many nodes there are, how many devices each node holds, what kind of device each is
(relative speed, memory, peak bf16 TFLOP/s, HBM bandwidth) and how fast the links are. The planner and the
discrete-event simulator read it to size pools and predict step times; the launcher reads it to check that
``torchrun`` started the expected number of ranks. The YAML schema is documented in
``digenrl/runtime/hardware/hardware_profiles/README.md`` (the profiles ship with the package).

Units: TFLOP/s for compute, GB/s (gigaBYTES per second, 1e9 B/s) for every bandwidth, GiB for memory.
Ranks are assigned node by node in the order the ``nodes`` list is written (torchrun's default: node n
holds global ranks ``[n * nproc_per_node, (n + 1) * nproc_per_node)``).
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from digenrl.config import RUNTIME_BACKENDS, read_yaml

#: The shipped profiles: package data next to this module (setup.py ``package_data``), so an installed
#: package finds them as a checkout does.
PROFILE_DIR = Path(__file__).resolve().with_name("hardware_profiles")

_TOP_LEVEL_KEYS = ("name", "description", "backend", "nodes", "gpu_types", "links")
_NODE_KEYS = ("count", "gpus_per_node", "workers_per_node", "gpu", "intra_node_gbps")
_GPU_TYPE_KEYS = ("relative_speed", "memory_gib", "bf16_tflops", "hbm_gbps", "measured_bf16_tflops")
_LINK_KEYS = ("intra_node_gbps", "inter_node_gbps", "host_device_gbps")


@dataclass(frozen=True)
class GpuType:
    """One kind of device. ``relative_speed`` is throughput relative to an H200 (= 1.0) for the planner."""

    name: str
    relative_speed: float
    memory_gib: float
    bf16_tflops: float
    hbm_gbps: float
    measured_bf16_tflops: float | None = None


@dataclass(frozen=True)
class NodeGroup:
    """``count`` identical nodes, each with ``devices_per_node`` devices of type ``gpu``.

    ``intra_node_gbps`` overrides the profile-wide intra-node link for these nodes (heterogeneous
    clusters mix NVLink generations); None means "use ``Links.intra_node_gbps``".
    """

    count: int
    devices_per_node: int
    gpu: str
    intra_node_gbps: float | None = None


@dataclass(frozen=True)
class Links:
    """Link bandwidths in GB/s, as written in the profile (see the YAML comments for direction)."""

    intra_node_gbps: float
    inter_node_gbps: float
    host_device_gbps: float


@dataclass(frozen=True)
class HardwareProfile:
    """A validated testbed description. Build it with ``load_profile`` or ``profile_from_dict``."""

    name: str
    description: str
    backend: str
    nodes: tuple[NodeGroup, ...]
    gpu_types: Mapping[str, GpuType]
    links: Links

    @property
    def world_size(self) -> int:
        """Total number of devices (= torchrun ranks, one process per device)."""
        return sum(group.count * group.devices_per_node for group in self.nodes)

    @property
    def num_nodes(self) -> int:
        return sum(group.count for group in self.nodes)

    def _locate(self, rank: int) -> tuple[int, int, NodeGroup]:
        """(global node index, local rank, node group) of ``rank``; ranks fill node 0 first."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(
                f"rank must be an int in [0, {self.world_size}) for profile '{self.name}', got {rank!r}"
            )
        node_index = 0
        remaining = rank
        for group in self.nodes:
            group_ranks = group.count * group.devices_per_node
            if remaining < group_ranks:
                node_in_group, local_rank = divmod(remaining, group.devices_per_node)
                return node_index + node_in_group, local_rank, group
            remaining -= group_ranks
            node_index += group.count
        raise AssertionError("unreachable: rank was range-checked against world_size")

    def device_type(self, rank: int) -> GpuType:
        """The device kind global ``rank`` runs on."""
        return self.gpu_types[self._locate(rank)[2].gpu]

    @property
    def relative_speeds(self) -> tuple[float, ...]:
        """Every rank's ``relative_speed``, in rank order (what ``colocated.split=speed`` shares by)."""
        return tuple(self.device_type(r).relative_speed for r in range(self.world_size))

    def node_of(self, rank: int) -> int:
        """Global node index (0-based, in profile order) holding ``rank``."""
        return self._locate(rank)[0]

    def local_rank_of(self, rank: int) -> int:
        return self._locate(rank)[1]

    def ranks_of_node(self, node: int) -> tuple[int, ...]:
        """Global ranks on node ``node``."""
        if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < self.num_nodes:
            raise ValueError(f"node must be an int in [0, {self.num_nodes}), got {node!r}")
        first = 0
        node_index = 0
        for group in self.nodes:
            if node < node_index + group.count:
                start = first + (node - node_index) * group.devices_per_node
                return tuple(range(start, start + group.devices_per_node))
            first += group.count * group.devices_per_node
            node_index += group.count
        raise AssertionError("unreachable: node was range-checked against num_nodes")

    def link_gbps(self, rank_a: int, rank_b: int) -> float:
        """Point-to-point bandwidth (GB/s) between two ranks: the node's intra link or the network."""
        node_a, _, group_a = self._locate(rank_a)
        node_b, _, _ = self._locate(rank_b)
        if node_a != node_b:
            return self.links.inter_node_gbps
        if group_a.intra_node_gbps is not None:
            return group_a.intra_node_gbps
        return self.links.intra_node_gbps

    def check_world_size(self, world_size: int) -> None:
        """Raise if the launched world does not match the profile (a mis-set --nproc_per_node)."""
        if world_size != self.world_size:
            raise ValueError(
                f"world_size {world_size} does not match hardware profile '{self.name}', which describes "
                f"{self.world_size} devices ({self.num_nodes} nodes)"
            )


# ----------------------------------------------------------------------------------------------- loading


#: ``profile=auto``: the profile of the devices this node has (:func:`auto_profile`)
AUTO = "auto"


def available_profiles() -> list[str]:
    """Names of the shipped profiles (:data:`PROFILE_DIR` file stems), sorted; ``auto`` is not a file."""
    if not PROFILE_DIR.is_dir():
        return []
    return sorted(path.stem for path in PROFILE_DIR.glob("*.yaml"))


def is_profile_path(name_or_path: str | Path) -> bool:
    """Whether ``profile`` names a YAML file rather than a shipped profile."""
    path = Path(name_or_path)
    return isinstance(name_or_path, Path) or path.suffix in (".yaml", ".yml") or len(path.parts) > 1


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """Load a profile by name (``<PROFILE_DIR>/<name>.yaml``), from an explicit YAML path, or ``auto``: the
    devices this node has (:func:`auto_profile` of :func:`detect_node`)."""
    if str(name_or_path) == AUTO:
        return auto_profile(detect_node())
    path = Path(name_or_path)
    is_path = is_profile_path(name_or_path)
    if is_path:
        if not path.is_file():
            raise ValueError(f"hardware profile file '{path}' does not exist")
    else:
        path = PROFILE_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            raise ValueError(
                f"unknown hardware profile '{name_or_path}'; allowed: {', '.join(available_profiles())} "
                f"(or a path to a .yaml file)"
            )
    raw = read_yaml(path, "hardware profile", "profile")
    profile = profile_from_dict(raw, source=str(path))
    if not is_path and profile.name != str(name_or_path):
        raise ValueError(f"profile.name '{profile.name}' in {path} must equal its file name '{path.stem}'")
    return profile


def profile_from_dict(raw: Any, source: str = "<dict>") -> HardwareProfile:
    """Validate a parsed YAML mapping; errors name the offending key, e.g. ``profile.nodes[1].gpu``."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"hardware profile {source} must be a mapping with keys {list(_TOP_LEVEL_KEYS)}")
    _reject_unknown(raw, _TOP_LEVEL_KEYS, "profile")
    name = _required_str(raw, "name", "profile")
    description = str(raw.get("description", ""))
    backend = _required_str(raw, "backend", "profile")
    if backend not in RUNTIME_BACKENDS:
        raise ValueError(f"profile.backend must be one of {list(RUNTIME_BACKENDS)}, got {backend!r}")

    raw_types = raw.get("gpu_types")
    if not isinstance(raw_types, Mapping) or not raw_types:
        raise ValueError("profile.gpu_types must be a non-empty mapping of device type name -> properties")
    gpu_types = {str(type_name): _gpu_type(str(type_name), spec) for type_name, spec in raw_types.items()}

    raw_nodes = raw.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise ValueError("profile.nodes must be a non-empty list of {count, gpus_per_node, gpu}")
    nodes = tuple(_node_group(index, spec, gpu_types) for index, spec in enumerate(raw_nodes))

    raw_links = raw.get("links")
    if not isinstance(raw_links, Mapping):
        raise ValueError(f"profile.links must be a mapping with keys {list(_LINK_KEYS)}")
    _reject_unknown(raw_links, _LINK_KEYS, "profile.links")
    links = Links(**{key: _positive_float(raw_links, key, "profile.links") for key in _LINK_KEYS})
    return HardwareProfile(name, description, backend, nodes, gpu_types, links)


def profile_to_dict(profile: HardwareProfile) -> dict[str, Any]:
    """``profile`` in the YAML schema :func:`profile_from_dict` reads (its exact inverse): how a run records
    the profile ``auto`` resolved to (``out_dir/profile.yaml``, digenrl/trainer/run_dir.py), so the
    simulator's validation of the run prices the run's devices, not the validating machine's."""
    workers = profile.backend == "gloo"
    nodes = []
    for group in profile.nodes:
        node: dict[str, Any] = {"count": group.count, "gpu": group.gpu}
        node["workers_per_node" if workers else "gpus_per_node"] = group.devices_per_node
        if group.intra_node_gbps is not None:
            node["intra_node_gbps"] = group.intra_node_gbps
        nodes.append(node)
    types = {}
    for name, gpu in profile.gpu_types.items():
        spec = {k: getattr(gpu, k) for k in _GPU_TYPE_KEYS}
        if spec["measured_bf16_tflops"] is None:
            del spec["measured_bf16_tflops"]
        types[name] = spec
    return {
        "name": profile.name,
        "description": profile.description,
        "backend": profile.backend,
        "nodes": nodes,
        "gpu_types": types,
        "links": {k: getattr(profile.links, k) for k in _LINK_KEYS},
    }


def _gpu_type(type_name: str, spec: Any) -> GpuType:
    where = f"profile.gpu_types.{type_name}"
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where} must be a mapping with keys {list(_GPU_TYPE_KEYS)}")
    _reject_unknown(spec, _GPU_TYPE_KEYS, where)
    measured = None
    if spec.get("measured_bf16_tflops") is not None:
        measured = _positive_float(spec, "measured_bf16_tflops", where)
    return GpuType(
        name=type_name,
        relative_speed=_positive_float(spec, "relative_speed", where),
        memory_gib=_positive_float(spec, "memory_gib", where),
        bf16_tflops=_positive_float(spec, "bf16_tflops", where),
        hbm_gbps=_positive_float(spec, "hbm_gbps", where),
        measured_bf16_tflops=measured,
    )


def _node_group(index: int, spec: Any, gpu_types: Mapping[str, GpuType]) -> NodeGroup:
    where = f"profile.nodes[{index}]"
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where} must be a mapping with keys count, gpus_per_node|workers_per_node, gpu")
    _reject_unknown(spec, _NODE_KEYS, where)
    has_gpus, has_workers = "gpus_per_node" in spec, "workers_per_node" in spec
    if has_gpus == has_workers:
        raise ValueError(f"{where} must set exactly one of gpus_per_node (GPUs) or workers_per_node (CPU)")
    per_node_key = "gpus_per_node" if has_gpus else "workers_per_node"
    gpu = _required_str(spec, "gpu", where)
    if gpu not in gpu_types:
        raise ValueError(f"{where}.gpu '{gpu}' is not in profile.gpu_types; allowed: {sorted(gpu_types)}")
    intra = None
    if spec.get("intra_node_gbps") is not None:
        intra = _positive_float(spec, "intra_node_gbps", where)
    return NodeGroup(
        count=_positive_int(spec, "count", where),
        devices_per_node=_positive_int(spec, per_node_key, where),
        gpu=gpu,
        intra_node_gbps=intra,
    )


def _reject_unknown(mapping: Mapping, allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(str(key) for key in mapping if key not in allowed)
    if unknown:
        raise ValueError(f"{where} has unknown key(s) {unknown}; allowed: {list(allowed)}")


def _required_str(mapping: Mapping, key: str, where: str) -> str:
    value = mapping.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}.{key} must be a non-empty string, got {value!r}")
    return value


def _positive_int(mapping: Mapping, key: str, where: str) -> int:
    value = mapping.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{where}.{key} must be a positive int, got {value!r}")
    return value


def _positive_float(mapping: Mapping, key: str, where: str) -> float:
    value = mapping.get(key)
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if not is_number or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{where}.{key} must be a positive number, got {value!r}")
    return float(value)


# ------------------------------------------------------------------------------- the real devices
#
# A profile describes devices by type name (``h200``, ``h100``, ``cpu-worker``); a run checks at start-up that
# each rank's real device is of its type (digenrl/validation.py ``check_profile_device``): an H100 run priced
# with an H200's matmul ceiling and memory reports wrong bounds, memory checks and plans. Every computing
# process reads its own device before any process group exists (:func:`detect_device`); torch is imported
# only there, so planning with a named profile needs no torch.

#: A GPU's family in its name: letters then digits (H100, H200, A100, H800, L40S, B200, RTX 4090)
_FAMILY = re.compile(r"\b([A-Z]{1,3})[ -]?(\d{2,4})([A-Z]?)\b")
#: Memory of the same family differs by board (H100 80 GB SXM / 94 GB NVL): more than this apart is another
#: device than the profile describes
MEMORY_TOLERANCE = 0.10


@dataclass(frozen=True)
class DetectedDevice:
    """A real device: ``name`` as the driver reports it ("NVIDIA H100 80GB HBM3", "cpu"), its memory (GiB;
    None on a CPU) and how many of them this node has (for ``profile=auto``: ranks on a CPU)."""

    name: str
    memory_gib: float | None = None
    count: int = 1

    @property
    def family(self) -> str:
        return device_family(self.name)


def device_family(device_name: str) -> str:
    """``h100`` for "NVIDIA H100 80GB HBM3", ``a100`` for "NVIDIA A100-SXM4-80GB", ``cpu`` for a CPU; else
    the name in lower-case letters and digits."""
    if device_name.lower().startswith("cpu"):
        return "cpu"
    match = _FAMILY.search(device_name.upper().replace("NVIDIA", " "))
    if match:
        return "".join(match.groups()).lower()
    return re.sub(r"[^a-z0-9]", "", device_name.lower())


def type_matches(type_name: str, family: str) -> bool:
    """Whether a profile's device type (``h100``, ``h100-sxm``, ``cpu-worker``) is of device ``family``."""
    name = type_name.lower()
    if family == "cpu":
        return name.startswith("cpu")
    # the family as a word of the type name: h100-sxm and nvidia_h100 are h100s, h200 is not an h20
    return re.search(rf"(?<![a-z0-9]){re.escape(family)}(?![0-9])", name) is not None


def device_mismatch(profile: HardwareProfile, rank: int, device: DetectedDevice) -> str | None:
    """Why ``device`` is not what ``profile`` says rank ``rank`` runs on (None: it is): another family, or
    GPU memory more than :data:`MEMORY_TOLERANCE` away from the profile's."""
    declared = profile.device_type(rank)
    if not type_matches(declared.name, device.family):
        what = "the CPU" if device.family == "cpu" else f"a {device.name}"
        return (
            f"profile={profile.name!r} says rank {rank} runs on a {declared.name} "
            f"({declared.memory_gib:g} GiB), but it runs on {what}"
        )
    gpu_memory = device.memory_gib if device.family != "cpu" else None
    tolerance = MEMORY_TOLERANCE * declared.memory_gib
    if gpu_memory is not None and abs(gpu_memory - declared.memory_gib) > tolerance:
        return (
            f"profile={profile.name!r} says rank {rank} runs on a {declared.name} with "
            f"{declared.memory_gib:g} GiB, but its {device.name} has {gpu_memory:.1f} GiB"
        )
    return None


@functools.cache
def shipped_profiles() -> tuple[tuple[str, HardwareProfile], ...]:
    """Every shipped profile, loaded once per process (package data does not change while it runs;
    ``profile=auto`` and the mismatch check look through them)."""
    return tuple((name, load_profile(name)) for name in available_profiles())


def matching_profiles(device: DetectedDevice, world_size: int) -> list[str]:
    """The shipped profiles of ``world_size`` devices, all of ``device``'s family (a mismatch's fix)."""
    out = []
    for name, profile in shipped_profiles():
        if profile.world_size == world_size and all(
            type_matches(profile.device_type(r).name, device.family) for r in range(world_size)
        ):
            out.append(name)
    return out


def known_device_type(family: str) -> tuple[GpuType, Links, str] | None:
    """The device type of ``family`` as a shipped profile describes it, with that profile's links and
    name; one with a measured matmul ceiling first (what a run's fraction of bound needs), then one-node
    profiles, then by name."""
    found = []
    for name, profile in shipped_profiles():
        for gpu in profile.gpu_types.values():
            if type_matches(gpu.name, family):
                unmeasured = gpu.measured_bf16_tflops is None
                # the link of this type's own nodes, where the profile gives its node group one
                intra = [g.intra_node_gbps for g in profile.nodes if g.gpu == gpu.name and g.intra_node_gbps]
                links = profile.links
                if intra:
                    links = Links(intra[0], links.inter_node_gbps, links.host_device_gbps)
                found.append((unmeasured, profile.num_nodes, name, gpu, links))
    if not found:
        return None
    _, _, name, gpu, links = min(found, key=lambda item: item[:3])
    return gpu, links, name


def auto_profile(device: DetectedDevice) -> HardwareProfile:
    """``profile=auto``: one node of ``device.count`` devices of ``device``'s kind, their numbers (speed,
    ceiling, links) from the shipped profile that describes that kind (:func:`known_device_type`) and the
    memory as detected. Under torchrun the node must be the whole job: a multi-node or mixed cluster needs
    an explicit profile."""
    world, local = os.environ.get("WORLD_SIZE"), os.environ.get("LOCAL_WORLD_SIZE")
    if world is not None and local is not None and world != local:
        raise ValueError(
            f"profile=auto describes one node, but this job has {world} ranks of which {local} on this "
            "node; a multi-node job needs an explicit profile "
            "(digenrl/runtime/hardware/hardware_profiles/README.md)"
        )
    known = known_device_type(device.family)
    if known is None:
        raise ValueError(
            f"profile=auto: no shipped profile describes a {device.name!r} (family {device.family!r}); "
            "write one for it (digenrl/runtime/hardware/hardware_profiles/README.md) and pass profile=PATH"
        )
    gpu, links, source = known
    cpu = device.family == "cpu"
    if not cpu and device.memory_gib is not None:
        gpu = GpuType(**{**gpu.__dict__, "memory_gib": round(device.memory_gib, 1)})
    return HardwareProfile(
        name=AUTO,
        description=f"{device.count} x {device.name} (detected; numbers of profile {source})",
        backend="gloo" if cpu else "nccl",
        nodes=(NodeGroup(count=1, devices_per_node=device.count, gpu=gpu.name),),
        gpu_types={gpu.name: gpu},
        links=links,
    )


#: CPU ranks of ``profile=auto`` when torchrun does not say (WORLD_SIZE): a launcher sets it to the ranks
#: it starts (digenrl/launch.py), so every process of the job builds the same profile
AUTO_WORKERS_ENV = "DIGENRL_AUTO_WORKERS"


def detect_device(device_type: str, index: int = 0) -> DetectedDevice:
    """The device a process computes on: ``cuda`` device ``index``, or the CPU."""
    if device_type != "cuda":
        return DetectedDevice(name="cpu")
    import torch

    props = torch.cuda.get_device_properties(index)
    return DetectedDevice(name=props.name, memory_gib=props.total_memory / 2**30)


def detect_node() -> DetectedDevice:
    """This node's devices for ``profile=auto``: its GPUs (all alike: a mixed node needs an explicit
    profile), else CPU ranks — as many as the job runs (``WORLD_SIZE`` under torchrun, else
    :data:`AUTO_WORKERS_ENV`, else 1)."""
    import torch

    ranks = os.environ.get("WORLD_SIZE") or os.environ.get(AUTO_WORKERS_ENV)
    gpus = torch.cuda.device_count()
    if gpus == 0:
        return DetectedDevice(name="cpu", count=int(ranks or 1))
    devices = [detect_device("cuda", i) for i in range(gpus)]
    names = sorted({d.name for d in devices})
    if len(names) > 1:
        raise ValueError(
            f"profile=auto needs one kind of GPU on the node, found {names}; write a profile for this node "
            "(digenrl/runtime/hardware/hardware_profiles/README.md) and pass profile=PATH"
        )
    first = devices[0]
    return DetectedDevice(name=first.name, memory_gib=first.memory_gib, count=int(ranks or gpus))
