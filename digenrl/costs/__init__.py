"""Per-operation costs as data (docs/design.md §5, "Simulator and planner"): the :class:`CostModel` of one
model on one device type and its files (:mod:`~digenrl.costs.cost_model`), which cost model each rank of
a profile uses (:mod:`~digenrl.costs.device_costs`), carrying measured files where nothing measured
(:mod:`~digenrl.costs.extrapolation`) and which points are stale (:mod:`~digenrl.costs.audit`). Measuring
a cost file times the real components and lives with the benchmarks (:mod:`digenrl.perf.measure_costs`,
:mod:`digenrl.perf.emit_costs`)."""

from digenrl.costs.cost_model import CostModel, cost_path, load_costs
from digenrl.costs.device_costs import DeviceCosts

__all__ = ["CostModel", "DeviceCosts", "cost_path", "load_costs"]
