"""A whole multi-rank run scoring through a reward server: ``separate-sync`` on two ranks with
``reward=remote`` against ``python -m digenrl.rewards.serve`` (the session's: tests/conftest.py), next to
the same run with the served reward in-process. The generator rank posts each fragment's decoded images;
the rewards agree up to the 8-bit pixels the wire carries."""

from __future__ import annotations

import pytest

from digenrl.runtime.observe.metrics import read_metrics
from tests.systems.launcher import run_train

RUN = [
    "system=separate-sync",
    "profile=cpu-2",
    "pools.trainers=1",
    "pools.generators=1",
    "iterations=2",
    "seed=3",
]


def test_separate_sync_scores_through_a_reward_server(tmp_path, tiny_clipscore_server):
    remote = ["reward=remote", f"reward.url={tiny_clipscore_server}", "reward.timeout_s=60"]
    run_train([*RUN, *remote, f"out_dir={tmp_path / 'remote'}"], nproc=2)
    run_train([*RUN, "reward=tiny-clipscore", f"out_dir={tmp_path / 'local'}"], nproc=2)
    served, local = read_metrics(tmp_path / "remote"), read_metrics(tmp_path / "local")
    assert len(served) == len(local) == 2
    # iteration 0: the same trajectories (same initial weights and seeds), scored on 8-bit vs float pixels
    assert served[0]["reward_mean"] == pytest.approx(local[0]["reward_mean"], abs=5e-3)
    assert served[0]["reward_mean"] > 0 and served[0]["samples"] == 16
    assert all(m["reward_std"] > 0 for m in served)  # real scores, one per sample, not a constant
