"""Cost model, discrete-event simulator and planner (docs/design.md §5, "Simulator and planner").

The simulator shares the runtime's plans — :class:`~digenrl.gap.fragments.FragmentPlan`,
:class:`~digenrl.tsp.pipeline.TspLayout`, :func:`~digenrl.tsp.stage_plan.plan_stages`, the unit shard
sizes of :mod:`digenrl.gap.unit_sharding` — so a simulated schedule maps fragments, stages and units
exactly as a real run does (``tests/sim/test_sim_runtime_contract.py``). No model is built: measuring a
cost model imports the model code lazily (:func:`digenrl.sim.costs.measure_costs` →
:mod:`digenrl.sim.measure`).
"""

from digenrl.sim.costs import CostModel, cost_path, load_costs, measure_costs
from digenrl.sim.device_costs import DeviceCosts
from digenrl.sim.planner import Planner, PlannerResult, PlanScore, predict_baselines, search_plans
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
    "Planner",
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
