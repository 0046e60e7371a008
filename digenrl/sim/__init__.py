"""Cost model, discrete-event simulator and planner (docs/design.md §5, "Simulator and planner").

Import-light on purpose (no torch): the planner runs before any model is built, and the TSP runtime
imports :mod:`digenrl.sim.stage_plan`. Measuring a cost model imports torch lazily
(:func:`digenrl.sim.costs.measure_costs` → :mod:`digenrl.sim.measure`).
"""

from digenrl.sim.costs import CostModel, cost_path, load_costs, measure_costs
from digenrl.sim.device_costs import DeviceCosts
from digenrl.sim.planner import PlannerResult, PlanScore, predict_baselines, search_plans
from digenrl.sim.schedule_plan import SYSTEMS, SchedulePlan
from digenrl.sim.simulator import SimResult, compute_seconds, simulate
from digenrl.sim.validation import simulation_error, steady_state
from digenrl.sim.workload import Workload
from digenrl.tsp.stage_plan import StagePlan, plan_stages

__all__ = [
    "SYSTEMS",
    "CostModel",
    "DeviceCosts",
    "PlanScore",
    "PlannerResult",
    "SchedulePlan",
    "SimResult",
    "StagePlan",
    "Workload",
    "compute_seconds",
    "cost_path",
    "load_costs",
    "measure_costs",
    "plan_stages",
    "predict_baselines",
    "search_plans",
    "simulate",
    "simulation_error",
    "steady_state",
]
