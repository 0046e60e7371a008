"""The schedule's rules, each once: fragment size, unit shard sizes, the TCSS switch, the staleness bound
and TAG's budget search (docs/design.md §3). Torch-free: the simulator and the planner run without torch."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from digenrl.config import ConfigError

#: The largest helper budget (fragments per trainer rank per iteration) TAG's search tries.
MAX_TAG_BUDGET = 16


def fragment_size(group_size: int, fragment_groups: int, fragment_samples: int) -> int:
    """Samples per fragment: ``gap.fragment_samples`` when set, else ``gap.fragment_groups`` whole groups of
    ``algo.group_size`` (docs/design.md §3 "GAP")."""
    return fragment_samples or fragment_groups * group_size


def separate_pools(trainers: int, generators: int, scorers: int, world_size: int) -> tuple[int, int, int]:
    """The ``pools.*`` a separate-pool system runs with: as set, or with none set on 2+ ranks half the ranks
    train and the rest generate (the runtime's ``systems/separate.separate_layout`` and the plan alike)."""
    if trainers == generators == scorers == 0 and world_size >= 2:
        return world_size // 2, world_size - world_size // 2, 0
    return trainers, generators, scorers


def shard_sizes(total: int, parts: int, offset: int) -> list[int]:
    """``parts`` sizes summing to ``total``, differing by at most one; the larger ones go to the parts
    from ``offset`` on (cyclically). Passing the units of all earlier fragments as ``offset`` deals an
    iteration's units evenly: over the whole batch no trainer rank gets more than one unit above another
    (the runtime's :func:`digenrl.gap.unit_sharding.shard_units` and the simulator cut shards by it)."""
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ValueError(f"num_shards must be an int >= 1, got {parts!r}")
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise ValueError(f"total must be an int >= 0, got {total!r}")
    base, extra = divmod(total, parts)
    return [base + (1 if (i - offset) % parts < extra else 0) for i in range(parts)]


SWITCH_KEY = "tcss.switch"
SWITCH_MODES = ("auto", "timing")


def resolve_switch(value: str, num_fragments: int) -> int | None:
    """``tcss.switch`` as the first fragment of an iteration generated with that iteration's own version
    (None: ``timing``; ``auto`` = ``num_fragments``: :mod:`digenrl.async_policy.tcss`)."""
    if value == "timing":
        return None
    if value == "auto":
        return num_fragments
    try:
        switch = int(value)
    except ValueError:
        switch = -1
    if not 0 <= switch <= num_fragments:
        raise ConfigError(
            f"{SWITCH_KEY}={value!r} is not allowed; choose auto, timing or a fragment index in "
            f"[0, {num_fragments}] (the iteration's {num_fragments} fragments)"
        )
    return switch


def staleness_lag(system: str, *, tcss: bool, max_staleness: int) -> int:
    """Most policy versions a trained trajectory may lag (docs/design.md §4 "Equal staleness"):
    ``separate-async`` its ``asynchrony.max_staleness``, ``digenrl`` 1 with TCSS, every other schedule 0."""
    if system == "separate-async":
        return max_staleness
    return 1 if system == "digenrl" and tcss else 0


def tag_budget_limit(num_fragments: int, trainers: int, max_fragments: int = 0) -> int:
    """The largest helper budget (fragments per trainer rank per iteration) TAG's search tries:
    ``tag.max_fragments`` (0: a trainer's share of the fragments, ⌈fragments / trainers⌉), at most every
    fragment and :data:`MAX_TAG_BUDGET`."""
    share = max_fragments or math.ceil(num_fragments / trainers)
    return min(share, num_fragments, MAX_TAG_BUDGET)


class _Rated(Protocol):
    samples_per_s: float


R = TypeVar("R", bound=_Rated)


def search_tag_budget(limit: int, run: Callable[[int], R | None]) -> tuple[R | None, dict[int, R | None]]:
    """TAG's bubble-triggered budget search (docs/design.md §3 (TAG)), the one rule of the runtime's
    ``tag.policy=auto``, the simulator and the planner: ``run(budget)`` (anything with ``samples_per_s``;
    None if that plan cannot run) at budgets 0, 1, 2, … ``limit``, stopping after two in a row that do not
    improve; the best wins and ties go to the smaller budget, so TAG is inserted only where the cost model
    predicts a shorter makespan. Returns the best (None if budget 0 cannot run) and every budget tried with
    its result."""
    tried: dict[int, R | None] = {0: run(0)}
    best = tried[0]
    if best is None:
        return None, tried
    worse_in_a_row = 0
    for budget in range(1, limit + 1):
        trial = tried[budget] = run(budget)
        if trial is not None and trial.samples_per_s > best.samples_per_s * (1 + 1e-12):
            best, worse_in_a_row = trial, 0
        else:
            worse_in_a_row += 1
            if worse_in_a_row == 2:
                break
    return best, tried


@dataclass(frozen=True)
class TagPrediction:
    """The best helper budget and the predicted steady iteration seconds of every budget tried."""

    budget: int
    iteration_s: dict[int, float]
