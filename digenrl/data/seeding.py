"""Keyed seeds: every random draw of a run is keyed by what it is for, never by a global RNG state.

A seed is a hash of integer keys: ``(seed, iteration, prompt_index, sample_index, step)`` for a sample's
noise (:mod:`digenrl.rollout.noise`), ``(seed, iteration, …)`` for an iteration's prompt order
(:mod:`digenrl.data.prompts`). So a draw does not depend on which rank makes it, in which batch or order.
"""

from __future__ import annotations

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """SplitMix64 finaliser (Steele, Lea & Flood, "Fast splittable pseudorandom number generators",
    OOPSLA 2014): a bijective 64-bit mixer, so distinct keys give well-spread, distinct seeds."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def mix_seed(*keys: int) -> int:
    """Fold integer keys into one 63-bit seed (non-negative, as ``manual_seed`` wants)."""
    h = 0
    for key in keys:
        h = _splitmix64(h ^ (int(key) & _MASK64))
    return h & ((1 << 63) - 1)
