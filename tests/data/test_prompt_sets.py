"""Prompt sets (``data.prompts`` / ``data.eval_prompts``): ``.txt`` and ``.jsonl`` files, the built-in
training and held-out splits, the errors a bad file gets (naming the key, the file and the line), the
prompt text → metadata lookup, and metadata reaching the reward through the scorer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import Tensor

from digenrl.config import DataConfig
from digenrl.data.prompts import (
    BUILTIN_EVAL_PROMPTS,
    BUILTIN_PROMPTS,
    SHIPPED_SETS,
    PromptSet,
    PromptSource,
    configured_prompt_sets,
    metadata_lookup,
)
from digenrl.rewards.base import PromptMetadata, RewardFunction
from digenrl.rollout.scoring import Scorer


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_text_file_one_prompt_per_line(tmp_path: Path) -> None:
    path = tmp_path / "prompts.txt"
    path.write_text("a cat\n\n  a dog  \na cat\n")
    prompts = PromptSet.load(str(path))
    assert prompts.prompts == ("a cat", "a dog", "a cat") and prompts.metadata == ({}, {}, {})


def test_jsonl_prompt_field_and_metadata(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "ocr.jsonl",
        [{"prompt": 'a sign that says "OPEN"', "text": "OPEN"}, "", {"prompt": "a cat", "tags": ["x"]}],
    )
    prompts = PromptSet.load(str(path), "data.eval_prompts")
    assert prompts.prompts == ('a sign that says "OPEN"', "a cat")
    assert prompts.metadata == ({"text": "OPEN"}, {"tags": ["x"]})
    assert len(prompts) == 2 and prompts.source == str(path)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (['{"prompt": "a", }'], r"line 1: not valid JSON"),
        ([{"prompt": "a"}, "[1, 2]"], r"line 2: each line must be a JSON object, got list"),
        (
            [{"prompt": "a"}, {"text": "x"}],
            r"line 2: each object needs a non-empty string field 'prompt' \(no",
        ),
        ([{"prompt": 3}], r"line 1: each object needs .*'prompt' = 3"),
        ([{"prompt": "  "}], r"line 1: each object needs"),
        ([{"prompt": "a", "text": "x"}, {"prompt": "a", "text": "y"}], r"'a' appears on lines 1 and 2 with"),
    ],
)
def test_bad_jsonl_names_key_file_and_line(tmp_path: Path, rows: list[object], message: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match=rf"data\.prompts='{path}'.*{message}"):
        PromptSet.load(str(path))


def test_missing_or_empty_sources_are_named(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError,
        match=r"data\.eval_prompts='builtin:test' is neither a shipped set nor an existing file; give a",
    ):
        PromptSet.load("builtin:test", "data.eval_prompts")
    (tmp_path / "empty.jsonl").write_text("\n \n")
    with pytest.raises(ValueError, match=r"empty\.jsonl'.*no JSON lines"):
        PromptSet.load(str(tmp_path / "empty.jsonl"))


def test_builtin_splits_are_disjoint() -> None:
    assert PromptSet.load("builtin").prompts == PromptSet.load("builtin:train").prompts == BUILTIN_PROMPTS
    assert PromptSet.load("builtin:eval").prompts == BUILTIN_EVAL_PROMPTS
    assert not set(BUILTIN_PROMPTS) & set(BUILTIN_EVAL_PROMPTS) and len(set(BUILTIN_EVAL_PROMPTS)) == 16


#: Shipped recipe sets and their sizes (digenrl/data/prompt_sets/README.md).
SHIPPED_SIZES = {
    "pickscore:train": 25432,
    "pickscore:eval": 2048,
    "geneval:train": 5083,
    "geneval:eval": 553,
    "ocr:eval": 1018,
    "drawbench:eval": 200,
}


@pytest.mark.parametrize(("name", "size"), SHIPPED_SIZES.items())
def test_shipped_recipe_sets_load_with_their_sizes(name: str, size: int) -> None:
    prompt_set = PromptSet.load(name, "data.prompts")
    assert len(prompt_set) == size and prompt_set.source == name
    assert all(p.strip() == p and p for p in prompt_set.prompts)


def test_bare_name_is_the_train_split_and_metadata_comes_with_it() -> None:
    assert PromptSet.load("pickscore").prompts == PromptSet.load("pickscore:train").prompts
    geneval = PromptSet.load("geneval:eval")
    first = dict(zip(geneval.prompts, geneval.metadata, strict=True))[
        "a photo of a dog right of a teddy bear"
    ]
    assert first == {
        "tag": "position",
        "include": [
            {"class": "teddy bear", "count": 1},
            {"class": "dog", "count": 1, "position": ["right of", 0]},
        ],
    }
    tags = {m["category"] for m in PromptSet.load("drawbench:eval").metadata}
    assert len(tags) == 11 and "Counting" in tags
    # every OCR prompt quotes the text to render (what the OCR reward's start-up check needs)
    assert all(p.count('"') >= 2 for p in PromptSet.load("ocr:eval").prompts)


def test_shipped_splits_are_disjoint_and_geneval_train_is_regenerable() -> None:
    from digenrl.data.geneval_prompts import to_jsonl, training_prompts

    for name, splits in SHIPPED_SETS.items():
        if {"train", "eval"} <= set(splits):
            train, held_out = PromptSet.load(f"{name}:train"), PromptSet.load(f"{name}:eval")
            assert not set(train.prompts) & set(held_out.prompts), name
    evaluation = PromptSet.load("geneval:eval").prompts
    shipped = (Path(__file__).parents[2] / "digenrl/data/prompt_sets/geneval/train.jsonl").read_text()
    assert to_jsonl(training_prompts(evaluation)) == shipped


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "pickscore:dev",
            r"data\.prompts='pickscore:dev': 'pickscore' has no split 'dev'; shipped splits",
        ),
        ("ocr", r"data\.prompts='ocr': FlowGRPO's OCR training prompts .* are not shipped.*ocr:eval"),
        ("drawbench:train", r"DrawBench is an evaluation benchmark .*drawbench:eval"),
        ("geneva:eval", r"is neither a shipped set nor an existing file.*geneval:train"),
    ],
)
def test_a_bad_shipped_set_name_names_the_key(source: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PromptSet.load(source, "data.prompts")


def test_configured_sets_and_the_metadata_lookup(tmp_path: Path) -> None:
    train = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "a", "text": "A"}, {"prompt": "b"}])
    evaluation = write_jsonl(
        tmp_path / "eval.jsonl", [{"prompt": "c", "text": "C"}, {"prompt": "a", "text": "A"}]
    )
    sets = configured_prompt_sets(DataConfig(prompts=str(train), eval_prompts=str(evaluation)))
    assert metadata_lookup(sets) == {"a": {"text": "A"}, "c": {"text": "C"}}
    assert PromptSource(sets["data.prompts"].prompts, seed=0).prompts == ["a", "b"]
    clash = write_jsonl(tmp_path / "clash.jsonl", [{"prompt": "a", "text": "other"}])
    sets = configured_prompt_sets(DataConfig(prompts=str(train), eval_prompts=str(clash)))
    with pytest.raises(ValueError, match=r"prompt 'a' has metadata \{'text': 'A'\} in data\.prompts=.* but"):
        metadata_lookup(sets)


class TextLength(RewardFunction):
    """A reward of the metadata alone: the length of each prompt's ``text`` field (0 without one)."""

    name = "text-length"

    def score_images(self, images: Tensor, prompts: list[str]) -> Tensor:
        return self.score_batch(images, prompts, [{} for _ in prompts])

    def score_batch(self, images: Tensor, prompts: list[str], metadata: list[PromptMetadata]) -> Tensor:
        return torch.tensor([float(len(m.get("text", ""))) for m in metadata])


def test_the_scorer_hands_each_prompts_metadata_to_the_reward() -> None:
    from tests.tsp.fixtures import PROMPTS, bundle, make_config, make_engine

    batch = make_engine(make_config("sampler.guidance_scale=1.0")).generate(
        PROMPTS[:2], [0, 1], iteration=0, policy_version=0
    )
    scorer = Scorer(bundle().decoder, TextLength(), "drop-group", metadata={PROMPTS[1]: {"text": "abcde"}})
    group = len(batch.prompts) // 2
    assert scorer(batch).rewards.tolist() == [0.0] * group + [5.0] * group
    assert Scorer(bundle().decoder, TextLength(), "drop-group")(batch).rewards.tolist() == [0.0] * (2 * group)


def test_metadata_is_checked_and_repeated_per_video_frame() -> None:
    reward = TextLength()
    video = torch.rand(2, 3, 4, 8, 8)
    assert reward(video, ["a", "b"], [{"text": "xy"}, {}]).tolist() == [2.0, 0.0]
    with pytest.raises(ValueError, match="metadata has length 1 but images has batch size 2"):
        reward(video, ["a", "b"], [{}])
    with pytest.raises(ValueError, match="one mapping"):
        reward(video, ["a", "b"], ["x", "y"])
