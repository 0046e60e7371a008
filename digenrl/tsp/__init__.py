"""TSP — time-step parallelism (docs/design.md §3): generator ranks as D pipelines × S denoising stages.

Pure plans are re-exported (layout, stage boundaries, the idealised timeline); the torch-side
:class:`~digenrl.tsp.stage_worker.StageWorker` is imported from its module."""

from digenrl.tsp.pipeline import TspLayout, TspPlan, plan_tsp
from digenrl.tsp.stage_plan import StagePlan, plan_stages
from digenrl.tsp.timeline import bubble_fraction, stage_timeline

__all__ = [
    "StagePlan",
    "TspLayout",
    "TspPlan",
    "bubble_fraction",
    "plan_stages",
    "plan_tsp",
    "stage_timeline",
]
