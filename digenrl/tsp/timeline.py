"""The fill / steady / drain schedule of fragments through one TSP pipeline (GPipe-style).

A pipeline of S stages processes fragments in order; stage s works on fragment f at tick f + s (Huang et
al., "GPipe", NeurIPS 2019, Fig. 2: micro-batch f enters stage s one tick after stage s−1 released it).
With F fragments the schedule takes F + S − 1 ticks, of which S − 1 are fill and S − 1 drain, so with
equal stage times the idle fraction of the pipeline is (S − 1) / (F + S − 1). GAP makes F large (many
small fragments per iteration), TCSS hides the drain by starting the next iteration's fragments.
This is the idealised schedule for docs, tests and the simulator; the runtime is driven by arrivals.
"""

from __future__ import annotations


def stage_timeline(num_fragments: int, stages: int) -> list[list[tuple[int, int]]]:
    """Per tick, the ``(fragment, stage)`` pairs that run concurrently (stage order)."""
    for name, value, low in (("num_fragments", num_fragments, 0), ("stages", stages, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if num_fragments == 0:
        return []
    return [
        [(tick - s, s) for s in range(stages) if 0 <= tick - s < num_fragments]
        for tick in range(num_fragments + stages - 1)
    ]


def bubble_fraction(num_fragments: int, stages: int) -> float:
    """Idle stage-ticks / all stage-ticks of :func:`stage_timeline` with equal stage times."""
    ticks = stage_timeline(num_fragments, stages)
    if not ticks:
        return 0.0
    busy = sum(len(t) for t in ticks)
    return 1.0 - busy / (len(ticks) * stages)
