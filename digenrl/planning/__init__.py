"""Choosing a plan by simulating the candidates (docs/design.md §5, "Simulator and planner"): the
:class:`~digenrl.planning.planner.Planner` over DigenRL's plan space, which contains every baseline, and
the per-rank memory model that gives each plan the knobs it can run (:mod:`~digenrl.planning.memory`)."""

from digenrl.planning.planner import Planner, PlannerResult, PlanScore, predict_baselines, search_plans

__all__ = ["PlanScore", "Planner", "PlannerResult", "predict_baselines", "search_plans"]
