"""GenEval's rules: which detections count, and whether they satisfy a prompt's metadata.

GenEval (Ghosh et al., NeurIPS 2023, arXiv 2310.11513; github.com/djghosh13/geneval
evaluation/evaluate_images.py) turns a detector's boxes into per-class lists and checks a prompt's
``include`` / ``exclude`` clauses (metadata format: digenrl/data/geneval_prompts.py):

* **kept detections** (:func:`keep_detections`): per class, boxes above a confidence threshold (0.3; 0.9
  for ``counting`` prompts), most confident first, at most 16, optionally suppressing boxes that overlap a
  kept one by IoU ≥ ``max_overlap`` (1.0 = off, GenEval's default);
* **count**: a clause ``{"class", "count"}`` holds when at least ``count`` boxes of the class were kept;
  an ``exclude`` clause fails the image when ``count`` or more were kept;
* **colour**: the ``count`` most confident boxes of the class are classified among the ten colours (a CLIP
  zero-shot classifier on the box crop, digenrl/rewards/geneval.py); all must be ``color``;
* **position** (:func:`relative_position`): ``"position": [relation, i]`` asks each of this clause's boxes
  to stand in ``relation`` to every box matched by clause ``i``. A's offset from B's centre, shrunk on each
  axis by ``0.1 × (A's size + B's size)`` and normalised by the raw offset's length, must exceed 0.5 along
  the relation's direction (image y grows downwards: ``above`` is dy < −0.5).

Three verdicts come out of one pass (:func:`judge`):

* ``correct``: GenEval's benchmark verdict (evaluate_images.py ``evaluate``), binary;
* ``strict``: FlowGRPO's reward-server verdict (github.com/yifan123/reward-server reward_server/gen_eval.py
  ``evaluate_reward``): counts must be exact (``==``), every box of the class is colour- and
  position-checked;
* ``score``: that function's partial credit, what FlowGRPO trains on: the mean over clauses of ``1 −
  |count − found| / count``, plus for a coloured clause ``1 − |count − found in colour| / count`` (0 when
  the count was wrong) and for a positioned clause 1 or 0. The reward server appends a 1 after a failed
  position check as well as the 0 (the ``rewards.append(1.0)`` after its loop); here a failed check gives
  only the 0, which is what its ``correct`` flag and the GenEval verdict say.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

THRESHOLD = 0.3  # evaluate_images.py --options threshold (default)
COUNTING_THRESHOLD = 0.9  # ... counting_threshold
MAX_OBJECTS = 16  # ... max_objects
MAX_OVERLAP = 1.0  # ... max_overlap (NMS off)
POSITION_THRESHOLD = 0.1  # ... position_threshold

#: Detector label → GenEval class name, where the COCO checkpoints in transformers (DETR's id2label) use a
#: shorter word than GenEval's object_names.txt.
LABEL_ALIASES: dict[str, str] = {
    "mouse": "computer mouse",
    "remote": "tv remote",
    "keyboard": "computer keyboard",
    "tvmonitor": "tv",
    "hair dryer": "hair drier",
    "motorbike": "motorcycle",
    "aeroplane": "airplane",
    "sofa": "couch",
    "diningtable": "dining table",
    "pottedplant": "potted plant",
}

Box = Tensor  # [4] float: x0, y0, x1, y1 in pixels


@dataclass(frozen=True)
class Detected:
    """One kept detection: its box and, from an instance-segmentation detector, its mask ``[H, W]`` bool
    (GenEval greys out the background with it before classifying the colour)."""

    box: Box
    mask: Tensor | None = None


#: Kept detections: class name → detections, most confident first.
Detections = dict[str, list[Detected]]
#: Classifies detections of one class in one image among colour names: (detections, class name) → colours.
ColourClassifier = Callable[[list[Detected], str], list[str]]


@dataclass(frozen=True)
class Verdict:
    """What GenEval's rules say of one image: the benchmark verdict, FlowGRPO's strict verdict and its
    partial-credit score in ``[0, 1]`` (module docstring), and the reasons for any failure."""

    correct: bool
    strict: bool
    score: float
    reasons: tuple[str, ...]


def box_iou(a: Box, b: Box) -> float:
    """IoU with GenEval's inclusive pixel areas (``compute_iou``: ``x1 − x0 + 1``)."""

    def area(box: Sequence[float]) -> float:
        return max(box[2] - box[0] + 1, 0.0) * max(box[3] - box[1] + 1, 0.0)

    inter = area(
        [max(a[0], b[0]).item(), max(a[1], b[1]).item(), min(a[2], b[2]).item(), min(a[3], b[3]).item()]
    )
    union = area(a.tolist()) + area(b.tolist()) - inter
    return inter / union if union else 0.0


def keep_detections(
    boxes: Tensor,
    scores: Tensor,
    labels: Sequence[str],
    tag: str,
    masks: Tensor | None = None,
    *,
    threshold: float = THRESHOLD,
    counting_threshold: float = COUNTING_THRESHOLD,
    max_objects: int = MAX_OBJECTS,
    max_overlap: float = MAX_OVERLAP,
) -> Detections:
    """GenEval's per-class selection (evaluate_images.py ``evaluate_image``) of one image's detections
    (``boxes [N, 4]``, ``scores [N]``, a class name per box, optionally ``masks [N, H, W]``): above the
    threshold (the counting one for a ``counting`` prompt), most confident first, at most ``max_objects``,
    then greedy overlap suppression."""
    cutoff = counting_threshold if tag == "counting" else threshold
    kept: Detections = {}
    for name in dict.fromkeys(labels):
        rows = [i for i, label in enumerate(labels) if label == name and scores[i] > cutoff]
        rows.sort(key=lambda i: -float(scores[i]))
        order = rows[:max_objects]
        chosen: list[Detected] = []
        while order:
            best = order.pop(0)
            chosen.append(Detected(boxes[best], None if masks is None else masks[best]))
            if max_overlap < 1:
                order = [i for i in order if box_iou(boxes[best], boxes[i]) < max_overlap]
        if chosen:
            kept[name] = chosen
    return kept


def relative_position(a: Box, b: Box, threshold: float = POSITION_THRESHOLD) -> set[str]:
    """The relations of box ``a`` to box ``b`` (evaluate_images.py ``relative_position``)."""
    pair = torch.stack([a[:4], b[:4]]).double().view(2, 2, 2)  # box, corner, xy
    centre_a, centre_b = pair.mean(dim=1)
    size_a, size_b = (pair[:, 1] - pair[:, 0]).abs()
    offset = centre_a - centre_b
    revised = (offset.abs() - threshold * (size_a + size_b)).clamp(min=0) * offset.sign()
    if bool((revised.abs() < 1e-3).all()):
        return set()
    dx, dy = (revised / torch.linalg.vector_norm(offset)).tolist()
    relations = set()
    if dx < -0.5:
        relations.add("left of")
    if dx > 0.5:
        relations.add("right of")
    if dy < -0.5:
        relations.add("above")
    if dy > 0.5:
        relations.add("below")
    return relations


def _positions_hold(objects: list[Detected], targets: list[Detected], relation: str) -> tuple[bool, str]:
    for obj in objects:
        for target in targets:
            found = relative_position(obj.box, target.box)
            if relation not in found:
                return False, " and ".join(sorted(found)) or "no relation"
    return True, ""


def judge(detections: Detections, metadata: Mapping[str, Any], colours: ColourClassifier) -> Verdict:
    """GenEval's verdict, FlowGRPO's strict verdict and score of one image (module docstring)."""
    correct = strict = True
    reasons: list[str] = []
    parts: list[float] = []
    matched: list[list[Detected] | None] = []  # GenEval: what each include clause matched (None: failed)
    strict_matched: list[list[Detected] | None] = []
    for clause in metadata.get("include", []):
        name, count = clause["class"], int(clause["count"])
        found = detections.get(name, [])
        # GenEval: the `count` most confident boxes, at least `count` of them
        top = found[:count]
        ok = len(top) >= count
        # a box's colour does not depend on the others: classify every box once, read the top ones' prefix
        named = colours(found, name) if ok and "color" in clause else []
        if not ok:
            reasons.append(f"expected {name}>={count}, found {len(found)}")
        elif "color" in clause and named[:count].count(clause["color"]) < count:
            ok = False
            reasons.append(f"expected {clause['color']} {name}>={count}, found {', '.join(named[:count])}")
        if ok and "position" in clause:
            relation, target = clause["position"]
            if matched[target] is None:
                ok = False
                reasons.append(f"no target for {name} to be {relation}")
            else:
                ok, seen = _positions_hold(top, matched[target], relation)
                if not ok:
                    reasons.append(f"expected {name} {relation} target, found {seen}")
        correct &= ok
        matched.append(top if ok else None)
        # FlowGRPO's strict verdict and partial score: every box, exact counts
        parts.append(1 - abs(count - len(found)) / count)
        strict_ok = len(found) == count
        if not strict_ok:
            if "color" in clause or "position" in clause:
                parts.append(0.0)
        else:
            if "color" in clause:
                in_colour = named.count(clause["color"])
                parts.append(1 - abs(count - in_colour) / count)
                strict_ok = in_colour == count
            if strict_ok and "position" in clause:
                relation, target = clause["position"]
                targets = strict_matched[target]
                strict_ok = targets is not None and _positions_hold(found, targets, relation)[0]
                parts.append(float(strict_ok))
        strict &= strict_ok
        strict_matched.append(found if strict_ok else None)
    for clause in metadata.get("exclude", []):
        name, count = clause["class"], int(clause["count"])
        if len(detections.get(name, [])) >= count:
            correct = False
            reasons.append(f"expected {name}<{count}, found {len(detections[name])}")
    score = sum(parts) / len(parts) if parts else 0.0
    return Verdict(correct, strict, score, tuple(reasons))


def check_metadata(metadata: Mapping[str, Any], classes: Sequence[str], colours: Sequence[str]) -> str | None:
    """What is wrong with one prompt's GenEval metadata (``None`` when it is usable): ``include`` must be a
    non-empty list of clauses with a known ``class`` and a positive ``count``, a known ``color``, and a
    ``position`` ``[relation, index of an earlier clause]``."""
    from digenrl.data.geneval_prompts import GENEVAL_RELATIONS

    include = metadata.get("include")
    if not isinstance(include, list) or not include:
        return "no 'include' list (GenEval metadata: tag, include, exclude)"
    for i, clause in enumerate([*include, *metadata.get("exclude", [])]):
        if not isinstance(clause, Mapping) or clause.get("class") not in classes:
            return f"clause {i} names no known class ({clause!r})"
        count = clause.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            return f"clause {i} has count {count!r}; give a positive integer"
        if "color" in clause and clause["color"] not in colours:
            return f"clause {i} has color {clause['color']!r}; allowed: {', '.join(colours)}"
        if "position" in clause:
            position = clause["position"]
            ok = isinstance(position, list | tuple) and len(position) == 2
            if not ok or position[0] not in GENEVAL_RELATIONS or not (0 <= int(position[1]) < i):
                return f"clause {i} has position {position!r}; give [relation, index of an earlier clause]"
    return None
