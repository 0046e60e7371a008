"""The OCR reward: FlowGRPO's ``1 − edit distance / target length`` rule, where the target text comes from
(prompt quotes or metadata), the start-up check of a prompt set, and GOT-OCR 2.0 on its tiny twin (greedy,
deterministic, batch-invariant reading; the save → from_pretrained round trip; metadata reaching the
score; the real size on the meta device)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from digenrl.rewards import build_reward
from digenrl.rewards.ocr import OcrReward, edit_distance, got_query, ocr_score, target_text

NEW_TOKENS = 4  # the tiny twin never stops early: keep its decode loop short


def brute_force_distance(a: str, b: str) -> int:
    """Levenshtein distance by the textbook recursion (exponential; short strings only)."""
    if not a or not b:
        return len(a) + len(b)
    return min(
        brute_force_distance(a[1:], b) + 1,
        brute_force_distance(a, b[1:]) + 1,
        brute_force_distance(a[1:], b[1:]) + (a[0] != b[0]),
    )


def test_edit_distance_matches_the_recursion() -> None:
    words = ["", "a", "ab", "ba", "kitten", "sitting", "abc", "yabd", "flaw", "lawn"]
    for a, b in itertools.product(words, repeat=2):
        if len(a) + len(b) <= 11:
            assert edit_distance(a, b) == brute_force_distance(a, b), (a, b)
    assert edit_distance("kitten", "sitting") == 3


def test_score_follows_flow_grpo() -> None:
    assert ocr_score("Hello World", "hello world") == 1.0  # spaces and case ignored
    assert ocr_score("the sign reads HELLOWORLD today", "Hello World") == 1.0  # target inside the read text
    assert ocr_score("hellp", "hello") == pytest.approx(0.8)  # one substitution out of 5 characters
    assert ocr_score("", "open") == 0.0
    assert ocr_score("completely unrelated long text", "ab") == 0.0  # distance capped at the target length
    with pytest.raises(ValueError, match="empty"):
        ocr_score("x", "   ")


def test_target_text_from_metadata_quotes_or_nothing() -> None:
    assert target_text('New York with "Hello World" in fireworks', {}) == "Hello World"
    assert target_text('a "first" and a "second"', {}) == "first"  # flow_grpo: prompt.split('"')[1]
    assert target_text('a sign saying "OPEN"', {"text": "CLOSED"}) == "CLOSED"  # metadata wins
    assert target_text("a cat", {}) is None
    assert target_text('an unclosed "quote', {}) is None
    assert target_text('empty ""', {"text": "  "}) is None


def test_check_prompts_names_the_key_and_the_prompt() -> None:
    OcrReward.check_prompts(['a "sign"', "no quotes"], [{}, {"text": "SALE"}], "data.prompts")
    with pytest.raises(ValueError, match=r"data\.prompts: prompt 2 \('a cat'\) gives the OCR reward no text"):
        OcrReward.check_prompts(['a "sign"', "a cat"], [{}, {}], "data.prompts")


@pytest.fixture(scope="module")
def tiny() -> OcrReward:
    return build_reward("tiny-ocr", max_new_tokens=NEW_TOKENS, batch_size=2)


def test_tiny_twin_reads_deterministically_and_batch_invariantly(tiny: OcrReward) -> None:
    images = torch.rand(3, 3, 40, 56)
    read = tiny.read_text(images)
    assert len(read) == 3 and all(isinstance(t, str) and t for t in read)
    assert tiny.read_text(images) == read
    assert [tiny.read_text(images[i : i + 1])[0] for i in range(3)] == read
    assert tiny.image_tokens == 4 and got_query(4).count("<imgpad>") == 4


def test_metadata_reaches_the_score(tiny: OcrReward) -> None:
    images = torch.rand(2, 3, 32, 32)
    read = tiny.read_text(images)
    target = read[0].replace(" ", "")[:6]  # a piece of what the model reads: the whole target is found
    prompts = ['a sign that says "zzzzqqqq"'] * 2
    with_text = tiny(images, prompts, [{"text": target}, {"text": target}])
    from_quotes = tiny(images, prompts)
    assert float(with_text[0]) == 1.0
    expected = [ocr_score(r, "zzzzqqqq") for r in read]
    assert from_quotes.tolist() == pytest.approx(expected) and float(from_quotes[0]) < 1.0
    assert ((from_quotes >= 0) & (from_quotes <= 1)).all()


def test_save_then_from_pretrained_reads_the_same(tiny: OcrReward, tmp_path: Path) -> None:
    directory = tiny.save_pretrained(tmp_path / "ocr")
    loaded = build_reward("ocr", weights_path=str(directory), max_new_tokens=NEW_TOKENS)
    assert type(loaded) is OcrReward and loaded.transform == tiny.transform
    images = torch.rand(2, 3, 32, 32)
    assert loaded.read_text(images) == tiny.read_text(images)
    (directory / "config.json").unlink()
    with pytest.raises(ValueError, match=r"not a complete GOT-OCR 2\.0 directory; missing: model config"):
        build_reward("ocr", weights_path=str(directory))


def test_real_size_is_got_ocr2() -> None:
    reward = build_reward("ocr", device="meta")
    assert reward.num_parameters() == 560_528_640
    assert reward.image_tokens == 256 and reward.transform.resize_hw == (1024, 1024)
