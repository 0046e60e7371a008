"""The GenEval reward (Ghosh et al., arXiv 2310.11513; github.com/djghosh13/geneval): its rules on
hand-built detections (counts and the counting threshold, colours, positions, exclusions; GenEval's
benchmark verdict, FlowGRPO's strict verdict and partial score), the detector's pre/post-processing, the
tiny twin's save → from_pretrained round trip, and the start-up check of a prompt set's metadata."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from digenrl.config import ConfigError, load_config
from digenrl.data.geneval_prompts import GENEVAL_CLASSES
from digenrl.data.prompts import PromptSet
from digenrl.rewards import build_reward
from digenrl.rewards.geneval import GenEvalReward, detr_resize_hw
from digenrl.rewards.geneval_rules import Detections, judge, keep_detections, relative_position
from digenrl.validation import validate_config
from tests.systems.launcher import TINY


def box(x0: float, y0: float, x1: float, y1: float) -> torch.Tensor:
    return torch.tensor([x0, y0, x1, y1])


def colours_by_x(boxes: list[torch.Tensor], name: str) -> list[str]:
    """A stand-in for the CLIP colour classifier: boxes left of x=50 are red, the others blue."""
    return ["red" if float(b[0]) < 50 else "blue" for b in boxes]


def verdict(detections: Detections, metadata: dict) -> tuple[bool, bool, float]:
    v = judge(detections, metadata, colours_by_x)
    return v.correct, v.strict, round(v.score, 6)


def test_relative_position_follows_geneval() -> None:
    left, right = box(0, 40, 20, 60), box(80, 40, 100, 60)
    assert relative_position(left, right) == {"left of"} and relative_position(right, left) == {"right of"}
    top, bottom = box(40, 0, 60, 20), box(40, 80, 60, 100)
    assert relative_position(top, bottom) == {"above"}  # image y grows downwards
    # a diagonal satisfies both relations (dx = dy = -76 / 113 < -0.5)
    assert relative_position(box(0, 0, 20, 20), box(80, 80, 100, 100)) == {"left of", "above"}
    # centres 30 px apart on x, sizes 100 + 100: the 0.1 x 200 = 20 px margin leaves dx = 10 / 30 < 0.5
    assert relative_position(box(30, 0, 130, 100), box(0, 0, 100, 100)) == set()
    assert relative_position(box(60, 0, 160, 100), box(0, 0, 100, 100)) == {"right of"}  # 40 / 60 > 0.5


def test_keep_detections_thresholds_order_and_cap() -> None:
    boxes = torch.stack([box(i, 0, i + 10, 10) for i in range(5)])
    scores = torch.tensor([0.5, 0.95, 0.2, 0.92, 0.35])
    labels = ["dog", "dog", "dog", "cat", "dog"]
    kept = keep_detections(boxes, scores, labels, "two_object")
    assert [int(b[0]) for b in kept["dog"]] == [1, 0, 4] and len(
        kept["cat"]
    ) == 1  # > 0.3, most confident first
    kept = keep_detections(boxes, scores, labels, "counting")  # counting: > 0.9 only
    assert [int(b[0]) for b in kept["dog"]] == [1] and len(kept["cat"]) == 1
    assert len(keep_detections(boxes, scores, labels, "x", max_objects=2)["dog"]) == 2
    same = torch.stack([box(0, 0, 10, 10), box(0, 0, 10, 10)])
    assert (
        len(keep_detections(same, torch.tensor([0.9, 0.8]), ["dog", "dog"], "x", max_overlap=0.5)["dog"]) == 1
    )


def test_counting_rules_and_exclusion() -> None:
    meta = {
        "tag": "counting",
        "include": [{"class": "dog", "count": 2}],
        "exclude": [{"class": "dog", "count": 3}],
    }
    two = {"dog": [box(0, 0, 10, 10), box(60, 0, 70, 10)]}
    assert verdict(two, meta) == (True, True, 1.0)
    assert verdict({"dog": two["dog"][:1]}, meta) == (False, False, 0.5)  # 1 - |2 - 1| / 2
    three = {"dog": [*two["dog"], box(80, 0, 90, 10)]}
    assert verdict(three, meta) == (False, False, 0.5)  # excluded count reached; strict wants exactly 2
    assert verdict({}, meta) == (False, False, 0.0)


def test_colour_rules() -> None:
    meta = {
        "tag": "color_attr",
        "include": [
            {"class": "car", "count": 1, "color": "red"},
            {"class": "cup", "count": 1, "color": "blue"},
        ],
    }
    good = {"car": [box(0, 0, 10, 10)], "cup": [box(60, 0, 70, 10)]}
    assert verdict(good, meta) == (True, True, 1.0)
    wrong_cup = {"car": [box(0, 0, 10, 10)], "cup": [box(10, 0, 20, 10)]}  # the cup is red
    assert verdict(wrong_cup, meta) == (False, False, 0.75)  # parts 1, 1, 1, 0
    # GenEval checks the most confident box only; FlowGRPO wants exactly one car
    two_cars = {"car": [box(0, 0, 10, 10), box(60, 0, 70, 10)], "cup": [box(60, 0, 70, 10)]}
    assert verdict(two_cars, meta) == (True, False, 0.5)  # parts 0 (count 2 vs 1), 0 (colour skipped), 1, 1


def test_position_rules() -> None:
    meta = {
        "tag": "position",
        "include": [
            {"class": "teddy bear", "count": 1},
            {"class": "dog", "count": 1, "position": ["right of", 0]},
        ],
    }
    bear, dog_right, dog_left = box(0, 40, 20, 60), box(80, 40, 100, 60), box(0, 80, 1, 81)
    assert verdict({"teddy bear": [bear], "dog": [dog_right]}, meta) == (True, True, 1.0)
    assert verdict({"teddy bear": [bear], "dog": [dog_left]}, meta) == (False, False, round(2 / 3, 6))
    assert verdict({"dog": [dog_right]}, meta) == (False, False, round(1 / 3, 6))  # no target: parts 0, 1, 0
    reasons = judge({"teddy bear": [bear], "dog": [dog_left]}, meta, colours_by_x).reasons
    assert reasons and "expected dog right of target" in reasons[0]


def test_the_shipped_benchmark_metadata_passes_the_check_and_bad_metadata_names_the_key() -> None:
    evaluation = PromptSet.load("geneval:eval")
    GenEvalReward.check_prompts(list(evaluation.prompts), list(evaluation.metadata), "data.eval_prompts")
    with pytest.raises(
        ValueError, match=r"data\.prompts: reward 'geneval' needs GenEval metadata .*'a cat': no"
    ):
        GenEvalReward.check_prompts(["a cat"], [{}], "data.prompts")
    bad = {"include": [{"class": "unicorn", "count": 1}]}
    with pytest.raises(ValueError, match=r"clause 0 names no known class"):
        GenEvalReward.check_prompts(["x"], [bad], "data.prompts")
    bad = {"include": [{"class": "dog", "count": 1, "position": ["left of", 0]}]}
    with pytest.raises(ValueError, match=r"clause 0 has position"):
        GenEvalReward.check_prompts(["x"], [bad], "data.prompts")


def test_a_run_with_builtin_prompts_is_refused_at_startup(tmp_path: Path) -> None:
    config = load_config(TINY, ["reward=tiny-geneval", f"out_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=r"data\.prompts: reward 'tiny-geneval' needs GenEval metadata"):
        validate_config(config, world_size=2)
    config = load_config(
        TINY,
        [
            "reward=tiny-geneval",
            "data.prompts=geneval:train",
            "data.eval_prompts=geneval:eval",
            f"out_dir={tmp_path / 'run'}",
        ],
    )
    validate_config(config, world_size=2)


def test_detr_resize_rule() -> None:
    assert detr_resize_hw(512, 512, 800, 1333) == (800, 800)
    assert detr_resize_hw(480, 640, 800, 1333) == (800, 1066)
    assert detr_resize_hw(100, 400, 800, 1333) == (333, 1332)  # the long side capped at 1333


def test_tiny_reward_scores_and_round_trips(tmp_path: Path) -> None:
    reward = build_reward("tiny-geneval")
    assert reward.num_parameters() > 0
    evaluation = PromptSet.load("geneval:eval")
    prompts, metadata = list(evaluation.prompts[:3]), list(evaluation.metadata[:3])
    images = torch.rand(3, 3, 48, 64, generator=torch.Generator().manual_seed(0))
    scores = reward(images, prompts, metadata)
    assert scores.shape == (3,) and bool(((scores >= 0) & (scores <= 1)).all())
    reward.save_pretrained(tmp_path / "w")
    loaded = build_reward("tiny-geneval", weights_path=str(tmp_path / "w"))
    assert torch.equal(loaded(images, prompts, metadata), scores)
    raw_a = reward.detector(images)
    raw_b = loaded.detector(images)
    for (boxes_a, scores_a, names_a), (boxes_b, scores_b, names_b) in zip(raw_a, raw_b, strict=True):
        assert names_a == names_b and torch.allclose(boxes_a, boxes_b) and torch.allclose(scores_a, scores_b)
        assert bool(((boxes_a[:, 0::2] > -64) & (boxes_a[:, 0::2] < 128)).all())  # pixels of a 64-wide image
        assert len(names_a) == 12 and set(names_a) <= set(GENEVAL_CLASSES)  # every query names a class here
        assert sum(map(len, keep_detections(boxes_a, scores_a, names_a, "x", threshold=0.0).values())) == 12
    # colour classification runs on crops of any size
    assert (
        len(
            reward.colours(
                images[0], [torch.tensor([0.0, 0.0, 1.0, 1.0]), torch.tensor([5.0, 5, 60, 40])], "dog"
            )
        )
        == 2
    )
    with pytest.raises(ValueError, match=r"missing: detector model config"):
        build_reward("tiny-geneval", weights_path=str(tmp_path))
    with pytest.raises(ValueError, match=r"needs GenEval metadata"):
        reward(images[:1], ["a cat"], [{}])
