"""model.text_padding=split (digenrl/models/text_padding.py): Qwen-Image's rows grouped by real text length,
the padding cut and no mask, compute what the padded, masked forward computes, in the rollout and in a
training step; and the host lengths that make it sync-free travel with the condition."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from digenrl.config import Config, apply_overrides
from digenrl.data.text_condition import TextCondition
from digenrl.models import build_flow_model, get_model_spec
from digenrl.models.text import TextEncoder
from digenrl.models.text_padding import length_groups
from digenrl.rollout.sampler import Sampler
from digenrl.trainer import PolicyTrainer
from tests.trainer.fixtures import grads_by_name, perturb_adapter, rollout_batch

MODEL = "tiny-qwen-image"
PROMPTS = ["a red cube on a table", "bird", "a red cube on a table", "two cats and a dog", "bird"]
# a kernel change (another attention kernel, other matmul shapes) moves fp32 results by rounding only: the
# tolerance the cfg_grad split uses for the same kind of change (tests/trainer/test_trainer_cfg_grad.py)
TOL = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(scope="module")
def encoder() -> TextEncoder:
    torch.manual_seed(0)
    return TextEncoder.build(get_model_spec(MODEL).text_encoder)


def _model(mode: str, seed: int = 0):
    torch.manual_seed(seed)
    model = build_flow_model(MODEL).eval()
    model.set_text_padding(mode)
    return model


def _calls(model) -> list[tuple[int, int, bool]]:
    """Records (rows, text tokens, masked) of every transformer call."""
    seen: list[tuple[int, int, bool]] = []

    def hook(_module, _args, kwargs):
        text = kwargs["encoder_hidden_states"]
        seen.append((text.shape[0], text.shape[1], kwargs.get("encoder_hidden_states_mask") is not None))

    model.transformer.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def test_split_velocity_equals_the_padded_masked_one(encoder):
    cond = encoder.encode(PROMPTS)
    assert cond.lengths is not None and len(set(cond.lengths)) == 3
    assert max(cond.lengths) < cond.embeds.shape[1]  # every row has padding
    masked, split = _model("mask"), _model("split")
    calls = _calls(split)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(len(PROMPTS), *masked.latent_shape(32, 32), generator=g)
    sigma = torch.rand(len(PROMPTS), generator=g)
    with torch.no_grad():
        expected = masked(x, sigma, cond)
        got = split(x, sigma, cond)
    torch.testing.assert_close(got, expected, **TOL)
    # one unmasked call per distinct length, text cut to that length, rows back in order
    assert sorted(calls) == sorted((len(rows), n, False) for n, rows in length_groups(cond.lengths))
    # the text matters, so an output row put back in the wrong place would show
    assert (expected[0] - expected[1]).abs().max() > 1e-3


def test_split_reads_unknown_lengths_from_the_mask_and_keeps_masks_it_cannot_cut(encoder):
    cond = encoder.encode(PROMPTS[:2])
    bare = TextCondition(cond.embeds, cond.pooled, cond.mask)  # e.g. after a transport: no host lengths
    masked, split = _model("mask"), _model("split")
    calls = _calls(split)
    x = torch.randn(2, *masked.latent_shape(32, 32))
    sigma = torch.full((2,), 0.5)
    with torch.no_grad():
        torch.testing.assert_close(split(x, sigma, bare), masked(x, sigma, bare), **TOL)
        assert [c[2] for c in calls] == [False, False]
        # a mask with a hole is no prefix: no length describes it, the padded masked forward runs
        holed = cond.mask.clone()
        holed[0, 1] = False
        odd = TextCondition(cond.embeds, None, holed)
        assert odd.with_lengths().lengths is None
        calls.clear()
        torch.testing.assert_close(split(x, sigma, odd), masked(x, sigma, odd), rtol=0, atol=0)
        assert calls == [(2, cond.embeds.shape[1], True)]


def test_lengths_travel_with_row_operations():
    mask = torch.arange(5).unsqueeze(0) < torch.tensor([[2], [5], [3]])
    cond = TextCondition(torch.randn(3, 5, 4), None, mask)
    assert cond.lengths is None and cond.with_lengths().lengths == (2, 5, 3)
    cond = cond.with_lengths()
    assert cond[1:].lengths == (5, 3) and cond[0].lengths == (2,)
    assert cond.index_select([2, 0, 0]).lengths == (3, 2, 2)
    assert cond.index_select(torch.tensor([1])).lengths == (5,)
    assert cond.repeat_interleave(2).lengths == (2, 2, 5, 5, 3, 3)
    assert TextCondition.cat([cond, cond[:1]]).lengths == (2, 5, 3, 2)
    assert TextCondition.cat([cond, TextCondition(cond.embeds, None, cond.mask)]).lengths is None
    assert cond.to(dtype=torch.float64).lengths == cond.lengths
    with pytest.raises(ValueError, match="lengths"):
        TextCondition(cond.embeds, None, cond.mask, lengths=(1, 2))


def test_a_training_step_gives_the_same_loss_and_update(encoder):
    """CFG on (Qwen-Image's default true CFG), micro-batches of 4 of 6 samples: the first micro-batch mixes
    two prompts and the unconditional rows (three length groups), the second holds one prompt."""
    cfg = apply_overrides(
        Config(),
        [
            f"model.name={MODEL}",
            "trainer.lora_rank=4",
            "trainer.lora_alpha=8",
            "trainer.lr=0.01",
            "trainer.micro_batch_size=4",
            "sampler.num_steps=4",
            "algo.clip_range=0.2",
        ],
    )
    base = _model("mask")
    sampler = Sampler.from_config(cfg, base.spec, base.token_count(32, 32))
    assert sampler.true_cfg
    uncond = encoder.negative_condition(1)
    cond = encoder.encode(["a red cube on a table"] * 3 + ["bird"] * 3)
    batch = rollout_batch(base, sampler, batch_size=6, num_train_steps=2, seed=3, uncond=uncond, cond=cond)
    # as a batch arrives from another rank: no host lengths (the trainer reads them once)
    batch = dataclasses.replace(batch, cond=TextCondition(cond.embeds, None, cond.mask))
    results = {}
    for mode in ("mask", "split"):
        model = copy.deepcopy(base)
        run_cfg = apply_overrides(cfg, [f"model.text_padding={mode}"])
        torch.manual_seed(5)  # the adapter's initial draws
        trainer = PolicyTrainer(run_cfg, model, sampler, uncond=uncond, device="cpu")
        perturb_adapter(model)
        assert model.text_padding == mode
        metrics = trainer.accumulate(batch, 1.0 / batch.num_units)
        grads = grads_by_name(trainer)
        trainer.step()
        results[mode] = (metrics, grads, {k: v.clone() for k, v in trainer.trainable_state_dict().items()})
    (m_mask, g_mask, w_mask), (m_split, g_split, w_split) = results["mask"], results["split"]
    assert m_mask["units"] == m_split["units"] == batch.num_units
    for key in ("loss_sum", "ratio_sum", "ratio_min", "ratio_max", "clipped_count"):
        assert m_split[key] == pytest.approx(m_mask[key], rel=1e-5, abs=1e-6), key
    assert abs(m_mask["loss_sum"]) > 1e-6  # a zero loss would make the comparison vacuous
    assert g_mask.keys() == g_split.keys() and g_mask
    for name, grad in g_mask.items():
        torch.testing.assert_close(g_split[name], grad, **TOL, msg=lambda m, n=name: f"{n}: {m}")
    for name, weight in w_mask.items():
        torch.testing.assert_close(w_split[name], weight, **TOL)


def test_split_reads_nothing_back_when_the_lengths_are_known(encoder):
    """A CFG batch as the sampler builds it (prompts, then the empty prompt's rows): the lengths came from the
    encoder's cache, so the forward reads no tensor value back (a device sync on a GPU)."""
    from tests.trainer.test_host_reads import counted_reads

    cond = TextCondition.cat([encoder.encode(PROMPTS), encoder.negative_condition(len(PROMPTS))])
    model = _model("split")
    x = torch.randn(len(cond), *model.latent_shape(32, 32))
    sigma = torch.full((len(cond),), 0.5)
    with torch.no_grad(), counted_reads() as counts:
        model(x, sigma, cond)
    assert sum(counts.values()) == 0, counts


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device is needed for a stream sync")
def test_split_makes_no_stream_sync_of_its_own_on_a_gpu(encoder):
    """The rows of each length group and the inverse order reach the GPU by queued copies: no synchronising
    call made by this package's lines (torch.cuda's sync debug mode, digenrl/runtime/observe/sync_sites.py;
    the model library's own syncs, if any, are named in the message). PROMPTS' groups are not consecutive."""
    from digenrl.runtime.observe.sync_sites import recorded_sync_sites

    cond = TextCondition.cat([encoder.encode(PROMPTS), encoder.negative_condition(len(PROMPTS))]).to("cuda")
    model = _model("split").to("cuda")
    x = torch.randn(len(cond), *model.latent_shape(32, 32), device="cuda")
    sigma = torch.full((len(cond),), 0.5, device="cuda")
    with torch.no_grad():
        model(x, sigma, cond)  # first call: the library's one-time moves (rotary tables) happen here
        torch.cuda.synchronize()
        with recorded_sync_sites(torch.device("cuda")) as sites:
            v = model(x, sigma, cond)
    ours = [r for r in sites.rows() if r["site"].startswith("digenrl/")]
    assert ours == [], sites.rows()
    assert v.shape == x.shape
