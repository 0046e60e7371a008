"""The schedule's arithmetic, torch-free and written once (docs/design.md §6, "The rules layer").

The runtime, the simulator and the planner all decide from these functions, so a run and its simulation
cut fragments, shards and budgets alike. Rules that live beside the data they act on and are already
torch-free belong to the same layer: the unit packing of :func:`digenrl.data.micro_batches.split_units`,
the colocated rank shares of :func:`digenrl.data.rank_shares.rank_shares`, TAG's helper share of
:func:`digenrl.gap.helper_share.helper_may_claim` and the memory model of :mod:`digenrl.planning.memory`.
"""

from digenrl.rules.schedule import (
    MAX_TAG_BUDGET,
    TagPrediction,
    fragment_size,
    resolve_switch,
    search_tag_budget,
    separate_pools,
    shard_sizes,
    staleness_lag,
    tag_budget_limit,
)

__all__ = [
    "MAX_TAG_BUDGET",
    "TagPrediction",
    "fragment_size",
    "resolve_switch",
    "search_tag_budget",
    "separate_pools",
    "shard_sizes",
    "staleness_lag",
    "tag_budget_limit",
]
