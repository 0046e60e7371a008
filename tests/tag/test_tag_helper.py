"""TAG's helper never disturbs a pending gradient accumulation: generating a fragment with the trainer's
own model between two accumulations leaves the gradient bit for bit what it would have been, with the
pending gradients kept in place or parked to host memory and restored; its fragment is the trajectory a
generator makes for the same prompts; and the switch is a measured span."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from digenrl.gap.fragments import FragmentPlan
from digenrl.gap.stream import FragmentStream
from digenrl.runtime.comm.control_plane import ControlPlane
from digenrl.runtime.observe.events import EventLogger
from digenrl.tag.helper import ParkedGradients, TagHelper, gathered_weights_fit, tag_supported
from digenrl.trainer import PolicyTrainer
from tests.tsp.fixtures import PROMPTS, bundle, make_config, make_engine

CFG = ["algo.clip_range=0.2", "trainer.lr=0.01", "trainer.micro_batch_size=4", "trainer.lora_rank=4"]
CFG += ["sampler.guidance_scale=1.0"]  # one forward per unit


def _grads(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in trainer.backend.named_trainable() if p.grad is not None}


def _trainer_and_helper(tmp_path, park: bool):
    cfg = make_config(*CFG)
    model = copy.deepcopy(bundle().flow_model)
    engine = make_engine(cfg, flow_model=model)
    trainer = PolicyTrainer(cfg, model, engine.sampler, uncond=None, device="cpu")
    plan = FragmentPlan(4, 1, 1)
    plane = ControlPlane(torch.distributed.HashStore(), 0, "trainer")
    stream = FragmentStream(plan, plane, (0,), sharding="units", device=torch.device("cpu"), timeout_s=5)
    events = EventLogger(tmp_path, 0, "trainer", 0.0)
    helper = TagHelper(
        engine, stream, plan, events, backend=trainer.backend, park_grads=park, device=torch.device("cpu")
    )
    return cfg, engine, trainer, helper, events


def _scored(engine, prompts, ids):
    batch = engine.generate(prompts, ids, iteration=3, policy_version=0)
    batch.advantages = torch.randn(batch.batch_size, generator=torch.Generator().manual_seed(sum(ids)))
    return batch


@pytest.mark.parametrize("park", [False, True])
def test_helping_between_two_accumulations_leaves_the_gradient_bit_identical(tmp_path, park):
    _, engine, trainer, helper, events = _trainer_and_helper(tmp_path, park)
    first, second = _scored(engine, PROMPTS[:1], [0]), _scored(engine, PROMPTS[1:2], [1])
    weight = 1.0 / (first.num_units + second.num_units)

    trainer.accumulate(first, weight)
    trainer.accumulate(second, weight)
    reference = _grads(trainer)
    trainer.zero_grad()

    trainer.accumulate(first, weight)
    pending = _grads(trainer)
    made = helper.try_help(3, 0, PROMPTS[:4])  # claims from the tail: fragment 3
    assert made is not None and made.fragment == 3 and helper.generating
    if park:  # parked: nothing pending on the device while the helper generates
        assert all(p.grad is None for p in trainer.backend.trainable_parameters())
    else:
        assert all(torch.equal(g, _grads(trainer)[n]) for n, g in pending.items())
    helper.leave(3, 0)
    assert {n: g for n, g in _grads(trainer).items()}.keys() == pending.keys()
    assert all(torch.equal(pending[n], g) for n, g in _grads(trainer).items())
    trainer.accumulate(second, weight)
    after = _grads(trainer)
    assert reference.keys() == after.keys() and reference
    assert all(torch.equal(reference[n], after[n]) for n in reference)  # bit for bit

    # the helper's fragment is the trajectory any generator makes for prompt 3 (per-sample seeding)
    generator_made = engine.generate(PROMPTS[3:4], [3], iteration=3, policy_version=0)
    assert torch.equal(made.batch.log_probs, generator_made.log_probs)
    assert torch.equal(made.batch.final_latents, generator_made.final_latents)
    events.close()
    spans = [json.loads(line) for line in (tmp_path / "events" / "rank0.jsonl").read_text().splitlines()]
    switches = [s for s in spans if s.get("phase") == "tag_switch"]
    assert [s["extra"]["direction"] for s in switches] == ["in", "out"]
    moved = switches[0]["extra"]["bytes"]
    assert (moved > 0) == park  # parking moves the pending gradients; otherwise nothing moves
    assert any(s.get("phase") == "generate" and s["extra"].get("helper") for s in spans)


def test_parked_gradients_come_back_unchanged():
    params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(7))]
    params[0].grad = torch.randn(5, 3)
    before = params[0].grad.clone()
    parking = ParkedGradients(params)
    assert parking.park() == before.numel() * 4 and params[0].grad is None and parking.parked
    parking.restore()
    assert torch.equal(params[0].grad, before) and params[1].grad is None and not parking.parked


def test_backends_and_memory():
    assert tag_supported("none") is None and tag_supported("ddp") is None and tag_supported("fsdp2") is None
    assert "DeepSpeed" in tag_supported("deepspeed")
    assert gathered_weights_fit(10 << 30, 20 << 30) is None
    message = gathered_weights_fit(10 << 30, 11 << 30)
    assert message is not None and "10.00 GiB" in message and "11.00 GiB" in message
