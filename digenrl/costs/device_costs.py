"""Which :class:`CostModel` each rank of a (possibly heterogeneous) hardware profile runs with.

Resolution per device type of the profile, in order (the profiles README: "the simulator should prefer
measured per-step costs whenever it has them"):

1. a cost model given for that type name (a per-type cost file, measured or extrapolated);
2. otherwise the *reference* cost model scaled to the type, either by ``relative_speed`` ratio (default;
   every time × speed_ref / speed_type — the profile's own throughput estimate, the number the planner
   balances work with) or by the spec-sheet rule of :meth:`CostModel.scale_to` (``scaling="spec"``).

The reference is the cost model given for ``reference_type``; with a single cost model and a
single-type profile it is simply used for every rank (a CPU file measured as ``cpu`` runs the
``cpu-worker`` profiles unchanged).
"""

from __future__ import annotations

from collections.abc import Mapping

from digenrl.costs.cost_model import CostModel
from digenrl.runtime.hardware.profiles import HardwareProfile

SCALINGS = ("relative_speed", "spec")


class DeviceCosts:
    """Per-rank cost lookup. Build once per simulation; :meth:`for_rank` is a dict lookup."""

    def __init__(
        self,
        profile: HardwareProfile,
        costs: CostModel | Mapping[str, CostModel],
        *,
        reference_type: str | None = None,
        scaling: str = "relative_speed",
    ) -> None:
        if scaling not in SCALINGS:
            raise ValueError(f"scaling={scaling!r} is not allowed; choose one of: {', '.join(SCALINGS)}")
        self.profile = profile
        used_types = sorted({profile.device_type(r).name for r in range(profile.world_size)})
        given: dict[str, CostModel]
        if isinstance(costs, CostModel):
            if len(used_types) == 1 and reference_type is None:
                given = {used_types[0]: costs}
            else:
                ref = reference_type or costs.device
                if ref not in profile.gpu_types:
                    raise ValueError(
                        f"profile '{profile.name}' mixes device types {used_types}: pass reference_type= "
                        f"(one of {sorted(profile.gpu_types)}) naming the device the cost model "
                        f"'{costs.device}-{costs.model}' was measured on, or one cost model per type"
                    )
                given = {ref: costs}
        elif isinstance(costs, Mapping) and costs:
            unknown = sorted(set(costs) - set(profile.gpu_types))
            if unknown:
                raise ValueError(
                    f"cost models given for unknown device type(s) {unknown}; profile '{profile.name}' "
                    f"has {sorted(profile.gpu_types)}"
                )
            given = dict(costs)
        else:
            raise ValueError("costs must be a CostModel or a non-empty mapping {device type: CostModel}")
        if reference_type is not None and reference_type not in given:
            raise ValueError(f"reference_type={reference_type!r} has no cost model; given: {sorted(given)}")
        reference = reference_type or sorted(given)[0]
        self.by_type: dict[str, CostModel] = {}
        for name in used_types:
            if name in given:
                self.by_type[name] = given[name]
                continue
            target, origin = profile.gpu_types[name], profile.gpu_types[reference]
            base = given[reference]
            if scaling == "spec":
                self.by_type[name] = base.scale_to(target, origin)
            else:
                factor = origin.relative_speed / target.relative_speed
                self.by_type[name] = base.scaled(factor, factor, name)
        self._by_rank = [self.by_type[profile.device_type(r).name] for r in range(profile.world_size)]

    def for_rank(self, rank: int) -> CostModel:
        if not 0 <= rank < len(self._by_rank):
            raise ValueError(f"rank must be in [0, {len(self._by_rank)}), got {rank}")
        return self._by_rank[rank]

    def for_type(self, type_name: str) -> CostModel:
        if type_name not in self.by_type:
            raise ValueError(f"device type {type_name!r} not in profile; have {sorted(self.by_type)}")
        return self.by_type[type_name]
