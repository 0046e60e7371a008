"""Unit sharding: the shards of a batch hold each (sample, trained step) exactly once, balanced to ±1
and timestep-major; and — with a real tiny SD3 policy — training on the shards of the fragments of a
batch gives the gradient of training on the whole batch."""

from __future__ import annotations

import copy
import random
from collections import Counter

import pytest
import torch

from digenrl.data.text_condition import TextCondition
from digenrl.data.trajectory import TrajectoryBatch
from digenrl.gap.fragments import FragmentPlan
from digenrl.gap.unit_packer import UnitPacker
from digenrl.gap.unit_sharding import plan_unit_shards, shard_units
from digenrl.trainer import PolicyTrainer
from tests.trainer.fixtures import grads_by_name, perturb_adapter
from tests.tsp.fixtures import PROMPTS, bundle, make_config, make_engine


def _synthetic(b: int, k: int, t: int, *, shared_steps: bool) -> TrajectoryBatch:
    """Random fields; trained steps shared by all samples ('first'-like) or drawn per sample."""
    if shared_steps:
        steps = torch.arange(k).expand(b, -1).clone()
    else:
        steps = torch.stack([torch.randperm(t)[:k].sort().values for _ in range(b)])
    return TrajectoryBatch(
        prompts=[f"p{i}" for i in range(b)],
        prompt_ids=torch.arange(b) // 2,
        sample_ids=torch.arange(b) % 2,
        seeds=torch.randperm(10_000)[:b],
        cond=TextCondition(embeds=torch.randn(b, 3, 4), pooled=torch.randn(b, 4)),
        latents=torch.randn(b, k, 2, 3),
        next_latents=torch.randn(b, k, 2, 3),
        log_probs=torch.randn(b, k),
        step_indices=steps,
        sigmas=torch.rand(b, k),
        next_sigmas=torch.rand(b, k),
        policy_version=torch.randint(0, 5, (b,)),
        iteration=random.randint(0, 99),
        final_latents=torch.randn(b, 2, 3),
        rewards=torch.randn(b),
        advantages=torch.randn(b),
        steps_done=t,
    )


@pytest.mark.parametrize("shared_steps", [True, False])
def test_shards_cover_every_unit_once_balanced_and_timestep_major(shared_steps):
    for _ in range(25):
        b, t = random.randint(1, 7), random.randint(3, 8)
        k, n = random.randint(1, t), random.randint(1, 12)
        batch = _synthetic(b, k, t, shared_steps=shared_steps)
        shards = shard_units(batch, n)
        assert len(shards) == n
        sizes = [s.batch_size for s in shards]
        assert sum(sizes) == b * k and max(sizes) - min(sizes) <= 1
        where = {
            (int(batch.seeds[i]), int(batch.step_indices[i, j])): (i, j) for i in range(b) for j in range(k)
        }
        got = Counter(
            (int(s.seeds[u]), int(s.step_indices[u, 0])) for s in shards for u in range(s.batch_size)
        )
        assert got == Counter(where.keys())  # each (seed, step) exactly once over all shards
        order = [int(s.step_indices[u, 0]) for s in shards for u in range(s.batch_size)]
        assert order == sorted(order)  # timestep-major across (and within) shards
        for s in shards:
            assert s.num_train_steps == 1 and s.final_latents is None and s.steps_done == t
            assert s.num_units == s.batch_size
            for u in range(s.batch_size):
                i, j = where[(int(s.seeds[u]), int(s.step_indices[u, 0]))]
                assert torch.equal(s.latents[u, 0], batch.latents[i, j])
                assert torch.equal(s.next_latents[u, 0], batch.next_latents[i, j])
                for name in ("log_probs", "sigmas", "next_sigmas"):
                    assert getattr(s, name)[u, 0] == getattr(batch, name)[i, j], name
                for name in ("advantages", "rewards", "prompt_ids", "sample_ids", "policy_version"):
                    assert getattr(s, name)[u] == getattr(batch, name)[i], name
                assert (
                    torch.equal(s.cond.embeds[u], batch.cond.embeds[i]) and s.prompts[u] == batch.prompts[i]
                )
            if shared_steps and s.batch_size <= b:
                assert len(set(s.seeds.tolist())) == s.batch_size  # no sample's conditioning repeated


def test_plan_is_contiguous_runs_and_empty_shards_are_valid_batches():
    steps = torch.tensor([[0, 2], [1, 2]])
    assert plan_unit_shards(steps, 3) == [[(0, 0), (1, 0)], [(0, 1)], [(1, 1)]]
    batch = _synthetic(2, 1, 4, shared_steps=True)
    shards = shard_units(batch, 4)
    assert [s.batch_size for s in shards] == [1, 1, 0, 0]
    assert shards[2].latents.shape == (0, 1, 2, 3) and shards[2].cond.batch_size == 0
    assert shard_units(batch, 1, keep_final_latents=True)[0].final_latents.shape == (2, 2, 3)
    with pytest.raises(ValueError, match="num_shards must be an int >= 1"):
        shard_units(batch, 0)
    with pytest.raises(ValueError, match=r"k_index must lie in \[0, 1\)"):
        batch.select_units([0], [1])
    with pytest.raises(ValueError, match="same length"):
        batch.select_units([0, 1], [0])


# ----------------------------------------------------------------------------- real policy gradient

PROMPTS_PER_ITERATION = 4
TRAIN = [
    "trainer.lora_rank=4",
    "trainer.lora_alpha=8",
    "trainer.backend=auto",
    "algo.clip_range=1e-4",
    "algo.kl_beta=0.04",
    "sampler.guidance_scale=3.0",
]


@pytest.fixture(scope="module")
def rollout_and_trainer():
    cfg = make_config(*TRAIN, f"seed={random.randint(0, 999)}")
    engine = make_engine(cfg)
    batch = engine.generate(
        random.sample(PROMPTS, PROMPTS_PER_ITERATION),
        list(range(PROMPTS_PER_ITERATION)),
        iteration=random.randint(0, 99),
        policy_version=0,
    )
    batch.rewards = torch.randn(batch.batch_size)
    batch.advantages = torch.randn(batch.batch_size)
    model = copy.deepcopy(bundle().flow_model)
    uncond = bundle().text_encoder.negative_condition(1)
    trainer = PolicyTrainer(cfg, model, engine.sampler, uncond=uncond, device="cpu")
    perturb_adapter(model)  # θ ≠ the behaviour policy: ratios ≠ 1, some clipped, non-zero KL
    return batch, trainer


def _fragments(batch: TrajectoryBatch, fragment_groups: int) -> list[TrajectoryBatch]:
    plan = FragmentPlan(PROMPTS_PER_ITERATION, fragment_groups, num_pipelines=2)
    ids = batch.prompt_ids.tolist()
    return [
        batch.select([i for i, pid in enumerate(ids) if pid in plan.prompt_ids(f)])
        for f in range(plan.num_fragments)
    ]


@pytest.mark.parametrize(
    ("num_shards", "fragment_groups", "micro_batch_size"),
    [(1, 4, 8), (2, 1, 4), (3, 2, 2), (5, 1, 3), (7, 4, 5), (16, 2, 1)],
)
def test_sharded_fragment_gradients_sum_to_the_whole_batch_gradient(
    rollout_and_trainer, num_shards, fragment_groups, micro_batch_size
):
    batch, trainer = rollout_and_trainer
    weight = 1.0 / batch.num_units  # 8 samples x 3 trained steps = 24 units
    trainer.zero_grad()
    trainer.cfg.trainer.micro_batch_size = 4
    whole = trainer.accumulate(batch, weight)
    reference = grads_by_name(trainer)
    trainer.zero_grad()

    trainer.cfg.trainer.micro_batch_size = micro_batch_size
    units = loss = kl = 0.0
    calls = []

    def train(shard: TrajectoryBatch) -> None:
        nonlocal units, loss, kl
        stats = trainer.accumulate(shard, weight)
        units, loss, kl = units + stats["units"], loss + stats["loss_sum"], kl + stats["kl_sum"]
        calls.append(shard.batch_size)

    # every rank's shards of every fragment, in whole micro-batches across fragment boundaries (UnitPacker)
    for rank in range(num_shards):
        packer = UnitPacker(train, micro_batch_size, enabled=True)
        for f, fragment in enumerate(_fragments(batch, fragment_groups)):
            packer.add(shard_units(fragment, num_shards, offset=f * fragment.num_units)[rank])
        before_flush = len(calls)
        packer.flush()
        # whole micro-batches until the iteration's end; only the flush may be partial
        assert all(size % micro_batch_size == 0 for size in calls[:before_flush])
        del calls[:]
    sharded = grads_by_name(trainer)
    trainer.zero_grad()

    assert units == whole["units"] == batch.num_units
    assert loss == pytest.approx(whole["loss_sum"], rel=1e-5, abs=1e-6)
    assert kl == pytest.approx(whole["kl_sum"], rel=1e-5) and whole["kl_sum"] > 0
    assert whole["clipped_count"] > 0  # the clip branch is exercised
    assert reference.keys() == sharded.keys() and reference
    assert max(float(g.abs().max()) for g in reference.values()) > 1e-4  # a real gradient
    for name in reference:
        torch.testing.assert_close(sharded[name], reference[name], rtol=0, atol=1e-6, msg=name)
