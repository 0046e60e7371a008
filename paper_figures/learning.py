"""Reward curves: ``reward_mean`` ± ``reward_std`` per iteration from one or several runs' ``metrics.jsonl``,
and beside them, where the run evaluated (``eval.every``), the held-out evaluation reward ``eval_reward_mean``
(dashed, square markers).

An evaluation of policy θ_v (``eval_policy_version`` v) is drawn at iteration v, where the training reward
is that of the rollouts θ_v generated; the final policy's evaluation sits one past the last iteration.
The band is the spread of rewards *within* an iteration's batch (``reward_std`` as the trainer logs it,
digenrl/runtime/observe/metrics.py), not a confidence interval over seeds. ``x="wall"`` plots against
cumulative ``wall_s`` instead of the iteration index, which is the fair axis when comparing a faster schedule
(or an asynchronous one, whose iterations overlap) against a synchronous baseline.

Usage: ``python paper_figures/learning.py RUN_DIR [RUN_DIR ...] --out learning.png [--x wall]``
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from matplotlib.ticker import MaxNLocator

from paper_figures.logs import RunLog, load_run
from paper_figures.style import DEFAULT_DPI, label_axes, new_figure, save_png

X_AXES = ("iteration", "wall")


def reward_curve(metrics: Sequence[dict[str, Any]], x: str = "iteration") -> tuple[list[float], ...]:
    """(xs, means, stds) of one run; iterations whose reward was not finite (logged as null) are dropped."""
    if x not in X_AXES:
        raise ValueError(f"x={x!r}; allowed: {list(X_AXES)}")
    for key in ("iteration", "reward_mean", "reward_std", "wall_s"):
        if any(key not in record for record in metrics):
            raise ValueError(
                f"a metrics record lacks key '{key}' (digenrl/runtime/observe/metrics.py REQUIRED_KEYS)"
            )
    clock = list(accumulate(float(r["wall_s"] or 0.0) for r in metrics))
    xs, means, stds = [], [], []
    for record, elapsed in zip(metrics, clock, strict=True):
        mean, std = record["reward_mean"], record["reward_std"]
        if mean is None or not math.isfinite(float(mean)):
            continue
        xs.append(float(record["iteration"]) if x == "iteration" else elapsed)
        means.append(float(mean))
        stds.append(float(std) if std is not None and math.isfinite(float(std)) else 0.0)
    return xs, means, stds


def eval_curve(metrics: Sequence[dict[str, Any]], x: str = "iteration") -> tuple[list[float], list[float]]:
    """(xs, eval reward means) of one run's evaluations (records with ``eval_reward_mean``; none: empty).
    ``x="iteration"``: the evaluated policy version; ``"wall"``: the cumulative ``wall_s`` of its record."""
    if x not in X_AXES:
        raise ValueError(f"x={x!r}; allowed: {list(X_AXES)}")
    clock = list(accumulate(float(r.get("wall_s") or 0.0) for r in metrics))
    xs, means = [], []
    for record, elapsed in zip(metrics, clock, strict=True):
        mean = record.get("eval_reward_mean")
        if mean is None or not math.isfinite(float(mean)):
            continue
        xs.append(float(record["eval_policy_version"]) if x == "iteration" else elapsed)
        means.append(float(mean))
    return xs, means


def reward_name(run: RunLog) -> str | None:
    """``reward.name`` from the run's config.yaml, if it wrote one."""
    reward = run.config.get("reward")
    return str(reward["name"]) if isinstance(reward, dict) and reward.get("name") else None


def plot_learning(
    runs: Sequence[RunLog | str | Path],
    out_path: str | Path,
    *,
    x: str = "iteration",
    labels: Sequence[str] | None = None,
    title: str | None = None,
    figsize: tuple[float, float] = (6.4, 4.0),
    dpi: int = DEFAULT_DPI,
) -> Path:
    """One line + band per run (a ``RunLog`` or run directory with ``metrics.jsonl``)."""
    if not runs:
        raise ValueError("runs must name at least one run directory")
    loaded = [run if isinstance(run, RunLog) else load_run(run) for run in runs]
    if labels is not None and len(labels) != len(loaded):
        raise ValueError(f"labels has {len(labels)} entries for {len(loaded)} runs")
    for run in loaded:
        if not run.metrics:
            raise ValueError(f"run '{run.path}' has no metrics.jsonl records")
    figure = new_figure(figsize, dpi)
    axes = figure.add_subplot()
    for index, run in enumerate(loaded):
        xs, means, stds = reward_curve(run.metrics, x)
        label = labels[index] if labels is not None else run.label
        (line,) = axes.plot(xs, means, marker="o" if len(xs) <= 30 else None, markersize=3, label=label)
        low = [m - s for m, s in zip(means, stds, strict=True)]
        high = [m + s for m, s in zip(means, stds, strict=True)]
        axes.fill_between(
            xs, low, high, color=line.get_color(), alpha=0.2 if len(loaded) == 1 else 0.1, linewidth=0
        )
        eval_xs, eval_means = eval_curve(run.metrics, x)
        if eval_xs:
            axes.plot(
                eval_xs,
                eval_means,
                linestyle="--",
                marker="s",
                markersize=4,
                color=line.get_color(),
                label=f"{label} (eval, held-out prompts)",
            )
    rewards = {reward_name(run) for run in loaded}
    reward = f" ({rewards.pop()})" if len(rewards) == 1 and None not in rewards else ""
    if x == "iteration":
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    label_axes(
        axes,
        xlabel="iteration" if x == "iteration" else "wall-clock time (s, sum of wall_s)",
        ylabel=f"reward{reward}, mean ± std in batch",
        title=title or "Reward during training",
    )
    axes.legend(fontsize=8, frameon=False)
    return save_png(figure, out_path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, required=True, help="output PNG path")
    parser.add_argument("--x", choices=X_AXES, default="iteration")
    args = parser.parse_args(argv)
    try:
        print(plot_learning(args.run_dirs, args.out, x=args.x))
    except ValueError as error:  # bad input: a usage error, not a traceback
        parser.error(str(error))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
