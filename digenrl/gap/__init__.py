"""GAP — generation-axis pipeline (docs/design.md §3): fragments of whole prompt groups
(:mod:`~digenrl.gap.fragments`), the stream that claims and ships them (:mod:`~digenrl.gap.stream`), and
the spreading of a fragment's (sample, timestep) units over the trainer ranks
(:mod:`~digenrl.gap.unit_sharding`). Only the pure plan is re-exported; import the torch-side modules
directly."""

from digenrl.gap.fragments import FragmentPlan

__all__ = ["FragmentPlan"]
