"""One module per schedule; each exposes ``run_<system>(cluster, plan)`` that spawns its rank processes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from digenrl.plan import RunPlan
from digenrl.sim.cluster import SimCluster
from digenrl.sim.schedules.colocated import run_colocated
from digenrl.sim.schedules.colocated_engine import run_colocated_engine
from digenrl.sim.schedules.disaggregated import run_digenrl
from digenrl.sim.schedules.separate_async import run_separate_async
from digenrl.sim.schedules.separate_sync import run_separate_sync

ScheduleFn = Callable[[SimCluster, RunPlan], Any]

SCHEDULES: dict[str, ScheduleFn] = {
    "colocated-sync": run_colocated,
    "colocated-overlap": run_colocated,
    "colocated-engine": run_colocated_engine,
    "separate-sync": run_separate_sync,
    "separate-async": run_separate_async,
    "digenrl": run_digenrl,
}

__all__ = ["SCHEDULES", "ScheduleFn"]
