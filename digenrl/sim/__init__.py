"""The discrete-event simulator and its schedules (docs/design.md §5, "Simulator and planner").

The simulator shares the runtime's plans — :class:`~digenrl.gap.fragments.FragmentPlan`,
:class:`~digenrl.tsp.pipeline.TspLayout`, :func:`~digenrl.tsp.stage_plan.plan_stages`, the unit shard
sizes of :mod:`digenrl.gap.unit_sharding` — so a simulated schedule maps fragments, stages and units
exactly as a real run does (``tests/sim/test_sim_runtime_contract.py``). Its costs come from
:mod:`digenrl.costs`; the planner that searches plans with it is :mod:`digenrl.planning`, the tables and
the comparison with real runs are :mod:`digenrl.reports`. The runtime asks it one question, through
:mod:`digenrl.sim.predict` (TAG's budget).
"""

from digenrl.sim.simulator import SimResult, compute_seconds, simulate

__all__ = ["SimResult", "compute_seconds", "simulate"]
