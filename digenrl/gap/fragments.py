"""GAP fragments: the logical batch cut along the generation axis into equal runs of samples.

docs/design.md §3 (GAP): an iteration's P prompt groups (prompt index 0..P−1, B = P·G samples, ordered by
prompt, then sample index) are cut into fragments of ``gap.fragment_groups`` consecutive whole groups, or —
``gap.fragment_samples`` — of any S samples that divide B. With whole groups the group-relative advantage
(r − mean_group) / (std_group + ε) of every sample can be computed the moment its fragment is scored. A
fragment smaller than a group (or one that straddles groups) holds part of a group's samples: the group's
advantages are computed once all its rewards are in, wherever they were scored
(:class:`digenrl.algo.group_completion.GroupCompletion`, on the trainers: :mod:`digenrl.gap.consumer`).
Fragment f holds samples ``[f·S, (f+1)·S)``; the (prompt index, sample index) pair keys every random draw
of a sample (:func:`digenrl.rollout.noise.sample_seed`), so *which* generator produces a fragment, and
when, never changes its trajectories.

Generators are D data-parallel producers (TSP pipelines, :mod:`digenrl.tsp.pipeline`; plain generator
ranks when ``tsp.stages = 1``). Two assignments of fragments to producers (``gap.assignment``):

* ``dynamic`` (default): decided at run time — the first free producer claims the next fragment with an
  atomic ticket on the c10d store (:class:`digenrl.gap.stream.FragmentStream`), and TAG helpers claim
  from the tail. :meth:`FragmentPlan.fragments_of` then describes only the nominal (round-robin) split,
  which is what the stage balancing and the simulator's bound assume.
* ``round-robin``: fragment f goes to pipeline ``f mod D``; pipeline p produces p, p+D, p+2D, … in that
  order. Production round r therefore finishes fragments ``[r·D, (r+1)·D)`` at about the same time, so
  the trainer receives fragments in nearly ascending index order and its first fragment arrives after
  one fragment time whatever D is.

The per-pipeline fragment counts differ by at most one; with fewer fragments than pipelines some
pipelines idle (:attr:`FragmentPlan.idle_pipelines`).
"""

from __future__ import annotations

from dataclasses import dataclass

from digenrl.config import GAP_ASSIGNMENTS, ConfigError
from digenrl.rules import fragment_size

FRAGMENT_GROUPS_KEY = "gap.fragment_groups"
FRAGMENT_SAMPLES_KEY = "gap.fragment_samples"
PROMPTS_KEY = "algo.prompts_per_iteration"
ASSIGNMENTS = GAP_ASSIGNMENTS  # gap.assignment (digenrl/config.py)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class FragmentPlan:
    """Which samples form each fragment, which pipeline produces it, and in what order.

    ``sample_size`` S > 0 (``gap.fragment_samples``, with ``group_size`` G) cuts the batch into runs of S
    samples; a multiple of G is the same plan as ``fragment_groups`` = S / G (normalised to it, so one plan
    has one spelling). 0 keeps ``fragment_groups`` whole groups."""

    prompts_per_iteration: int  # P prompt groups in the logical batch
    fragment_groups: int  # F whole groups per fragment (gap.fragment_groups)
    num_pipelines: int = 1  # D data-parallel producers
    assignment: str = "dynamic"  # see the module docstring
    group_size: int = 0  # G, needed with sample_size only
    sample_size: int = 0  # S samples per fragment (gap.fragment_samples); 0 = fragment_groups · G

    def __post_init__(self) -> None:
        if self.sample_size:
            self._normalise_samples()
        p, f = self.prompts_per_iteration, self.fragment_groups
        if not _is_int(p) or p < 1:
            raise ConfigError(f"{PROMPTS_KEY} must be an int >= 1, got {p!r}")
        if not _is_int(f) or f < 1:
            raise ConfigError(f"{FRAGMENT_GROUPS_KEY} must be an int >= 1, got {f!r}")
        if p % f:
            divisors = [d for d in range(1, p + 1) if p % d == 0]
            raise ConfigError(
                f"{PROMPTS_KEY}={p} is not a multiple of {FRAGMENT_GROUPS_KEY}={f}: a fragment holds whole "
                f"prompt groups and all fragments are equal; choose {FRAGMENT_GROUPS_KEY} in {divisors}"
            )
        if not _is_int(self.num_pipelines) or self.num_pipelines < 1:
            raise ValueError(f"num_pipelines must be an int >= 1, got {self.num_pipelines!r}")
        if self.assignment not in ASSIGNMENTS:
            raise ValueError(f"assignment={self.assignment!r} is not allowed; choose one of: {ASSIGNMENTS}")

    def _normalise_samples(self) -> None:
        g, s, p = self.group_size, self.sample_size, self.prompts_per_iteration
        if not _is_int(g) or g < 1:
            raise ValueError(f"group_size must be an int >= 1 with {FRAGMENT_SAMPLES_KEY}, got {g!r}")
        if not _is_int(s) or s < 1:
            raise ConfigError(f"{FRAGMENT_SAMPLES_KEY} must be an int >= 0, got {s!r}")
        if not _is_int(p) or p < 1:
            raise ConfigError(f"{PROMPTS_KEY} must be an int >= 1, got {p!r}")
        if (p * g) % s:
            divisors = [d for d in range(1, p * g + 1) if (p * g) % d == 0]
            raise ConfigError(
                f"{FRAGMENT_SAMPLES_KEY}={s} does not divide the batch of {PROMPTS_KEY}={p} x "
                f"algo.group_size={g} = {p * g} samples: all fragments are equal; choose "
                f"{FRAGMENT_SAMPLES_KEY} in {divisors}"
            )
        if s % g == 0:  # whole groups: the same plan as fragment_groups = S / G
            object.__setattr__(self, "fragment_groups", s // g)
            object.__setattr__(self, "sample_size", 0)
        else:
            object.__setattr__(self, "fragment_groups", 1)  # not read: fragments are runs of S samples

    # ------------------------------------------------------------------ fragments
    @property
    def splits_groups(self) -> bool:
        """Whether some group's samples lie in more than one fragment (advantages wait for the group)."""
        return self.sample_size > 0

    @property
    def num_fragments(self) -> int:
        if self.splits_groups:
            return self.prompts_per_iteration * self.group_size // self.sample_size
        return self.prompts_per_iteration // self.fragment_groups

    def fragment_samples(self, group_size: int) -> int:
        """Samples per fragment: S, or F·G for whole groups."""
        if not _is_int(group_size) or group_size < 1:
            raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
        if self.splits_groups and group_size != self.group_size:
            raise ValueError(f"group_size={group_size} differs from the plan's {self.group_size}")
        return fragment_size(group_size, self.fragment_groups, self.sample_size)

    def prompt_ids(self, fragment: int) -> range:
        """Prompt indices (= group ids) ``fragment`` holds samples of, in the iteration's logical batch."""
        self._check_fragment(fragment)
        if not self.splits_groups:
            return range(fragment * self.fragment_groups, (fragment + 1) * self.fragment_groups)
        first, stop = self._sample_range(fragment)
        return range(first // self.group_size, (stop - 1) // self.group_size + 1)

    def rows(self, fragment: int) -> range:
        """The rows of ``fragment`` among the samples of its :meth:`prompt_ids` groups (group-major, G per
        group): all of them for whole groups, a run of S otherwise."""
        ids = self.prompt_ids(fragment)
        if not self.splits_groups:
            return range(0, len(ids) * self.group_size) if self.group_size else range(0)
        first, stop = self._sample_range(fragment)
        offset = ids.start * self.group_size
        return range(first - offset, stop - offset)

    def fragments_of_groups(self, fragment: int) -> range:
        """The fragments holding samples of ``fragment``'s groups (itself included): the rewards its
        advantages wait for. Just ``fragment`` for whole groups."""
        if not self.splits_groups:
            self._check_fragment(fragment)
            return range(fragment, fragment + 1)
        ids = self.prompt_ids(fragment)
        first = ids.start * self.group_size // self.sample_size
        last = (ids.stop * self.group_size - 1) // self.sample_size
        return range(first, last + 1)

    def fragment_of_prompt(self, prompt_id: int) -> int:
        """The (first) fragment holding samples of ``prompt_id``."""
        if not _is_int(prompt_id) or not 0 <= prompt_id < self.prompts_per_iteration:
            raise ValueError(
                f"prompt_id must be an int in [0, {self.prompts_per_iteration}), got {prompt_id!r}"
            )
        if self.splits_groups:
            return prompt_id * self.group_size // self.sample_size
        return prompt_id // self.fragment_groups

    def _sample_range(self, fragment: int) -> tuple[int, int]:
        return fragment * self.sample_size, (fragment + 1) * self.sample_size

    # ------------------------------------------------------------------ producers
    def pipeline_of(self, fragment: int) -> int:
        """The pipeline that produces ``fragment``."""
        self._check_fragment(fragment)
        d = self.num_pipelines
        return fragment % d

    def fragments_of(self, pipeline: int) -> tuple[int, ...]:
        """The fragments ``pipeline`` produces, in production order (empty for an idle pipeline)."""
        if not _is_int(pipeline) or not 0 <= pipeline < self.num_pipelines:
            raise ValueError(f"pipeline must be an int in [0, {self.num_pipelines}), got {pipeline!r}")
        return tuple(range(pipeline, self.num_fragments, self.num_pipelines))

    def position_in_pipeline(self, fragment: int) -> int:
        """How many fragments its pipeline produces before ``fragment`` (its production round)."""
        return self.fragments_of(self.pipeline_of(fragment)).index(fragment)

    def production_rounds(self) -> list[tuple[int, ...]]:
        """Round r lists the r-th fragment of every pipeline that has one (pipeline order): with equal
        pipelines, the fragments that finish together — the order the trainer should expect them in."""
        per_pipeline = [self.fragments_of(p) for p in range(self.num_pipelines)]
        depth = max(len(f) for f in per_pipeline)
        return [tuple(f[r] for f in per_pipeline if r < len(f)) for r in range(depth)]

    @property
    def idle_pipelines(self) -> tuple[int, ...]:
        """Pipelines with no fragment (only when num_fragments < num_pipelines)."""
        return tuple(p for p in range(self.num_pipelines) if not self.fragments_of(p))

    def describe(self, group_size: int | None = None) -> str:
        size = f" ({self.fragment_samples(group_size)} samples)" if group_size is not None else ""
        unit = (
            f"{self.sample_size} samples (a group's advantages wait for all its fragments)"
            if self.splits_groups
            else f"{self.fragment_groups} groups{size}"
        )
        text = (
            f"GAP: {self.prompts_per_iteration} prompt groups -> {self.num_fragments} fragments of "
            f"{unit}, {self.assignment} over {self.num_pipelines} pipeline(s)"
        )
        if self.assignment == "dynamic":
            return text + " (claimed at run time: the first free pipeline takes the next fragment)"
        for p in range(self.num_pipelines):
            text += f"\n  pipeline {p}: fragments {list(self.fragments_of(p))}"
        if self.idle_pipelines:
            text += f"\n  idle pipelines: {list(self.idle_pipelines)} (fewer fragments than pipelines)"
        return text

    # ------------------------------------------------------------------ internals
    def _check_fragment(self, fragment: int) -> None:
        if not _is_int(fragment) or not 0 <= fragment < self.num_fragments:
            raise ValueError(f"fragment must be an int in [0, {self.num_fragments}), got {fragment!r}")
