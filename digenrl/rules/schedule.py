"""The schedule's rules, each once: fragment size, unit shard sizes, the TCSS switch, the staleness bound
and TAG's budget search (docs/design.md §3). Torch-free: the simulator and the planner run without torch."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from digenrl.config import AlgoConfig, ConfigError

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


def trained_step_count(algo: AlgoConfig, num_steps: int) -> int:
    """K, the trained transitions per trajectory of a ``num_steps``-step rollout, as the engine selects
    them: the window of MixGRPO or FlowGRPO-Fast, else max(1, ⌊T·timestep_fraction⌋) (DiffusionNFT's
    forward units too, at a random K of the grid's sigmas per sample). The cost model, the simulator and the
    trainer's unit count all read it here."""
    if algo.name == "mixgrpo":
        return algo.mix_window
    if algo.name == "flowgrpo" and algo.timestep_selection == "fast-window":
        return algo.fast_window
    return max(1, int(num_steps * algo.timestep_fraction))


def shard_group(
    ranks: Sequence[int], rank: int, node_of: Callable[[int], int], sharding: str
) -> tuple[int, ...]:
    """The trainer ranks among which ``rank``'s FSDP2 shards its weights, gradients and optimizer state:
    every one of ``ranks`` (``trainer.sharding=flat``), or those on ``rank``'s node (``hybrid``: HSDP,
    shard within a node and replicate across nodes, so each micro-batch's all-gathers and reduce-scatters
    stay on the node's links and only one gradient all-reduce per step crosses nodes; PyTorch FSDP2
    ``fully_shard`` on a 2-D device mesh)."""
    if sharding == "flat":
        return tuple(ranks)
    node = node_of(rank)
    return tuple(r for r in ranks if node_of(r) == node)


def replica_group(
    ranks: Sequence[int], rank: int, node_of: Callable[[int], int], sharding: str
) -> tuple[int, ...]:
    """The ranks holding the same shard as ``rank`` on the other nodes (``hybrid``; flat: ``rank`` alone):
    the group of the once-per-step gradient all-reduce."""
    if sharding == "flat":
        return (rank,)
    position = shard_group(ranks, rank, node_of, sharding).index(rank)
    nodes = sorted({node_of(r) for r in ranks})
    out = []
    for node in nodes:
        local = [r for r in ranks if node_of(r) == node]
        if position < len(local):
            out.append(local[position])
    return tuple(out)


def hybrid_sharding_problem(
    ranks: Sequence[int],
    node_of: Callable[[int], int] | None,
    *,
    mode: str = "full",
    backend: str = "auto",
) -> str | None:
    """Why ``trainer.sharding=hybrid`` cannot shard ``ranks`` (None: it can). HSDP is FSDP2's (``mode``:
    ``trainer.mode``, ``backend``: ``trainer.backend``): a full fine-tune, and at least two nodes with the
    same number of trainer ranks on each (a 2-D layout; ``node_of`` None: the nodes are not known yet)."""
    if mode != "full":
        return (
            "trainer.sharding=hybrid shards a full fine-tune (FSDP2); a LoRA run replicates its adapter, so "
            "use trainer.sharding=flat (the default) with trainer.mode=lora"
        )
    if backend not in ("auto", "fsdp2"):
        return (
            f"trainer.sharding=hybrid is FSDP2's hybrid sharding, but trainer.backend={backend}; set "
            "trainer.backend=fsdp2 (or auto), or trainer.sharding=flat"
        )
    if node_of is None:
        return None
    per_node: dict[int, int] = {}
    for r in ranks:
        per_node[node_of(r)] = per_node.get(node_of(r), 0) + 1
    if len(per_node) < 2:
        return (
            "trainer.sharding=hybrid shards inside a node and replicates across nodes, but the trainer ranks "
            "are on one node; use trainer.sharding=flat (the same thing on one node)"
        )
    if len(set(per_node.values())) > 1:
        counts = ", ".join(f"node {n}: {c}" for n, c in sorted(per_node.items()))
        return (
            f"trainer.sharding=hybrid needs the same number of trainer ranks on every node ({counts}); "
            "choose pools whose trainers divide evenly over the nodes, or trainer.sharding=flat"
        )
    return None
