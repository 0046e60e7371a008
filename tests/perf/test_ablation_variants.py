"""The ablation's variants are valid configurations of the runs they launch (digenrl/perf/ablation.py)."""

from __future__ import annotations

import pytest

from digenrl.config import load_config
from digenrl.perf.ablation import fragment_variants, ladder, switch_variants
from digenrl.validation import validate_config
from tests.systems.launcher import TINY


@pytest.mark.parametrize(("trainers", "generators", "stages"), [(1, 3, 1), (2, 2, 2)])
def test_every_variant_and_tcss_switch_row_passes_startup_validation(trainers, generators, stages):
    switches = switch_variants(generators, stages, 1)
    assert [o[-1] for o, _ in switches.values()] == ["tcss.switch=timing", f"tcss.switch={generators}"]
    for name, (overrides, staleness) in {**ladder(generators, stages, 1), **switches}.items():
        pools = (
            []
            if name == "colocated-sync"
            else [f"pools.trainers={trainers}", f"pools.generators={generators}"]
        )
        common = ["profile=cpu-4", "algo.prompts_per_iteration=12", *pools]
        validate_config(load_config(TINY, [*common, *overrides]), world_size=trainers + generators)
        assert staleness == (1 if "tcss" in name or "s=1" in name else 0), name


def test_the_fragment_rows_pass_startup_validation():
    """--fragment-samples: GAP with half-group fragments, with and without TAG (3 trainers, 1 generator)."""
    rows = fragment_variants(1, 2)
    assert list(rows) == ["digenrl gap S=2", "digenrl gap S=2+tag"]
    for overrides, staleness in rows.values():
        common = ["profile=cpu-4", "pools.trainers=3", "pools.generators=1"]
        validate_config(load_config(TINY, [*common, *overrides]), world_size=4)
        assert staleness == 0
