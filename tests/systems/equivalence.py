"""The equivalence check of the system tests: another schedule computes the reference run's update, iteration
by iteration, on the same data and seed (docs/operations.md, "Same data, same update"). Each test passes the
tolerance its runs allow: trajectories are bit-identical on CPU, but the update agrees only up to fp32
summation order, which differs more the more the batch composition differs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from digenrl.runtime.observe.metrics import read_metrics
from digenrl.runtime.reproducibility.batch_ledger import read_batch_ledger

#: the update's norms, compared relatively (``rel``)
NORMS = ("update_norm", "grad_norm")
#: the batch reward's statistics, compared absolutely (``reward_abs``)
REWARDS = ("reward_mean", "reward_std")


def assert_same_update(
    reference: Path,
    other: Path,
    *,
    rel: float,
    reward_abs: float = 1e-6,
    norms: tuple[str, ...] = NORMS,
    samples: int | None = None,
    iterations: int | None = None,
    first_rewards_exact: bool = False,
    ratio_abs: float | None = None,
    equal: tuple[str, ...] = (),
    zero: tuple[str, ...] = (),
) -> None:
    """The run in ``other`` computed what the run in ``reference`` computed: the same iterations
    (``iterations`` of them, when given) and in each, ``samples`` samples (when given), the batch reward's
    mean and std within ``reward_abs``, each of ``norms`` within ``rel`` of the reference's, the ``equal``
    metrics identical, and in ``other`` the ``zero`` metrics (staleness) 0 and, with ``ratio_abs``, the
    importance ratio's mean 1 within it (on-policy, one update per batch). ``first_rewards_exact``: iteration
    0 starts from the same weights, so its trajectories are bit-identical and so is its reward mean (its std
    within 1e-12: the reduction order may differ) — provided both computed them on the same batches, which
    is checked first from the runs' batch ledgers (``runtime.record_batches=true``; see
    :func:`assert_same_batches`). A failure names the runs, the iteration and the metric."""
    expected, got = read_metrics(reference), read_metrics(other)
    runs = f"{Path(other).name} vs reference {Path(reference).name}"
    assert expected, f"{runs}: the reference wrote no metrics"
    numbers = [r["iteration"] for r in expected]
    assert [r["iteration"] for r in got] == numbers, f"{runs}: iterations {[r['iteration'] for r in got]}"
    if iterations is not None:
        assert len(expected) == iterations, f"{runs}: {len(expected)} iterations, expected {iterations}"
    if first_rewards_exact:
        assert_same_batches(reference, other, ops=("rollout", "decode"), iteration=0)
        _check(runs, expected[0], got[0], "reward_mean", got[0]["reward_mean"] == expected[0]["reward_mean"])
        close = got[0]["reward_std"] == pytest.approx(expected[0]["reward_std"], abs=1e-12)
        _check(runs, expected[0], got[0], "reward_std", close, "abs 1e-12")
    for a, b in zip(expected, got, strict=True):
        if samples is not None:
            _check(runs, a, b, "samples", a["samples"] == b["samples"] == samples, f"both {samples}")
        for key in REWARDS:
            _check(runs, a, b, key, b[key] == pytest.approx(a[key], abs=reward_abs), f"abs {reward_abs}")
        for key in norms:
            _check(runs, a, b, key, b[key] == pytest.approx(a[key], rel=rel), f"rel {rel}")
        for key in equal:
            _check(runs, a, b, key, b[key] == a[key])
        if ratio_abs is not None:
            ratio = b["ratio_mean"]
            assert ratio == pytest.approx(1.0, abs=ratio_abs), (
                f"{runs}: iteration {b['iteration']}: ratio_mean {ratio!r}"
            )
        for key in zero:
            assert b[key] == 0, f"{runs}: iteration {b['iteration']}: {key} {b[key]!r}, not 0"


def _check(runs: str, a: dict[str, Any], b: dict[str, Any], key: str, ok: bool, bound: str = "exact") -> None:
    """Fail naming the iteration and the metric ``key`` unless ``ok``."""
    assert ok, f"{runs}: iteration {a['iteration']}: {key} {b[key]!r}, reference {a[key]!r} ({bound})"


def ledger_batches(run: Path, iteration: int | None = None) -> dict[str, list]:
    """The run's batched computations (its batch ledger, digenrl/runtime/reproducibility/batch_ledger.py), all
    ranks together: each denoising step's forward batches and the decode batches as sorted lists (independent
    computations, in any order on any rank; a TSP stage's steps count as the steps they are), and each
    trainer rank's micro-batches in accumulation order (the gradient's summation order), by rank.
    ``iteration``: that iteration's only."""
    ledgers = read_batch_ledger(run)
    lines = [x for rank in sorted(ledgers) for x in ledgers[rank]]
    if iteration is not None:
        lines = [x for x in lines if x["iteration"] == iteration]
    forwards = [
        (x["iteration"], step, x["samples"])
        for x in lines
        if x["op"] == "rollout"
        for step in range(*x["steps"])
    ]
    train = {
        rank: [(x["iteration"], x["units"]) for x in lines_ if x["op"] == "train"]
        for rank, lines_ in ledgers.items()
    }
    return {
        "rollout": sorted(forwards),
        "decode": sorted((x["iteration"], x["samples"]) for x in lines if x["op"] == "decode"),
        "train": {rank: units for rank, units in train.items() if units},
    }


def assert_same_batches(
    reference: Path, other: Path, *, ops: tuple[str, ...], iteration: int | None = None
) -> None:
    """Both runs ran the batched computations ``ops`` on the same samples (what bit equality between two
    schedules rests on: the same operations on the same shapes; whether other shapes round alike depends on
    the machine's kernels, so a test that relies on luck would pass on one CPU and fail on another)."""
    a, b = ledger_batches(reference, iteration), ledger_batches(other, iteration)
    runs = f"{Path(other).name} vs reference {Path(reference).name}"
    for op in ops:
        assert a[op], f"{runs}: the reference recorded no {op} batch (iteration {iteration})"
        assert b[op] == a[op], f"{runs}: {op} ran on different batches (iteration {iteration})"
