"""Ulysses sequence parallelism (digenrl/models/sequence_parallel.py): the sharded tiny Wan transformer gives
the unsharded one's velocity and, summed over the group, its parameter gradients; bad degrees are refused
naming the key."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from digenrl.config import Config, ConfigError
from digenrl.data.text_condition import TextCondition
from digenrl.models.sequence_parallel import sequence_parallel_problem
from digenrl.models.specs import get_model_spec
from digenrl.validation import validate_config
from tests.runtime.spawn import spawn_workers


def test_degree_one_is_always_fine():
    assert (
        sequence_parallel_problem(get_model_spec("hunyuan-video"), 1, 7, "trainer.sequence_parallel") is None
    )


def test_heads_tokens_and_plan_are_checked():
    wan14 = get_model_spec("wan2.1-14b")  # 40 heads
    assert sequence_parallel_problem(wan14, 8, 32760, "trainer.sequence_parallel") is None
    heads = sequence_parallel_problem(wan14, 3, 32760, "trainer.sequence_parallel")
    assert "trainer.sequence_parallel=3" in heads and "40 attention heads" in heads
    tokens = sequence_parallel_problem(wan14, 8, 32761, "sampler.sequence_parallel")
    assert "sampler.sequence_parallel=8" in tokens and "32761 tokens" in tokens
    plan = sequence_parallel_problem(get_model_spec("hunyuan-video"), 2, 32760, "trainer.sequence_parallel")
    assert "no diffusers context-parallel plan" in plan and "trainer.sequence_parallel=1" in plan


def _cfg(**overrides: object) -> Config:
    cfg = Config()
    cfg.model.name = "tiny-wan"
    cfg.system = "colocated-sync"
    cfg.profile = "cpu-2"
    cfg.trainer.sequence_parallel = cfg.sampler.sequence_parallel = 2
    for key, value in overrides.items():
        section, name = key.split("__")
        setattr(getattr(cfg, section), name, value)
    return cfg


@pytest.mark.parametrize(
    ("overrides", "world", "message"),
    [
        ({"sampler__sequence_parallel": 1}, 2, "differ"),
        ({"trainer__backend": "fsdp2"}, 2, "trainer.backend=fsdp2"),
        ({}, 3, "does not divide the pool's 3 ranks"),
        ({"model__height": 48, "model__width": 48, "model__frames": 1}, 2, "does not divide the 9 tokens"),
    ],
)
def test_startup_errors_name_the_key(overrides, world, message):
    cfg = _cfg(**overrides)
    with pytest.raises(ConfigError, match="sequence_parallel") as error:
        validate_config(cfg, world)
    assert message in str(error.value)


def test_other_systems_are_refused():
    cfg = _cfg()
    cfg.system = "digenrl"
    with pytest.raises(ConfigError, match="runs under system=colocated-sync or separate-sync so far"):
        validate_config(cfg)


def test_separate_pools_are_checked_each_with_its_own_degree():
    cfg = _cfg()
    cfg.system, cfg.profile = "separate-sync", "cpu-4"
    cfg.pools.trainers, cfg.pools.generators = 1, 3
    cfg.trainer.sequence_parallel = 1
    with pytest.raises(ConfigError, match=r"sampler\.sequence_parallel=2 does not divide the pool.s 3 ranks"):
        validate_config(cfg, 4)
    cfg.pools.trainers, cfg.pools.generators = 2, 2
    cfg.sampler.sequence_parallel, cfg.trainer.sequence_parallel = 1, 2  # they may differ on disjoint pools
    validate_config(cfg, 4)
    cfg.pools.trainers, cfg.pools.generators, cfg.pools.scorers = 2, 1, 1
    with pytest.raises(ConfigError, match=r"trainer\.sequence_parallel=2 with pools\.scorers=1"):
        validate_config(cfg)


def test_a_group_across_nodes_is_refused(tmp_path):
    cpu2 = Path(__file__).parents[2] / "digenrl/runtime/hardware/hardware_profiles/cpu-2.yaml"
    text = cpu2.read_text().replace("{count: 1, workers_per_node: 2", "{count: 2, workers_per_node: 1")
    assert "count: 2, workers_per_node: 1" in text
    profile = tmp_path / "two-nodes.yaml"
    profile.write_text(text.replace("name: cpu-2", "name: two-nodes"))
    cfg = _cfg()
    cfg.profile = str(profile)
    with pytest.raises(ConfigError, match=r"trainer\.sequence_parallel=2: ranks 0-1 span nodes"):
        validate_config(cfg, 2)


# ----------------------------------------------------------------------------- 2 processes


def _velocity_and_grads(flow_model, latents, sigma, cond) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    flow_model.zero_grad()
    v = flow_model(latents, sigma, cond)
    (v.float() * torch.linspace(-1, 1, v.numel()).view_as(v)).sum().backward()  # a loss touching every token
    return v.detach(), {n: p.grad.clone() for n, p in flow_model.transformer.named_parameters()}


def _worker(rank: int, world: int, tmp: str) -> None:
    from digenrl.models.flow_model import build_flow_model
    from digenrl.models.sequence_parallel import enable_sequence_parallel
    from digenrl.runtime.comm.sequence_groups import build_sequence_groups

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    try:
        torch.manual_seed(0)
        reference = build_flow_model("tiny-wan")
        sharded = build_flow_model("tiny-wan")
        sharded.load_state_dict(reference.state_dict())
        groups = build_sequence_groups(range(world), world, timeout_s=60)
        enable_sequence_parallel(sharded, groups.sequence_group, groups.single_rank_group)
        latents = torch.randn(2, *reference.latent_shape(32, 32, 5))  # [2, 4, 2, 4, 4]
        cond = TextCondition(torch.randn(2, 16, 32))
        sigma = torch.tensor([0.3, 0.8])
        v_ref, g_ref = _velocity_and_grads(reference, latents, sigma, cond)
        v_sp, g_sp = _velocity_and_grads(sharded, latents, sigma, cond)
        partial_differs = max((g_sp[n] - g_ref[n]).abs().max().item() for n in g_ref)
        for grad in g_sp.values():  # the group's sum is the full gradient (module doc, "Gradients")
            dist.all_reduce(grad, group=groups.sequence_group)
        out = {
            "tokens_per_rank": None,
            "velocity": (v_sp - v_ref).abs().max().item(),
            "velocity_scale": v_ref.abs().max().item(),
            "grad": max(
                ((g_sp[n] - g_ref[n]).abs().max() / g_ref[n].abs().max().clamp_min(1e-12)).item()
                for n in g_ref
            ),
            "partial_differs": partial_differs,
        }
        seen = []
        hook = sharded.transformer.blocks[0].register_forward_hook(lambda m, i, o: seen.append(o.shape[1]))
        with torch.no_grad():
            sharded(latents, sigma, cond)
        hook.remove()
        out["tokens_per_rank"] = seen[0]
        Path(tmp, f"rank{rank}.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_ulysses_forward_and_gradient_equal_the_unsharded_model(tmp_path):
    spawn_workers(_worker, 2, (str(tmp_path),))
    for rank in range(2):
        out = json.loads(Path(tmp_path, f"rank{rank}.json").read_text())
        # 8 tokens (2 latent frames x 2 x 2 patches), half on each rank: the sequence really is sharded
        assert out["tokens_per_rank"] == 4
        assert out["velocity"] <= 1e-5 * out["velocity_scale"]
        assert out["grad"] < 1e-4  # relative, per parameter tensor
        assert out["partial_differs"] > 1e-3  # one rank's gradient alone is not the full one
