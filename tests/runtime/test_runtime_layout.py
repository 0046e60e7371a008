"""Layouts: role assignment, every start-up error, and pool process groups in a real 3-process gloo world."""

from __future__ import annotations

import json
import random
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from digenrl.config import ConfigError, PoolConfig
from digenrl.runtime.launch.layout import Layout, build_layout, build_process_groups
from tests.runtime.spawn import spawn_workers


def test_all_zero_pools_are_colocated():
    world = random.randint(1, 8)
    layout = build_layout(PoolConfig(), world, needs_scorer_model=False)
    assert layout.kind == "colocated" and layout.is_colocated
    assert layout.trainer_ranks == layout.generator_ranks == tuple(range(world))
    assert layout.scorer_ranks == ()
    assert [layout.role_of(r) for r in range(world)] == ["colocated"] * world


def test_separate_pools_take_consecutive_ranks():
    t, g, s = random.randint(1, 3), random.randint(1, 3), random.randint(0, 2)
    world = t + g + s
    layout = build_layout(PoolConfig(t, g, s), world, needs_scorer_model=True)
    assert layout.kind == "separate" and not layout.is_colocated
    assert layout.trainer_ranks == tuple(range(t))
    assert layout.generator_ranks == tuple(range(t, t + g))
    assert layout.scorer_ranks == tuple(range(t + g, world))
    roles = [layout.role_of(r) for r in range(world)]
    assert roles == ["trainer"] * t + ["generator"] * g + ["scorer"] * s
    assert layout.sync_source == 0
    assert layout.sync_ranks == (0, *range(t, t + g))
    assert layout.ranks_of("generator") == layout.generator_ranks
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, "):
        layout.role_of(world)
    with pytest.raises(ValueError, match="role='reward' is not a pool"):
        layout.ranks_of("reward")


@pytest.mark.parametrize(
    ("pools", "world", "needs_model", "pattern"),
    [
        (
            PoolConfig(1, 1, 0),
            3,
            False,
            r"pools\.trainers \+ pools\.generators \+ pools\.scorers = 2 but torchrun started 3 ranks",
        ),
        (
            PoolConfig(2, 2, 0),
            3,
            False,
            r"pools\.trainers \+ pools\.generators \+ pools\.scorers = 4 exceeds the 3 ranks",
        ),
        (PoolConfig(0, 2, 0), 2, False, r"pools\.trainers=0 in a separate layout"),
        (PoolConfig(2, 0, 0), 2, False, r"pools\.generators=0 in a separate layout"),
        (PoolConfig(-1, 2, 0), 1, False, r"pools\.trainers must be an integer >= 0, got -1"),
        (PoolConfig(1, 1, -2), 2, False, r"pools\.scorers must be an integer >= 0, got -2"),
        (
            PoolConfig(1, 1, 1),
            3,
            False,
            r"pools\.scorers=1 but reward\.name='brightness' needs no reward model",
        ),
    ],
)
def test_startup_errors_name_the_keys(pools, world, needs_model, pattern):
    with pytest.raises(ConfigError, match=pattern):
        build_layout(pools, world, needs_scorer_model=needs_model, reward_name="brightness")


def test_scorers_error_without_reward_name_still_names_the_key():
    with pytest.raises(ConfigError, match=r"pools\.scorers=2 but the configured reward\.name"):
        build_layout(PoolConfig(1, 1, 2), 4, needs_scorer_model=False)


def test_bad_world_size_and_kind():
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        build_layout(PoolConfig(), 0, needs_scorer_model=False)
    with pytest.raises(ValueError, match=r"Layout\.kind='mixed' is not allowed"):
        Layout("mixed", 2, (0,), (1,))


def test_single_process_groups_are_all_none():
    assert not dist.is_initialized()
    groups = build_process_groups(build_layout(PoolConfig(), 1, needs_scorer_model=False))
    assert groups.trainer_group is groups.generator_group is groups.scorer_group is groups.sync_group is None
    assert groups.this_rank_pool_group() is None
    with pytest.raises(ValueError, match=r"torch\.distributed is not initialised"):
        build_process_groups(build_layout(PoolConfig(1, 1, 0), 2, needs_scorer_model=False))


# ----------------------------------------------------------------------------- 3 processes


def _sum_of_ranks(group) -> int:
    value = torch.tensor([dist.get_rank()], dtype=torch.int64)
    dist.all_reduce(value, group=group)
    return int(value)


def _worker(rank: int, world: int, tmp: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    try:
        layout = build_layout(PoolConfig(1, 1, 1), world, needs_scorer_model=True)
        groups = build_process_groups(layout, timeout_s=30)
        out: dict = {"role": layout.role_of(rank)}
        for name in ("trainer_group", "generator_group", "scorer_group", "sync_group"):
            group = getattr(groups, name)
            out[name] = None if group is None else _sum_of_ranks(group)
        pool = groups.this_rank_pool_group()
        out["pool_sum"] = _sum_of_ranks(pool)
        out["other_pool_is_none"] = groups.this_rank_pool_group((rank + 1) % world) is None
        colocated = build_process_groups(build_layout(PoolConfig(), world, needs_scorer_model=False))
        out["colocated_world"] = colocated.trainer_group is dist.group.WORLD
        out["colocated_same"] = colocated.generator_group is colocated.trainer_group
        out["colocated_sync_none"] = colocated.sync_group is None
        out["colocated_sum"] = _sum_of_ranks(colocated.this_rank_pool_group())
        Path(tmp, f"rank{rank}.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_process_groups_in_three_processes(tmp_path):
    spawn_workers(_worker, 3, (str(tmp_path),))
    out = [json.loads(Path(tmp_path, f"rank{r}.json").read_text()) for r in range(3)]
    assert [o["role"] for o in out] == ["trainer", "generator", "scorer"]
    # a group's all-reduce of ranks sums exactly its members; non-members hold no handle
    assert [o["trainer_group"] for o in out] == [0, None, None]
    assert [o["generator_group"] for o in out] == [None, 1, None]
    assert [o["scorer_group"] for o in out] == [None, None, 2]
    assert [o["sync_group"] for o in out] == [1, 1, None]  # trainer rank 0 + generator rank 1
    assert [o["pool_sum"] for o in out] == [0, 1, 2]
    assert all(o["other_pool_is_none"] for o in out)
    for o in out:
        assert o["colocated_world"] and o["colocated_same"] and o["colocated_sync_none"]
        assert o["colocated_sum"] == 0 + 1 + 2
