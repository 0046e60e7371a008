"""Trainer → generator weight sync: checksum and bucket helpers in one process, then a real 3-process gloo
world (1 trainer + 2 generators, and 2 FSDP2 trainers + 1 generator) with the tiny SD3 model."""

from __future__ import annotations

import itertools
import random
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist

from digenrl.config import Config, PoolConfig, SyncConfig, apply_overrides
from digenrl.runtime.comm.control_plane import ControlPlane
from digenrl.runtime.comm.weight_sync import (
    SyncStats,
    TensorSpec,
    WeightSync,
    WeightSyncError,
    checksum_digest,
    generator_sync_parameters,
    manifest_digests,
    plan_buckets,
    resolve_sync_mode,
    tensor_checksum,
)
from digenrl.runtime.launch.layout import build_layout, build_process_groups
from digenrl.trainer.lora import prepare_generator_model
from tests.runtime.spawn import spawn_workers

MODEL = "tiny-sd3"

# ----------------------------------------------------------------------------- checksum


def _reference_checksum(t: torch.Tensor) -> tuple[int, int]:
    """Independent reference: Python integers over the little-endian 16-bit words of the bytes."""
    data = t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    if len(data) % 2:
        data += b"\0"
    words = np.frombuffer(data, dtype="<u2").astype(object)
    s0 = int(sum(words))
    s1 = int(sum(int(w) * (i % 251 + 1) for i, w in enumerate(words)))
    return s0, s1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.uint8])
def test_checksum_matches_the_integer_reference(dtype):
    n = random.randint(1, 700) * 2 + 1  # odd element counts too (uint8 pads one byte)
    t = (torch.randn(n) * 100).to(dtype)
    assert tensor_checksum(t).tolist() == list(_reference_checksum(t))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_checksum_detects_any_single_flipped_bit_and_changed_value(dtype):
    t = torch.randn(random.randint(2, 64), random.randint(2, 64)).to(dtype)
    base = tensor_checksum(t)
    int_dtype = torch.int32 if dtype == torch.float32 else torch.int16
    bits = 32 if dtype == torch.float32 else 16
    for _ in range(50):
        flipped = t.clone()
        ints = flipped.view(-1).view(int_dtype)
        pos, bit = random.randrange(ints.numel()), random.randrange(bits)
        ints[pos] ^= torch.tensor(1 << bit if bit < bits - 1 else -(1 << bit), dtype=int_dtype)
        assert not torch.equal(tensor_checksum(flipped), base), (pos, bit)
        changed = t.clone()
        flat = changed.view(-1)
        pos = random.randrange(flat.numel())
        new = torch.randn(()).to(dtype)
        if new.view(int_dtype) == flat[pos].view(int_dtype):
            continue
        flat[pos] = new
        assert not torch.equal(tensor_checksum(changed), base)
    assert torch.equal(tensor_checksum(t.clone()), base)  # deterministic
    assert checksum_digest(torch.stack([base])) == checksum_digest(torch.stack([base.clone()]))


# ----------------------------------------------------------------------------- manifest, buckets, modes


def test_plan_buckets_keeps_order_dtype_runs_and_size_limit():
    dtypes = [torch.float32, torch.bfloat16, torch.float16]
    specs = [
        TensorSpec(f"t{i:02d}", (random.randint(1, 40),), random.choice(dtypes[: random.randint(1, 3)]))
        for i in range(30)
    ]
    limit = random.randint(20, 120)
    buckets = plan_buckets(specs, limit)
    assert [i for b in buckets for i in b] == list(range(len(specs)))
    for bucket in buckets:
        assert len({specs[i].dtype for i in bucket}) == 1
        size = sum(specs[i].nbytes for i in bucket)
        assert size <= limit or len(bucket) == 1
    for a, b in itertools.pairwise(buckets):  # greedy: the next tensor did not fit or changed dtype
        nxt = specs[b[0]]
        assert nxt.dtype != specs[a[0]].dtype or sum(specs[i].nbytes for i in a) + nxt.nbytes > limit
    with pytest.raises(ValueError, match="bucket_bytes must be > 0"):
        plan_buckets(specs, 0)


def test_manifest_digests_see_names_shapes_and_dtypes():
    specs = [TensorSpec("a.weight", (4, 3), torch.float32), TensorSpec("b.bias", (3,), torch.float32)]
    shapes, dtypes = manifest_digests(specs)
    renamed = [TensorSpec("a.weight", (4, 3), torch.float32), TensorSpec("c.bias", (3,), torch.float32)]
    reshaped = [TensorSpec("a.weight", (3, 4), torch.float32), specs[1]]
    recast = [TensorSpec("a.weight", (4, 3), torch.bfloat16), specs[1]]
    assert manifest_digests(renamed)[0] != shapes
    assert manifest_digests(reshaped)[0] != shapes
    assert (
        manifest_digests(recast) == (shapes, manifest_digests(recast)[1])
        and manifest_digests(recast)[1] != dtypes
    )
    assert 0 <= shapes < 2**63


def test_resolve_sync_mode():
    assert resolve_sync_mode(apply_overrides(Config(), ["trainer.mode=lora"])) == "lora"
    assert resolve_sync_mode(apply_overrides(Config(), ["trainer.mode=full"])) == "full"
    assert resolve_sync_mode(apply_overrides(Config(), ["trainer.mode=full", "sync.mode=full"])) == "full"
    with pytest.raises(ValueError, match=r"sync\.mode='lora' does not fit trainer\.mode='full'"):
        resolve_sync_mode(apply_overrides(Config(), ["trainer.mode=full", "sync.mode=lora"]))
    with pytest.raises(ValueError, match=r"sync\.mode='adapter' is not allowed"):
        resolve_sync_mode(apply_overrides(Config(), ["sync.mode=adapter"]))


def test_weight_sync_refuses_a_colocated_layout():
    layout = build_layout(PoolConfig(), 1, needs_scorer_model=False)
    with pytest.raises(ValueError, match="colocated layout needs no weight sync"):
        WeightSync(
            SyncConfig(), layout=layout, groups=build_process_groups(layout), device="cpu", mode="full"
        )


def test_prepare_generator_model_mirrors_the_trainer_adapter():
    from digenrl.models import build_flow_model
    from digenrl.trainer import PolicyTrainer

    cfg = _config("lora")
    trainer_model = build_flow_model(MODEL)
    trainer = PolicyTrainer(cfg, trainer_model, _sampler(cfg, trainer_model), uncond=None, device="cpu")
    generator = prepare_generator_model(build_flow_model(MODEL), cfg)
    synced = generator_sync_parameters(generator, "lora")
    trained = sorted(trainer.backend.named_trainable(), key=lambda item: item[0])
    assert [(n, tuple(p.shape)) for n, p in synced] == [(n, tuple(p.shape)) for n, p in trained]
    # frozen, but in the trainer's module mode: a generator rank runs the forward a colocated rank runs
    assert not any(p.requires_grad for p in generator.parameters())
    assert generator.training == trainer_model.training
    full = generator_sync_parameters(generator, "full")
    assert len(full) == len(list(generator.transformer.parameters()))
    with pytest.raises(ValueError, match="has no LoRA adapter"):
        generator_sync_parameters(build_flow_model(MODEL), "lora")


# ----------------------------------------------------------------------------- 3 processes


def _config(mode: str, *extra: str) -> Config:
    return apply_overrides(
        Config(),
        [
            f"model.name={MODEL}",
            f"trainer.mode={mode}",
            "trainer.lora_rank=4",
            "trainer.lora_alpha=8",
            "sampler.num_steps=4",
            "sampler.guidance_scale=1.0",
            *extra,
        ],
    )


def _sampler(cfg: Config, flow_model):
    from digenrl.rollout.sampler import Sampler

    return Sampler.from_config(cfg, flow_model.spec, flow_model.token_count(32, 32))


def _model(seed: int, dtype=torch.float32):
    from digenrl.models import build_flow_model

    torch.manual_seed(seed)
    return build_flow_model(MODEL, dtype=dtype)


def _trainer(cfg: Config, seed: int, groups, world_size: int):
    from digenrl.trainer import PolicyTrainer

    model = _model(seed)
    return PolicyTrainer(
        cfg,
        model,
        _sampler(cfg, model),
        uncond=None,
        device="cpu",
        process_group=groups.trainer_group,
        world_size=world_size,
    )


@torch.no_grad()
def _perturb(trainer, seed: int) -> None:
    """Move every trainable tensor (each rank its own shard) so the trainer differs from any generator."""
    g = torch.Generator().manual_seed(seed)
    for _, p in trainer.backend.named_trainable():
        local = p.to_local() if hasattr(p, "to_local") else p
        local.add_(torch.randn(local.shape, generator=g).to(local.dtype) * 0.05)


def _snapshot(named) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in named}


def _expect_error(fn, kind: type[Exception] = WeightSyncError) -> str:
    try:
        fn()
    except kind as error:
        return f"{type(error).__name__}: {error}"
    return "no error"


def _worker(rank: int, world: int, tmp: str, seed: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    plane = ControlPlane(dist.FileStore(f"{tmp}/plane", world), rank, "sync-test", 30.0, namespace="ws")
    out: dict = {}
    try:
        one_trainer = build_layout(PoolConfig(1, 2, 0), world, needs_scorer_model=False)
        two_trainers = build_layout(PoolConfig(2, 1, 0), world, needs_scorer_model=False)
        groups_a = build_process_groups(one_trainer)
        groups_b = build_process_groups(two_trainers)
        is_trainer = rank == 0

        def sync(mode, *, bucket_mb=64.0, verify=True, plane_=None):
            return WeightSync(
                SyncConfig(bucket_mb=bucket_mb, verify_checksum=verify),
                layout=one_trainer,
                groups=groups_a,
                device="cpu",
                mode=mode,
                plane=plane_,
            )

        # -- full, fp32 both sides, ~10 KB buckets, version announced on the store --------------------
        cfg = _config("full")
        ws = sync("full", bucket_mb=0.01, plane_=plane)
        if is_trainer:
            trainer = _trainer(cfg, seed, groups_a, 1)
            _perturb(trainer, seed + 1)
            out["full"] = {"stats": ws.push(trainer, 1), "state": trainer.trainable_state_dict()}
        else:
            model = prepare_generator_model(_model(seed + 10 + rank), cfg)
            before = _snapshot(generator_sync_parameters(model, "full"))
            announced = plane.wait_version("policy", 1, peer=0, timeout_s=30)
            stats = ws.pull(model, 1)
            out["full"] = {
                "stats": stats,
                "before": before,
                "after": _snapshot(generator_sync_parameters(model, "full")),
                "announced": announced,
                "pending": ws.pending_version(),
                "version": stats.version,
            }

        # -- full, fp32 trainer → bf16 generators (wire dtype = the generators') -------------------------
        ws = sync("full")
        if is_trainer:
            trainer = _trainer(cfg, seed, groups_a, 1)
            _perturb(trainer, seed + 2)
            out["bf16"] = {"stats": ws.push(trainer, 1), "state": trainer.trainable_state_dict()}
        else:
            model = prepare_generator_model(_model(seed + 20 + rank, torch.bfloat16), cfg)
            stats = ws.pull(model, 1)
            out["bf16"] = {"stats": stats, "after": _snapshot(generator_sync_parameters(model, "full"))}

        # -- LoRA: two syncs in a row; the base weights stay untouched ---------------------------------------
        cfg = _config("lora")
        ws = sync("lora")
        if is_trainer:
            trainer = _trainer(cfg, seed, groups_a, 1)
            states, stats = [], []
            for version in (1, 2):
                _perturb(trainer, seed + 30 + version)
                stats.append(ws.push(trainer, version))
                states.append(trainer.trainable_state_dict())
            out["lora"] = {"stats": stats, "states": states}
        else:
            model = prepare_generator_model(_model(seed), cfg)  # the same base weights as the trainer
            base = {n: p.clone() for n, p in model.transformer.named_parameters() if "lora_" not in n}
            stats, afters = [], []
            for version in (1, 2):
                stats.append(ws.pull(model, version))
                afters.append(_snapshot(generator_sync_parameters(model, "lora")))
            base_after = {n: p for n, p in model.transformer.named_parameters() if "lora_" not in n}
            out["lora"] = {
                "stats": stats,
                "afters": afters,
                "base_unchanged": all(torch.equal(base[n], base_after[n]) for n in base),
            }

        # -- a corrupted value on generator rank 2 after the broadcast --------------------------------------
        corrupt_name = "transformer_blocks.0.attn.to_k.lora_B.default.weight"

        def corrupt(named):
            tensor = dict(named)[corrupt_name]
            flat = tensor.view(-1)
            flat[random.randrange(flat.numel())] += 1e-3

        for verify in (True, False):
            ws = sync("lora", verify=verify)
            if is_trainer:
                trainer = _trainer(cfg, seed, groups_a, 1)
                _perturb(trainer, seed + 40)
                out[f"corrupt-{verify}"] = {
                    "error": _expect_error(lambda ws=ws, trainer=trainer: ws.push(trainer, 3)),
                    "state": trainer.trainable_state_dict(),
                }
            else:
                model = prepare_generator_model(_model(seed), cfg)
                if rank == 2:
                    ws.after_receive_hook = corrupt
                result = {}

                def pull(ws=ws, model=model, result=result):
                    result["stats"] = ws.pull(model, 3)

                result["error"] = _expect_error(pull)
                result["after"] = _snapshot(generator_sync_parameters(model, "lora"))
                out[f"corrupt-{verify}"] = result

        # -- version mismatch: generator rank 2 expects 5, the trainer pushes 4 ------------------------------
        ws = sync("lora")
        if is_trainer:
            trainer = _trainer(cfg, seed, groups_a, 1)
            out["version"] = _expect_error(lambda: ws.push(trainer, 4))
        else:
            model = prepare_generator_model(_model(seed), cfg)
            out["version"] = _expect_error(lambda: ws.pull(model, 4 if rank == 1 else 5))

        # -- structure mismatch: generator rank 2 built its adapter with another rank ------------------------
        ws = sync("lora")
        if is_trainer:
            trainer = _trainer(cfg, seed, groups_a, 1)
            out["manifest"] = _expect_error(lambda: ws.push(trainer, 1))
        else:
            gen_cfg = cfg if rank == 1 else _config("lora", "trainer.lora_rank=2")
            model = prepare_generator_model(_model(seed), gen_cfg)
            out["manifest"] = _expect_error(lambda: ws.pull(model, 1))

        # -- two FSDP2 trainer ranks (full fine-tune) → one generator ----------------------------------------
        cfg = _config("full", "trainer.backend=fsdp2")
        ws = WeightSync(
            SyncConfig(bucket_mb=0.02), layout=two_trainers, groups=groups_b, device="cpu", mode="full"
        )
        if rank in two_trainers.trainer_ranks:
            trainer = _trainer(cfg, seed, groups_b, 2)
            _perturb(trainer, seed + 50 + rank)  # each rank moves its own shard
            stats = ws.push(trainer, 7)
            out["fsdp2"] = {
                "stats": stats,
                "state": trainer.trainable_state_dict(),
                "backend": trainer.backend.name,
                # a failed handshake on the source also fails the other trainer rank (no hang in a gather)
                "failure": _expect_error(lambda: ws.push(trainer, 8)),
            }
        else:
            model = prepare_generator_model(_model(seed + 60), cfg)
            stats = ws.pull(model, 7)
            out["fsdp2"] = {
                "stats": stats,
                "after": _snapshot(generator_sync_parameters(model, "full")),
                "failure": _expect_error(lambda: ws.pull(model, 9)),
            }
        # -- generator rank 2 never joins (blocked elsewhere): the others' waits end naming who waited -----
        cfg = _config("lora")
        groups_c = build_process_groups(one_trainer, timeout_s=3)
        ws = WeightSync(SyncConfig(), layout=one_trainer, groups=groups_c, device="cpu", mode="lora")
        if is_trainer:
            trainer = _trainer(cfg, seed, groups_a, 1)
            out["stuck"] = _expect_error(lambda: ws.push(trainer, 1), RuntimeError)
        elif rank == 1:
            model = prepare_generator_model(_model(seed), cfg)
            out["stuck"] = _expect_error(lambda: ws.pull(model, 1), RuntimeError)
        plane.barrier("stuck", range(world), timeout_s=30)  # rank 2 keeps its connections open meanwhile
        torch.save(out, f"{tmp}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _assert_identical(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor], dtype=None) -> None:
    assert sorted(expected) == sorted(got)
    for name, value in expected.items():
        want = value if dtype is None else value.to(dtype)
        assert got[name].dtype == want.dtype and torch.equal(got[name], want), name


def _nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


@pytest.mark.distributed
def test_weight_sync_in_three_processes(tmp_path):
    spawn_workers(_worker, 3, (str(tmp_path), random.randint(0, 10_000)), limit_s=90)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(3)]
    trainer, generators = ranks[0], ranks[1:]

    # full: bit-identical after the sync, although the generators started elsewhere; many ~10 KB buckets
    state = trainer["full"]["state"]
    sent: SyncStats = trainer["full"]["stats"]
    assert sent.version == 1 and sent.bytes == _nbytes(state) and sent.buckets > 5
    for gen in generators:
        got = gen["full"]
        assert any(not torch.equal(got["before"][n], state[n]) for n in state)
        _assert_identical(state, got["after"])
        assert got["stats"].version == got["version"] == got["announced"] == got["pending"] == 1
        assert got["stats"].bytes == sent.bytes and got["stats"].buckets == sent.buckets
        assert got["stats"].checksum == sent.checksum is not None

    # fp32 trainer → bf16 generators: exactly the trainer's values rounded to bf16, half the bytes
    state = trainer["bf16"]["state"]
    for gen in generators:
        _assert_identical(state, gen["bf16"]["after"], dtype=torch.bfloat16)
        assert gen["bf16"]["stats"].checksum == trainer["bf16"]["stats"].checksum
    assert trainer["bf16"]["stats"].bytes == _nbytes(state) // 2

    # LoRA: adapter only, twice in a row; base weights untouched
    for version, state in enumerate(trainer["lora"]["states"], start=1):
        assert all("lora_" in n for n in state)
        assert trainer["lora"]["stats"][version - 1].bytes == _nbytes(state)
        for gen in generators:
            _assert_identical(state, gen["lora"]["afters"][version - 1])
            assert gen["lora"]["stats"][version - 1].version == version
            assert (
                gen["lora"]["stats"][version - 1].checksum == trainer["lora"]["stats"][version - 1].checksum
            )
    assert all(gen["lora"]["base_unchanged"] for gen in generators)

    # corruption after the broadcast: every member raises, naming generator rank 2, version and tensor
    messages = [trainer["corrupt-True"]["error"]] + [g["corrupt-True"]["error"] for g in generators]
    for message in messages:
        assert "checksum mismatch at policy version 3" in message
        assert "generator rank 2 (first differing tensor 'transformer_blocks.0.attn.to_k.lora_B" in message
        assert "generator rank 1" not in message
    # with verification off the same corruption goes unnoticed (and is really there)
    assert all(r["corrupt-False"]["error"] == "no error" for r in ranks)
    assert all(g["corrupt-False"]["stats"].checksum is None for g in generators)
    state = trainer["corrupt-False"]["state"]
    _assert_identical(state, generators[0]["corrupt-False"]["after"])
    assert not all(torch.equal(state[n], generators[1]["corrupt-False"]["after"][n]) for n in state)

    # version mismatch and structure mismatch: hard errors on every member
    for r in ranks:
        assert "version mismatch" in r["version"] and "pushes policy version 4" in r["version"]
        assert "generator rank 2 expected 5" in r["version"] and "generator rank 1" not in r["version"]
        assert "tensor lists differ between trainer rank 0 and generator rank 2" in r["manifest"]
        assert "lora_A.default.weight" in r["manifest"] and "trainer shape (4, " in r["manifest"]
        assert "generator shape (2, " in r["manifest"]

    # two FSDP2 trainer ranks: the generator holds the gathered full state; only the source sends bytes
    assert ranks[0]["fsdp2"]["backend"] == ranks[1]["fsdp2"]["backend"] == "fsdp2"
    state = ranks[0]["fsdp2"]["state"]
    _assert_identical(state, ranks[2]["fsdp2"]["after"])
    assert ranks[0]["fsdp2"]["stats"].bytes == ranks[2]["fsdp2"]["stats"].bytes == _nbytes(state)
    assert ranks[1]["fsdp2"]["stats"].bytes == 0 and ranks[1]["fsdp2"]["stats"].version == 7
    assert ranks[2]["fsdp2"]["stats"].checksum == ranks[0]["fsdp2"]["stats"].checksum
    for r in (0, 2):
        assert "pushes policy version 8 but generator rank 2 expected 9" in ranks[r]["fsdp2"]["failure"]
    assert "weight sync failed on the source trainer rank 0" in ranks[1]["fsdp2"]["failure"]

    # a member that never joins: the source's wait times out naming its rank, the version and the members
    assert ranks[0]["stuck"].startswith("DistributedTimeoutError: rank 0 (trainer) failed pushing policy")
    assert "from trainer rank 0 to generator ranks [1, 2]" in ranks[0]["stuck"]
    assert "rank 1 (generator) failed receiving policy version 1" in ranks[1]["stuck"]
