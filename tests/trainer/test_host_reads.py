"""No host read per micro-batch or per denoising step (issue 37 item 3): a read of a device tensor
(``bool``, ``item``, ``tolist``, ``float``, ...) makes the host wait for the GPU's queue, leaving the device
idle while the host then launches the next kernels. The trainer reads its batch's sigma pairs, text lengths
and sums once per ``accumulate``, the rollout engine checks its grid on the host; what they compute is the
same.

On the CPU every tensor is a host tensor, so these tests count the reads themselves (any tensor): their number
must not grow with the micro-batches of a batch or the steps of a rollout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections import Counter
from collections.abc import Iterator

import pytest
import torch

from digenrl.data.micro_batches import plan_micro_batches
from digenrl.trainer import PolicyTrainer
from digenrl.trainer.trainer import _gather_units

from .fixtures import build_model, make_config, make_sampler, perturb_adapter, rollout_batch

READS = ("__bool__", "item", "tolist", "__float__", "__int__", "__index__", "cpu", "numpy")


@contextlib.contextmanager
def counted_reads() -> Iterator[Counter]:
    """Counts calls of the Tensor methods that read values to the host."""
    counts: Counter = Counter()
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def wrap(name):
        def read(self, *args, **kwargs):
            counts[name] += 1
            return originals[name](self, *args, **kwargs)

        return read

    try:
        for name in READS:
            setattr(torch.Tensor, name, wrap(name))
        yield counts
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)


def _trainer_and_batch(*overrides: str):
    cfg = make_config(*overrides)
    torch.manual_seed(0)
    model = build_model()
    trainer = PolicyTrainer(cfg, model, make_sampler(cfg, model), uncond=None, device="cpu")
    perturb_adapter(model)
    batch = rollout_batch(model, trainer.sampler, batch_size=4, num_train_steps=2, seed=3)
    return trainer, batch


@pytest.mark.parametrize(
    ("overrides", "most"),
    [((), 2), (("algo.step_reweight=true",), 2), (("algo.kl_beta=0.04",), 3)],
)
def test_accumulate_reads_the_host_a_fixed_number_of_times(overrides, most):
    """The batch's sigma check, (with the KL term) its stds' check, and the sums' one read."""
    reads = {}
    for micro_batch in (8, 1):  # one micro-batch, then eight
        trainer, batch = _trainer_and_batch(f"trainer.micro_batch_size={micro_batch}", *overrides)
        with counted_reads() as counts:
            trainer.accumulate(batch, 1.0 / batch.num_units)
        reads[micro_batch] = sum(counts.values())
    assert reads[1] == reads[8] <= most, reads


def test_accumulate_metrics_are_the_per_micro_batch_sums():
    """The device-side sums read once equal a host reduction of each micro-batch's terms."""
    trainer, batch = _trainer_and_batch("trainer.micro_batch_size=3")
    expected = Counter()
    low, high = math.inf, -math.inf
    for units in plan_micro_batches(batch.batch_size, batch.num_train_steps, 3):
        mb = _gather_units(batch, units, torch.device("cpu"))
        with torch.no_grad():
            _, terms, _ = trainer.unit_losses(mb)
        expected["loss_sum"] += float(terms.loss.sum())  # fp32 sums, added in float64
        expected["ratio_sum"] += float(terms.ratio.sum())
        expected["clipped_count"] += int(terms.clipped.sum())
        expected["units"] += mb.size
        low, high = min(low, float(terms.ratio.min())), max(high, float(terms.ratio.max()))
    got = trainer.accumulate(batch, 1.0 / batch.num_units)
    assert got["units"] == expected["units"] == batch.num_units
    assert got["clipped_count"] == expected["clipped_count"]
    assert got["loss_sum"] == pytest.approx(expected["loss_sum"], rel=1e-12, abs=1e-15)
    assert got["ratio_sum"] == pytest.approx(expected["ratio_sum"], rel=1e-12)
    assert (got["ratio_min"], got["ratio_max"]) == (low, high)
    assert got["kl_sum"] == 0.0 and abs(got["loss_sum"]) > 0


def test_a_batch_with_bad_sigmas_is_refused_before_any_backward():
    """The per-step check moved to the batch: the same ValueError, in the same accumulate() call, now before
    the first forward, so no gradient is left behind."""
    trainer, batch = _trainer_and_batch()
    bad = batch.next_sigmas.clone()
    bad[2, 1] = batch.sigmas[2, 1] + 0.1  # sigma_next > sigma
    with pytest.raises(ValueError, match="sigma/sigma_next must satisfy"):
        trainer.accumulate(dataclasses.replace(batch, next_sigmas=bad), 1.0 / batch.num_units)
    assert all(p.grad is None for _, p in trainer.backend.named_trainable())


def test_a_kl_on_a_deterministic_step_is_refused_before_any_backward():
    """kl_to_reference's std > 0 check, made once per batch: the same error, before the first forward."""
    trainer, batch = _trainer_and_batch("algo.kl_beta=0.04")
    deterministic = dataclasses.replace(trainer.sampler, noise_level=0.0)
    trainer.sampler = deterministic
    with pytest.raises(ValueError, match=r"std must be > 0 everywhere"):
        trainer.accumulate(batch, 1.0 / batch.num_units)
    assert all(p.grad is None for _, p in trainer.backend.named_trainable())


def test_the_batch_stds_are_the_transitions_own():
    trainer, batch = _trainer_and_batch("algo.kl_beta=0.04")
    mb = _gather_units(
        batch, [(b, k) for b in range(batch.batch_size) for k in range(2)], torch.device("cpu")
    )
    zeros = torch.zeros_like(mb.latents)
    expected = trainer.sampler.transition(
        zeros, zeros, mb.sigmas, mb.next_sigmas, prev_sample=zeros
    ).noise_scale
    torch.testing.assert_close(trainer._transition_stds(batch).flatten(), expected.flatten(), rtol=0, atol=0)


def test_a_rollout_reads_the_host_a_fixed_number_of_times():
    from tests.tsp.fixtures import make_config as engine_config
    from tests.tsp.fixtures import make_engine

    reads = {}
    for steps in (4, 8):
        engine = make_engine(engine_config(f"sampler.num_steps={steps}"))
        engine.text_encoder.encode(["a red cube", "two dogs"])  # the prompts' encoding is cached
        with counted_reads() as counts:
            engine.generate(["a red cube", "two dogs"], [0, 1], iteration=0, policy_version=0)
        reads[steps] = counts
    # each step reads its SDE flag from a host list (one __bool__ of a CPU tensor), nothing of the device
    per_step = Counter({k: (reads[8][k] - reads[4][k]) / 4 for k in reads[8] | reads[4]})
    assert +per_step == Counter({"__bool__": 1}), (reads[4], reads[8])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device is needed for a stream sync")
def test_a_micro_batch_gather_makes_no_stream_sync():
    """The micro-batch's index reaches the batch's device by a queued copy (digenrl/data/device_index.py): the
    round-5 Qwen-Image profile had ~12 blocking index copies a micro-batch (each a cudaStreamSynchronize)."""
    _, batch = _trainer_and_batch()
    device = torch.device("cuda")
    on_gpu = dataclasses.replace(
        batch,
        **{
            f.name: getattr(batch, f.name).to(device)
            for f in dataclasses.fields(batch)
            if isinstance(getattr(batch, f.name), torch.Tensor)
            and f.name not in ("seeds", "step_indices", "prompt_ids", "sample_ids")
        },
        cond=batch.cond.to(device),
    )
    units = plan_micro_batches(batch.batch_size, batch.num_train_steps, 3)[0]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        mb = _gather_units(on_gpu, units, device)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    expected = _gather_units(batch, units, torch.device("cpu"))
    torch.testing.assert_close(mb.latents.cpu(), expected.latents, rtol=0, atol=0)
    torch.testing.assert_close(mb.advantages.cpu(), expected.advantages, rtol=0, atol=0)
