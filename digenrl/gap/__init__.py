"""GAP — generation-axis pipeline (DESIGN.md §3): fragments of whole prompt groups, and the trainer-side
spreading of a fragment's (sample, timestep) units over the trainer ranks."""

from digenrl.gap.fragments import FragmentPlan
from digenrl.gap.unit_sharding import plan_unit_shards, shard_units

__all__ = ["FragmentPlan", "plan_unit_shards", "shard_units"]
