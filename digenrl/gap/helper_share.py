"""TAG leaves the generators their share: which tail fragment a trainer may generate itself.

docs/design.md §3 "TAG". A helper on a trainer rank claims from the tail of an iteration's fragment queue,
the fragments the generator pool would reach last. Two rules keep it from taking the generators' work,
one set for the runtime (:class:`digenrl.tag.component.Tag`) and the simulator
(:mod:`digenrl.sim.schedules.disaggregated`):

1. **Version first.** A helper generating iteration k with θ_v claims nothing before every generator rank
   holds θ_v: otherwise a trainer that finishes its optimizer step early claims the whole queue while the
   broadcast is still on its way and the generators sit in ``wait_sync`` (the race issue 24 traced).
2. **Only what the generators cannot finish in time.** With R unclaimed fragments, I fragments in flight on
   the generators (each still holds its pipeline for up to one more period) and D pipelines that each
   finish a fragment every ``generator_fragment_s``, the pool finishes the last unclaimed one after at most
   ⌈(R + I) / D⌉ · ``generator_fragment_s``; the helper claims it only if it would finish it sooner
   (``helper_fragment_s``: its own generation, scoring and switch). Before anything is measured it claims
   only a backlog beyond one round of the pipelines (R + I > D). Counting the in-flight fragments matters:
   without them a helper leaves the tail to a pool that is still busy (the image rows of the throughput
   table lost 6–9 % with TCSS).
"""

from __future__ import annotations

import math


def helper_may_claim(
    remaining: int,
    pipelines: int,
    generator_fragment_s: float | None,
    helper_fragment_s: float | None,
    in_flight: int = 0,
) -> bool:
    """Whether a helper may claim the tail fragment of ``remaining`` unclaimed ones while the generators
    have ``in_flight`` fragments under way (rule 2 above)."""
    if pipelines < 1:
        raise ValueError(f"pipelines must be >= 1, got {pipelines}")
    if remaining <= 0:
        return False
    rounds = math.ceil((remaining + max(0, in_flight)) / pipelines)
    if generator_fragment_s is None or helper_fragment_s is None:
        return rounds > 1
    return rounds * generator_fragment_s > helper_fragment_s
