"""TSP — time-step parallelism (DESIGN.md §3): generator ranks as D pipelines × S denoising stages."""

from digenrl.tsp.pipeline import TspLayout, TspPlan, plan_tsp, run_stage
from digenrl.tsp.timeline import bubble_fraction, stage_timeline

__all__ = ["TspLayout", "TspPlan", "bubble_fraction", "plan_tsp", "run_stage", "stage_timeline"]
