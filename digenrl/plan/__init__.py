"""The schedule of a run and what it computes, described once (docs/design.md §5): :class:`RunPlan`.

``experiments/run_train.py`` writes it to ``out_dir/plan.json``; the simulator, the planner and
``simulate.py validate`` read only it. Torch-free.
"""

from digenrl.plan.run_plan import SCHEDULE_KEYS, WORK_SPLITS, RunPlan, is_schedule_key
from digenrl.plan.workload import Workload

__all__ = ["SCHEDULE_KEYS", "WORK_SPLITS", "RunPlan", "Workload", "is_schedule_key"]
