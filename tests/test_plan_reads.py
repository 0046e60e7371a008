"""The schedule a run executes is described once: the systems and the mechanisms read it from the run's
:class:`~digenrl.plan.RunPlan` (``System.plan``, written to ``plan.json``), never from the config's
schedule sections (issue 33). Read with ``ast``: an attribute read of a schedule section on ``cfg``,
``config``, ``self.cfg`` or ``self.config`` in any module of these folders fails, naming the file, the line
and the plan's field to read instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "digenrl"
#: the folders whose schedule decisions come from the plan
PLAN_READERS = ("systems", "gap", "tsp", "tag", "async_policy")
#: the config sections a plan holds (digenrl/plan/run_plan.py SCHEDULE_KEYS), with the plan's fields
SCHEDULE_SECTIONS = {
    "gap": "gap, fragment_groups, fragment_samples, fragment_assignment, train_order",
    "tsp": "tsp_stages, tsp_boundaries, pipelines",
    "tag": "tag, tag_policy, tag_max_fragments, park_grads",
    "tcss": "tcss, tcss_switch, staleness",
    "pools": "trainers, generators, scorers (and trainer_ranks() ...)",
    "colocated": "work_split",
    "asynchrony": "max_staleness, max_inflight, staleness",
    "engine": "engine_offload",
    "residency": "train_resident, reward_resident",
}
CONFIG_NAMES = ("cfg", "config")


def _is_config(node: ast.expr) -> bool:
    """``cfg`` / ``config``, or ``self.cfg`` / ``self.config``."""
    if isinstance(node, ast.Name):
        return node.id in CONFIG_NAMES
    return (
        isinstance(node, ast.Attribute)
        and node.attr in CONFIG_NAMES
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def schedule_reads(source: str) -> list[tuple[int, str]]:
    """(line, section) of every read of a schedule section on a config in ``source``."""
    return sorted(
        (node.lineno, node.attr)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and node.attr in SCHEDULE_SECTIONS and _is_config(node.value)
    )


def test_the_systems_and_mechanisms_read_the_schedule_from_the_plan():
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: cfg.{section} (the plan's {SCHEDULE_SECTIONS[section]})"
        for folder in PLAN_READERS
        for path in sorted((PACKAGE / folder).rglob("*.py"))
        for line, section in schedule_reads(path.read_text(encoding="utf-8"))
    ]
    assert not found, "schedule read from the config instead of the run's plan:\n" + "\n".join(found)


def test_the_check_finds_every_spelling_of_a_config_read():
    source = """
def f(cfg, config, plan):
    a = cfg.gap.fragment_samples
    b = config.tsp.stages
    c = self.cfg.tag.policy
    d = self.config.pools
    e = plan.tcss_switch, cfg.model.name, other.gap
"""
    assert schedule_reads(source) == [(3, "gap"), (4, "tsp"), (5, "tag"), (6, "pools")]
