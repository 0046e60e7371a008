"""The per-sample cost factors of one simulation, drawn with a seeded RNG (docs/design.md §5, "Per-sample
variance"; the distributions are data, :mod:`digenrl.costs.sample_costs`).

Sample ``i`` of iteration ``k`` (group-major numbering, as :mod:`digenrl.data.rank_shares` and the
fragments number them) draws the same factor whichever schedule generates it and on whichever rank: the
draws are keyed by (seed, phase, k, i) — or the prompt ``i // G`` for a distribution drawn per prompt — so
every system of a comparison meets the same slow samples, and a simulation is deterministic given the
seed. A batched call over samples ``[first, first + n)`` costs its nominal time times the combined factor
of its members (``max``: it waits for its slowest member; ``mean``: members one after another).
"""

from __future__ import annotations

import random
from statistics import fmean

from digenrl.costs.sample_costs import SampleVariance
from digenrl.plan.workload import Workload

#: (iteration, first sample index) of the samples a phase processes: where they lie in the iteration's
#: numbering (separate-async: the batch's launch index instead of the iteration)
At = tuple[int, int]


class SampleDraws:
    """Seeded per-sample factors of ``variance`` for ``workload``'s iterations (module docstring)."""

    def __init__(self, variance: SampleVariance, workload: Workload) -> None:
        self.variance = variance
        self.workload = workload
        self._draws: dict[tuple[str, int], list[float]] = {}

    def factors(self, phase: str, at: At, count: int) -> list[float] | None:
        """The factors of ``count`` samples from ``at``; None where ``phase`` has no distribution."""
        dist = self.variance.get(phase)
        if dist is None or count <= 0:
            return None
        iteration, first = at
        w = self.workload
        key = (phase, iteration)
        if key not in self._draws:
            n = w.prompts_per_iteration if dist.per == "prompt" else w.samples_per_iteration
            rng = random.Random(f"{self.variance.seed}/{phase}/{iteration}")
            # u in (0, 1): the midpoint of one of 2^53 equal cells, never 0 or 1 (the inverse CDF's poles)
            self._draws[key] = [dist.factor((rng.getrandbits(53) + 0.5) / 2**53) for _ in range(n)]
        draws = self._draws[key]
        span = range(first, first + count)
        if first < 0 or span.stop > w.samples_per_iteration:
            raise ValueError(
                f"samples [{first}, {span.stop}) of iteration {iteration} are outside its "
                f"{w.samples_per_iteration} samples"
            )
        if dist.per == "prompt":
            return [draws[i // w.group_size] for i in span]
        return draws[first : first + count]

    def call_factors(self, phase: str, at: At, samples: int, chunk: int) -> list[tuple[int, float]] | None:
        """(size, factor) of each batched call over ``samples`` from ``at`` in calls of at most ``chunk``:
        the factor is the max (or mean, by the distribution's ``batching``) of its members'."""
        factors = self.factors(phase, at, samples)
        if factors is None:
            return None
        dist = self.variance.get(phase)
        assert dist is not None  # factors() returned some
        combine = max if dist.batching == "max" else fmean
        return [
            (len(part), combine(part)) for part in (factors[i : i + chunk] for i in range(0, samples, chunk))
        ]
