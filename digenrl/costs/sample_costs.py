"""Per-sample cost distributions: how one sample's generation or reward cost varies around the measured
cost of its phase, as data (docs/design.md §5, "Per-sample variance").

A cost file prices a phase by batch size only (every sample of a batch costs the same). A
:class:`SampleCostDistribution` adds the spread: each sample (or each prompt, whose samples share it) draws
a multiplicative *factor* on the nominal cost, normalised to mean 1 so the expected work per sample is the
cost file's and only the waiting for slow members changes. How the factors of one batched call combine is
the phase's ``batching``:

* ``max``: the call ends with its slowest member — a padded forward, a batched decode that runs until the
  longest output is done, concurrent requests to a remote server (the batch is in when the last answer is);
* ``mean``: members are processed independently one after another (``samples_per_forward=1``-like), so
  the call costs the nominal time times the mean factor.

Three kinds of distribution: ``empirical`` (measured per-sample seconds, e.g. ``measure.py
sample-costs``; sampled by the inverse of their empirical CDF, linear between order statistics),
``discrete`` (equally likely costs, e.g. one per frame-count bucket: exactly those values) and
``lognormal`` (``sigma`` of the log; factor ``exp(sigma·z − sigma²/2)``, mean 1). Every distribution names its
``source``: ``measured: <command>`` or ``assumed (<citation>)`` — a number is never called measured
unless a command of this repository produced it.

A :class:`SampleVariance` is one file (``experiments/results/costs/variance/<name>.json``): a distribution
per phase (``generate``: a sample's denoising cost, ``reward``: its reward call; the VAE decode stays
nominal) and the seed of the draws (:mod:`digenrl.sim.sample_draws`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

#: the phases whose per-sample cost can vary
PHASES = ("generate", "reward")
KINDS = ("empirical", "discrete", "lognormal")
BATCHING = ("max", "mean")
#: ``sample``: every sample draws its own factor; ``prompt``: a prompt's G samples share one (e.g. a frame
#: count assigned per prompt)
PER = ("sample", "prompt")
SOURCE_PREFIXES = ("measured: ", "assumed (")
FORMAT_VERSION = 1


def _choice(name: str, value: Any, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed; choose one of: {', '.join(allowed)}")
    return value


@dataclass(frozen=True)
class SampleCostDistribution:
    """The factor on one sample's nominal cost of ``phase`` (module docstring)."""

    phase: str
    kind: str
    source: str
    values: tuple[float, ...] = ()  # empirical / discrete: per-sample costs (any unit; only ratios matter)
    sigma: float = 0.0  # lognormal: standard deviation of the log
    per: str = "sample"
    batching: str = "max"
    note: str = ""
    _sorted: tuple[float, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"variance.{self.phase}"
        _choice(f"{where}.phase", self.phase, PHASES)
        _choice(f"{where}.kind", self.kind, KINDS)
        _choice(f"{where}.per", self.per, PER)
        _choice(f"{where}.batching", self.batching, BATCHING)
        if not isinstance(self.source, str) or not self.source.startswith(SOURCE_PREFIXES):
            raise ValueError(
                f"{where}.source must start with 'measured: <command>' or 'assumed (<citation>)', "
                f"got {self.source!r}"
            )
        if self.kind in ("empirical", "discrete"):
            values = tuple(float(v) for v in self.values)
            if len(values) < 2 or not all(math.isfinite(v) and v > 0 for v in values):
                raise ValueError(f"{where}.values must hold >= 2 positive finite costs, got {self.values!r}")
            ordered = sorted(values)
            # the mean of what ``factor`` draws — the values themselves (discrete), or the piecewise-linear
            # inverse CDF, a trapezoid over the order statistics (empirical) —: dividing by it makes
            # E[factor] exactly 1
            if self.kind == "discrete":
                mean = sum(ordered) / len(ordered)
            else:
                mean = (sum(ordered) - (ordered[0] + ordered[-1]) / 2) / (len(ordered) - 1)
            object.__setattr__(self, "values", values)
            object.__setattr__(self, "_sorted", tuple(v / mean for v in ordered))
        elif not (math.isfinite(self.sigma) and 0 <= self.sigma <= 3):
            raise ValueError(f"{where}.sigma must be in [0, 3], got {self.sigma!r}")

    def factor(self, u: float) -> float:
        """The factor at probability ``u`` in (0, 1) (inverse CDF); mean 1 over uniform ``u``."""
        if self.kind == "lognormal":
            return math.exp(self.sigma * NormalDist().inv_cdf(u) - self.sigma**2 / 2)
        ordered = self._sorted
        if self.kind == "discrete":
            return ordered[min(int(u * len(ordered)), len(ordered) - 1)]
        position = u * (len(ordered) - 1)
        low = min(int(position), len(ordered) - 2)
        return ordered[low] + (position - low) * (ordered[low + 1] - ordered[low])

    def quantile(self, p: float) -> float:
        """The factor's ``p`` quantile (for reports)."""
        return self.factor(min(max(p, 1e-9), 1 - 1e-9))

    def describe(self) -> str:
        shape = (
            f"lognormal sigma {self.sigma:g}" if self.kind == "lognormal" else f"{len(self.values)} samples"
        )
        return (
            f"{self.phase}: {shape}, per {self.per}, batch waits for {self.batching}; p50 "
            f"{self.quantile(0.5):.3g}x, p99 {self.quantile(0.99):.3g}x of the mean; {self.source}"
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "per": self.per, "batching": self.batching}
        out |= {"sigma": self.sigma} if self.kind == "lognormal" else {"values": list(self.values)}
        return out | {"source": self.source, "note": self.note}

    @classmethod
    def from_dict(cls, phase: str, data: Mapping[str, Any]) -> SampleCostDistribution:
        if not isinstance(data, Mapping):
            raise ValueError(f"variance.{phase} must be an object, got {type(data).__name__}")
        allowed = {"kind", "values", "sigma", "per", "batching", "source", "note"}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ValueError(f"variance.{phase} has unknown key(s) {unknown}; allowed: {sorted(allowed)}")
        return cls(phase=phase, **{k: tuple(v) if k == "values" else v for k, v in data.items()})


@dataclass(frozen=True)
class SampleVariance:
    """Per-phase distributions and the seed of the draws (one file; module docstring)."""

    name: str
    distributions: tuple[SampleCostDistribution, ...]
    seed: int = 0
    note: str = ""

    def __post_init__(self) -> None:
        phases = [d.phase for d in self.distributions]
        if len(set(phases)) != len(phases):
            raise ValueError(f"variance {self.name!r} names a phase twice: {phases}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"variance.seed must be an int, got {self.seed!r}")

    def get(self, phase: str) -> SampleCostDistribution | None:
        return next((d for d in self.distributions if d.phase == phase), None)

    def with_seed(self, seed: int) -> SampleVariance:
        return SampleVariance(self.name, self.distributions, seed, self.note)

    @property
    def label(self) -> str:
        """What a table row says: the file's name and whether its shapes are measured or assumed."""
        kinds = sorted({d.source.split(" ", 1)[0].rstrip(":") for d in self.distributions})
        return f"{self.name} ({'/'.join(kinds)}; seed {self.seed})"

    def describe(self) -> str:
        return "\n".join([f"variance {self.label}", *(f"  {d.describe()}" for d in self.distributions)])

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "name": self.name,
            "seed": self.seed,
            "note": self.note,
            "phases": {d.phase: d.to_dict() for d in self.distributions},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SampleVariance:
        if not isinstance(data, Mapping):
            raise ValueError(f"a variance file must be a JSON object, got {type(data).__name__}")
        if data.get("format") != FORMAT_VERSION:
            raise ValueError(
                f"variance file format {data.get('format')!r}; this reader needs {FORMAT_VERSION}"
            )
        allowed = {"format", "name", "seed", "note", "phases"}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ValueError(f"variance file has unknown key(s) {unknown}; allowed: {sorted(allowed)}")
        phases = data.get("phases")
        if not isinstance(phases, Mapping) or not phases:
            raise ValueError(f"variance.phases must map a phase ({', '.join(PHASES)}) to its distribution")
        return cls(
            name=str(data.get("name") or "variance"),
            distributions=tuple(SampleCostDistribution.from_dict(p, d) for p, d in phases.items()),
            seed=data.get("seed", 0),
            note=str(data.get("note", "")),
        )

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> SampleVariance:
        path = Path(path)
        if not path.is_file():
            raise ValueError(
                f"variance file '{path}' does not exist (see experiments/results/costs/variance/)"
            )
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"variance file '{path}' is not valid JSON: {error}") from error
        return cls.from_dict(data)
