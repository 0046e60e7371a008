"""The GenEval reward (Ghosh et al., arXiv 2310.11513; github.com/djghosh13/geneval): its rules on
hand-built detections (counts and the counting threshold, colours, positions, exclusions; GenEval's
benchmark verdict, FlowGRPO's strict verdict and partial score), the detector's pre/post-processing, the
tiny twin's save → from_pretrained round trip, and the start-up check of a prompt set's metadata."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from digenrl.config import ConfigError, load_config
from digenrl.data.geneval_prompts import GENEVAL_CLASSES, GENEVAL_COLORS
from digenrl.data.prompts import PromptSet
from digenrl.rewards import build_reward
from digenrl.rewards.geneval import (
    BACKGROUND_GREY,
    TINY_DETR,
    Detector,
    GenEvalReward,
    detr_resize_hw,
    mask_boxes,
)
from digenrl.rewards.geneval_rules import Detected, Detections, judge, keep_detections, relative_position
from digenrl.validation import validate_config
from tests.systems.launcher import TINY


def xyxy(x0: float, y0: float, x1: float, y1: float) -> torch.Tensor:
    return torch.tensor([x0, y0, x1, y1])


def box(x0: float, y0: float, x1: float, y1: float) -> Detected:
    """A detection from a box detector (no mask)."""
    return Detected(xyxy(x0, y0, x1, y1))


def colours_by_x(objects: list[Detected], name: str) -> list[str]:
    """A stand-in for the CLIP colour classifier: boxes left of x=50 are red, the others blue."""
    return ["red" if float(o.box[0]) < 50 else "blue" for o in objects]


def verdict(detections: Detections, metadata: dict) -> tuple[bool, bool, float]:
    v = judge(detections, metadata, colours_by_x)
    return v.correct, v.strict, round(v.score, 6)


def test_relative_position_follows_geneval() -> None:
    left, right = xyxy(0, 40, 20, 60), xyxy(80, 40, 100, 60)
    assert relative_position(left, right) == {"left of"} and relative_position(right, left) == {"right of"}
    top, bottom = xyxy(40, 0, 60, 20), xyxy(40, 80, 60, 100)
    assert relative_position(top, bottom) == {"above"}  # image y grows downwards
    # a diagonal satisfies both relations (dx = dy = -76 / 113 < -0.5)
    assert relative_position(xyxy(0, 0, 20, 20), xyxy(80, 80, 100, 100)) == {"left of", "above"}
    # centres 30 px apart on x, sizes 100 + 100: the 0.1 x 200 = 20 px margin leaves dx = 10 / 30 < 0.5
    assert relative_position(xyxy(30, 0, 130, 100), xyxy(0, 0, 100, 100)) == set()
    assert relative_position(xyxy(60, 0, 160, 100), xyxy(0, 0, 100, 100)) == {"right of"}  # 40 / 60 > 0.5


def test_keep_detections_thresholds_order_and_cap() -> None:
    boxes = torch.stack([xyxy(i, 0, i + 10, 10) for i in range(5)])
    scores = torch.tensor([0.5, 0.95, 0.2, 0.92, 0.35])
    labels = ["dog", "dog", "dog", "cat", "dog"]
    kept = keep_detections(boxes, scores, labels, "two_object")
    assert [int(d.box[0]) for d in kept["dog"]] == [1, 0, 4] and len(
        kept["cat"]
    ) == 1  # > 0.3, most confident first
    kept = keep_detections(boxes, scores, labels, "counting")  # counting: > 0.9 only
    assert [int(d.box[0]) for d in kept["dog"]] == [1] and len(kept["cat"]) == 1
    assert len(keep_detections(boxes, scores, labels, "x", max_objects=2)["dog"]) == 2
    same = torch.stack([xyxy(0, 0, 10, 10), xyxy(0, 0, 10, 10)])
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


def test_mask_boxes_are_tight_and_empty_masks_give_zeros() -> None:
    masks = torch.zeros(2, 6, 8, dtype=torch.bool)
    masks[0, 1:4, 2:7] = True
    assert mask_boxes(masks).tolist() == [[2.0, 1.0, 7.0, 4.0], [0.0, 0.0, 0.0, 0.0]]


def test_colour_crops_grey_out_the_background_with_the_mask() -> None:
    reward = build_reward("tiny-geneval")
    image = torch.rand(3, 8, 8, generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(8, 8, dtype=torch.bool)
    mask[2:5, 2:5] = True
    with_mask, without = reward.colours.crops(image, [Detected(xyxy(1, 1, 6.5, 6), mask), box(1, 1, 6.5, 6)])
    assert with_mask.shape == without.shape == (1, 3, 5, 6)  # corners rounded outwards
    assert torch.equal(without[0], image[:, 1:6, 1:7])
    assert torch.equal(with_mask[0, :, 1:4, 1:4], image[:, 2:5, 2:5])  # the object itself
    assert bool((with_mask[0, :, 0] == BACKGROUND_GREY).all())  # outside the mask: GenEval's #999


def _tiny_case() -> tuple[torch.Tensor, list[str], list[dict]]:
    evaluation = PromptSet.load("geneval:eval")
    images = torch.rand(3, 3, 48, 64, generator=torch.Generator().manual_seed(0))
    return images, list(evaluation.prompts[:3]), [dict(m) for m in evaluation.metadata[:3]]


def test_tiny_mask2former_reward_scores_and_round_trips(tmp_path: Path) -> None:
    reward = build_reward("tiny-geneval")
    assert reward.detector.kind == "mask2former" and reward.num_parameters() > 0
    images, prompts, metadata = _tiny_case()
    scores = reward(images, prompts, metadata)
    assert scores.shape == (3,) and bool(((scores >= 0) & (scores <= 1)).all())
    reward.save_pretrained(tmp_path / "w")
    loaded = build_reward("tiny-geneval", weights_path=str(tmp_path / "w"))
    assert loaded.detector.kind == "mask2former"
    assert torch.equal(loaded(images, prompts, metadata), scores)
    for a, b in zip(reward.detector(images), loaded.detector(images), strict=True):
        (boxes, confidences, names, masks), (_, confidences_b, names_b, masks_b) = a, b
        assert names == names_b and torch.equal(masks, masks_b) and torch.allclose(confidences, confidences_b)
        # top 100 of 10 queries x 80 classes, every label one of GenEval's; masks at the image's size
        assert len(names) == 100 and set(names) <= set(GENEVAL_CLASSES) and masks.shape == (100, 48, 64)
        assert torch.equal(boxes, mask_boxes(masks)) and bool(((confidences >= 0) & (confidences <= 1)).all())
        kept = keep_detections(boxes, confidences, names, "x", masks, threshold=0.0)
        assert all(d.mask is not None and d.mask.shape == (48, 64) for found in kept.values() for d in found)
    # the colour path end to end on the masked crops of the first image's detections
    name = next(iter(kept))
    named = reward.colours(images[-1], kept[name], name)
    assert len(named) == len(kept[name]) and set(named) <= set(GENEVAL_COLORS)
    meta = {"tag": "colors", "include": [{"class": name, "count": 1, "color": named[0]}]}
    verdict = judge(kept, meta, lambda objects, n: reward.colours(images[-1], objects, n))
    # GenEval checks the top box's colour (the one named first); FlowGRPO's strict verdict wants one box
    assert verdict.correct and verdict.strict == (len(kept[name]) == 1)
    with pytest.raises(ValueError, match=r"missing: detector model config"):
        build_reward("tiny-geneval", weights_path=str(tmp_path))
    with pytest.raises(ValueError, match=r"needs GenEval metadata"):
        reward(images[:1], ["a cat"], [{}])


def test_a_detr_detector_directory_loads_too(tmp_path: Path) -> None:
    """A box detector (DETR) in ``detector/``: the same reward reads it, with box crops for colours."""
    reward = build_reward("tiny-geneval")
    reward.detector = Detector.random(TINY_DETR, seed=0, device=torch.device("cpu"), dtype=torch.float32)
    reward.save_pretrained(tmp_path / "w")
    loaded = build_reward("tiny-geneval", weights_path=str(tmp_path / "w"))
    assert loaded.detector.kind == "detr"
    images, prompts, metadata = _tiny_case()
    assert torch.equal(loaded(images, prompts, metadata), reward(images, prompts, metadata))
    for boxes, _, names, masks in loaded.detector(images):
        assert masks is None and len(names) == 12 and set(names) <= set(GENEVAL_CLASSES)
        assert boxes.shape == (12, 4) and bool(((boxes[:, 0::2] > -64) & (boxes[:, 0::2] < 128)).all())
