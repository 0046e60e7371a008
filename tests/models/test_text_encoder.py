"""TextEncoder: cache behaviour, per-family composition against hand-run encoders, TextCondition ops."""

from __future__ import annotations

import pytest
import torch

from digenrl.models import TextCondition, TextEncoder, get_model_spec


def _counting_encoder(name: str, cache_capacity: int | None = 4096) -> tuple[TextEncoder, list[int]]:
    """A fresh encoder whose component forwards record their batch sizes."""
    enc = TextEncoder.build(get_model_spec(name).text_encoder, cache_capacity=cache_capacity)
    calls: list[int] = []
    for comp in enc.components:
        comp.model.register_forward_pre_hook(
            lambda _m, args, kwargs: calls.append(kwargs["input_ids"].shape[0]), with_kwargs=True
        )
    return enc, calls


def test_cache_hit_does_not_run_encoders_and_returns_identical_tensors():
    enc, calls = _counting_encoder("tiny-sd3")
    first = enc.encode(["a red car", "a blue boat"])
    assert calls == [1, 1, 1, 1, 1, 1]  # CLIP-L, CLIP-G, T5 once per new prompt (one prompt per pass)
    again = enc.encode(["a blue boat", "a red car", "a red car"])
    assert calls == [1, 1, 1, 1, 1, 1]
    assert torch.equal(again.embeds[0], first.embeds[1])
    assert torch.equal(again.embeds[1], first.embeds[0]) and torch.equal(again.embeds[2], first.embeds[0])
    assert torch.equal(again.pooled[1], first.pooled[0])
    info = enc.cache_info()
    assert (info["hits"], info["misses"], info["entries"], info["encoder_calls"]) == (3, 2, 2, 2)
    expected_bytes = sum(t.numel() * t.element_size() for t in (first.embeds, first.pooled))
    assert info["bytes"] == expected_bytes


def test_partial_miss_encodes_only_new_prompts_once():
    enc, calls = _counting_encoder("tiny-flux")
    enc.encode(["x"])
    calls.clear()
    out = enc.encode(["x", "new prompt", "new prompt", "x"])
    assert calls == [1, 1]  # T5 and CLIP each ran once on the single new prompt
    torch.testing.assert_close(out.embeds[1], out.embeds[2])
    # a prompt's row is bit-identical whichever prompts missed the cache with it
    fresh = TextEncoder(enc.spec, enc.components).encode(["other", "new prompt"])
    assert torch.equal(fresh.embeds[1], out.embeds[1]) and torch.equal(fresh.pooled[1], out.pooled[1])


def test_lru_capacity_evicts_oldest_prompt():
    enc, calls = _counting_encoder("tiny-wan", cache_capacity=2)
    enc.encode(["a"])
    enc.encode(["b"])
    enc.encode(["a"])  # refresh a
    enc.encode(["c"])  # evicts b
    assert enc.cache_info()["entries"] == 2
    calls.clear()
    enc.encode(["a", "c"])
    assert calls == []
    enc.encode(["b"])
    assert calls == [1]


def test_negative_condition_is_repeated_empty_prompt(bundles):
    enc = bundles("tiny-qwen-image").text_encoder
    neg = enc.negative_condition(3)
    ref = enc.encode([""])
    assert neg.batch_size == 3
    for i in range(3):
        assert torch.equal(neg.embeds[i], ref.embeds[0]) and torch.equal(neg.mask[i], ref.mask[0])


def test_encode_rejects_bad_prompts(bundles):
    enc = bundles("tiny-sd3").text_encoder
    with pytest.raises(ValueError, match="list"):
        enc.encode("a single string")
    with pytest.raises(ValueError, match="non-empty"):
        enc.encode([])
    with pytest.raises(ValueError, match="batch_size"):
        enc.negative_condition(0)


def _tokens(comp, prompts):
    tok = comp.tokenizer(
        prompts, padding="max_length", max_length=comp.spec.max_length, truncation=True, return_tensors="pt"
    )
    return tok["input_ids"], tok["attention_mask"]


def test_sd3_composition_matches_hand_run_encoders(bundles):
    enc = bundles("tiny-sd3").text_encoder
    prompts = ["a photo of a horse", "snow"]
    cond = enc.encode(prompts)
    comps = {c.spec.name: c for c in enc.components}
    with torch.no_grad():
        ids, _ = _tokens(comps["clip_l"], prompts)
        out_l = comps["clip_l"].model(input_ids=ids, output_hidden_states=True)
        out_g = comps["clip_g"].model(input_ids=ids, output_hidden_states=True)
        t5_ids, _ = _tokens(comps["t5"], prompts)
        t5 = comps["t5"].model(input_ids=t5_ids).last_hidden_state
    n_l, n_g = out_l.hidden_states[-2].shape[-1], out_g.hidden_states[-2].shape[-1]
    clip_len = comps["clip_l"].spec.max_length
    torch.testing.assert_close(cond.embeds[:, :clip_len, :n_l], out_l.hidden_states[-2])
    torch.testing.assert_close(cond.embeds[:, :clip_len, n_l : n_l + n_g], out_g.hidden_states[-2])
    assert torch.all(cond.embeds[:, :clip_len, n_l + n_g :] == 0)
    torch.testing.assert_close(cond.embeds[:, clip_len:], t5)
    torch.testing.assert_close(cond.pooled, torch.cat([out_l.text_embeds, out_g.text_embeds], dim=-1))
    assert cond.mask is None


def test_clip_pools_at_the_end_token_of_the_offline_tokenizer(bundles):
    """FLUX's pooled vector = CLIP final-norm state at the [SEP] position (the remapped eos)."""
    enc = bundles("tiny-flux").text_encoder
    clip = next(c for c in enc.components if c.spec.name == "clip_l")
    prompts = ["one two three", "a"]
    cond = enc.encode(prompts)
    ids, mask = _tokens(clip, prompts)
    with torch.no_grad():
        states = clip.model(input_ids=ids).last_hidden_state
    end = mask.sum(dim=1) - 1  # [SEP] is the last real token
    assert torch.all(ids[torch.arange(2), end] == clip.tokenizer.sep_token_id)
    torch.testing.assert_close(cond.pooled, states[torch.arange(2), end])


@pytest.mark.parametrize("name", ["tiny-qwen-image", "tiny-wan", "tiny-hunyuan-video"])
def test_masked_families_zero_or_mask_padding(name, bundles):
    enc = bundles(name).text_encoder
    prompts = ["short", "a considerably longer prompt with many words"]
    cond = enc.encode(prompts)
    comp = enc.components[0]
    _, mask = _tokens(comp, prompts)
    n_real = mask.sum(dim=1)
    assert n_real[0] < n_real[1]
    if enc.spec.uses_mask:
        assert cond.mask.dtype == torch.bool and torch.equal(cond.mask.sum(dim=1), n_real)
    else:
        assert cond.mask is None
    if comp.spec.zero_padding:
        pad_rows = cond.embeds[0, n_real[0] :]
        assert torch.all(pad_rows == 0) and cond.embeds[0, : n_real[0]].abs().sum() > 0


def test_hunyuan_uses_third_to_last_llama_state(bundles):
    enc = bundles("tiny-hunyuan-video").text_encoder
    llama = next(c for c in enc.components if c.spec.name == "llama")
    prompts = ["a running horse"]
    ids, mask = _tokens(llama, prompts)
    with torch.no_grad():
        states = llama.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    torch.testing.assert_close(enc.encode(prompts).embeds, states[-3])
    assert not torch.allclose(states[-3], states[-1])


# --- TextCondition ----------------------------------------------------------------------------------------


def _cond(batch=4, length=5, dim=3, pooled=True, mask=True) -> TextCondition:
    return TextCondition(
        embeds=torch.randn(batch, length, dim),
        pooled=torch.randn(batch, 2) if pooled else None,
        mask=torch.rand(batch, length) > 0.3 if mask else None,
    )


def test_text_condition_indexing_and_repeat():
    c = _cond()
    sel = c.index_select([2, 0, 2])
    assert torch.equal(sel.embeds, c.embeds[[2, 0, 2]]) and torch.equal(sel.mask, c.mask[[2, 0, 2]])
    assert torch.equal(c[1].pooled, c.pooled[1:2]) and c[-1].batch_size == 1
    assert torch.equal(c[1:3].embeds, c.embeds[1:3])
    assert torch.equal(c[torch.tensor([3])].embeds, c.embeds[3:4])
    rep = c.repeat_interleave(3)
    assert rep.batch_size == 12
    for i in range(12):
        assert torch.equal(rep.embeds[i], c.embeds[i // 3]) and torch.equal(rep.pooled[i], c.pooled[i // 3])
    with pytest.raises(IndexError):
        c[4]
    with pytest.raises(ValueError, match="repeats"):
        c.repeat_interleave(0)


def test_text_condition_cat_for_cfg_and_validation():
    a, b = _cond(batch=2), _cond(batch=3)
    both = TextCondition.cat([a, b])
    assert torch.equal(both.embeds[:2], a.embeds) and torch.equal(both.mask[2:], b.mask)
    with pytest.raises(ValueError, match="pooled"):
        TextCondition.cat([a, _cond(batch=1, pooled=False)])
    with pytest.raises(ValueError, match="differ"):
        TextCondition.cat([a, _cond(batch=1, length=6)])
    with pytest.raises(ValueError, match="at least one"):
        TextCondition.cat([])
    with pytest.raises(ValueError, match="mask"):
        TextCondition(torch.randn(2, 5, 3), mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="embeds"):
        TextCondition(torch.randn(5, 3))


def test_text_condition_to_bytes_and_dict_round_trip():
    c = _cond()
    half = c.to(dtype=torch.bfloat16)
    assert half.embeds.dtype == torch.bfloat16 and half.pooled.dtype == torch.bfloat16
    assert half.mask.dtype == torch.bool
    assert c.num_bytes() == 4 * 5 * 3 * 4 + 4 * 2 * 4 + 4 * 5 * 1
    back = TextCondition.from_dict(c.to_dict())
    assert torch.equal(back.embeds, c.embeds) and torch.equal(back.mask, c.mask)
    no_extras = _cond(pooled=False, mask=False)
    assert set(no_extras.to_dict()) == {"embeds"}
    with pytest.raises(ValueError, match="keys"):
        TextCondition.from_dict({"embeds": c.embeds, "bogus": c.embeds})


def test_chat_template_applies_with_a_models_own_tokenizer(bundles, tmp_path):
    """Without the stand-in marker a saved tokenizer counts as the model's own: the Qwen-Image template is
    prepended and its first 34 tokens dropped (pipeline_qwenimage.py), so the mask counts the rest."""
    import os

    from digenrl.models import save_model_bundle
    from digenrl.models.text import TOKENIZER_MARKER_FILE

    directory = str(tmp_path / "qwen")
    save_model_bundle(bundles("tiny-qwen-image"), directory)
    os.remove(os.path.join(directory, "tokenizer", TOKENIZER_MARKER_FILE))
    enc = TextEncoder.build(get_model_spec("tiny-qwen-image").text_encoder, pretrained_path=directory)
    comp = enc.components[0]
    assert comp.apply_template
    prompt = "red"
    templated = comp.spec.prompt_template.format(prompt)
    n_tokens = len(comp.tokenizer(templated)["input_ids"])
    expected = min(n_tokens, comp.spec.max_length + 34) - 34
    cond = enc.encode([prompt])
    assert int(cond.mask.sum()) == expected
    assert cond.embeds.shape[1] == comp.spec.max_length
