"""GenEval's prompt vocabulary and task templates, and the shipped ``geneval:train`` split made from them.

GenEval (Ghosh et al., "GenEval: An Object-Focused Framework for Evaluating Text-to-Image Alignment",
NeurIPS 2023, arXiv 2310.11513; github.com/djghosh13/geneval) evaluates six compositional tasks over the
80 COCO classes: ``single_object``, ``two_object``, ``counting`` (2-4 objects, and not one more),
``colors`` (one object of one of ten colours, never a coloured person), ``position`` (object A left of /
right of / above / below object B) and ``color_attr`` (two objects, two different colours). Each prompt's
metadata says what the image must show: ``include`` (a list of ``{"class", "count"[, "color"][,
"position": [relation, index of the reference in include]]}``) and, for counting, ``exclude`` (a class and
a count the image must NOT reach). The benchmark's 553 prompts (``geneval:eval``) are the repository's
prompts/evaluation_metadata.jsonl, shipped as they are.

GenEval ships no training split. FlowGRPO trains on prompts made by the same templates with other draws
(flow_grpo dataset/geneval/train_metadata.jsonl); that file is not in the public snapshot this project
could read, so ``geneval:train`` is regenerated here by :func:`training_prompts`: the templates of
GenEval's prompts/create_prompts.py (same wording, article and plural rules, count range, colour and
position lists), drawn with a fixed seed, with every benchmark prompt removed so that evaluation stays
held out. ``tests/data/test_prompt_sets.py`` checks that the shipped file equals this function's output.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from typing import Any

#: The 80 COCO class names in GenEval's wording and order (geneval prompts/object_names.txt).
GENEVAL_CLASSES: tuple[str, ...] = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "computer mouse", "tv remote",
    "computer keyboard", "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book",
    "clock", "vase", "scissors", "teddy bear", "hair drier", "toothbrush",
)  # fmt: skip
#: GenEval's ten colours (create_prompts.py ``colors``; evaluate_images.py classifies crops among them).
GENEVAL_COLORS: tuple[str, ...] = (
    "red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white",
)  # fmt: skip
#: GenEval's relations; ``position: [relation, i]`` reads "this object is <relation> include[i]".
GENEVAL_RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
GENEVAL_TASKS: tuple[str, ...] = (
    "single_object",
    "two_object",
    "counting",
    "colors",
    "position",
    "color_attr",
)
NUMBER_WORDS: tuple[str, ...] = ("zero", "one", "two", "three", "four", "five")
COUNT_RANGE = (2, 4)  # create_prompts.py generate_counting_sample(max_count=4): 2..4 inclusive

#: ``geneval:train``'s draw: the seed and how many prompts of each task (before removing duplicates and the
#: benchmark's prompts; counting and colors have fewer distinct prompts than asked, so they come out whole).
TRAIN_SEED = 2310_11513
TRAIN_DRAWS: dict[str, int] = {
    "two_object": 1500,
    "counting": 1000,
    "colors": 2000,
    "position": 1500,
    "color_attr": 1500,
}


def _article(name: str) -> str:
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def _plural(name: str) -> str:
    return f"{name}es" if name.endswith("s") else f"{name}s"


def _colourable(rng: random.Random) -> str:
    """A class other than ``person`` (GenEval never asks for a coloured person)."""
    return rng.choice(GENEVAL_CLASSES[1:])


def draw_prompt(task: str, rng: random.Random) -> dict[str, Any]:
    """One prompt of ``task`` with its metadata, in GenEval's format and wording."""
    if task == "two_object":
        a, b = rng.sample(GENEVAL_CLASSES, 2)
        include = [{"class": a, "count": 1}, {"class": b, "count": 1}]
        return {"tag": task, "include": include, "prompt": f"a photo of {_article(a)} and {_article(b)}"}
    if task == "counting":
        name, count = rng.choice(GENEVAL_CLASSES), rng.randint(*COUNT_RANGE)
        return {
            "tag": task,
            "include": [{"class": name, "count": count}],
            "exclude": [{"class": name, "count": count + 1}],
            "prompt": f"a photo of {NUMBER_WORDS[count]} {_plural(name)}",
        }
    if task == "colors":
        name, colour = _colourable(rng), rng.choice(GENEVAL_COLORS)
        include = [{"class": name, "count": 1, "color": colour}]
        return {"tag": task, "include": include, "prompt": f"a photo of {_article(colour)} {name}"}
    if task == "position":
        a, b = rng.sample(GENEVAL_CLASSES, 2)
        relation = rng.choice(GENEVAL_RELATIONS)
        include = [{"class": b, "count": 1}, {"class": a, "count": 1, "position": [relation, 0]}]
        return {
            "tag": task,
            "include": include,
            "prompt": f"a photo of {_article(a)} {relation} {_article(b)}",
        }
    if task == "color_attr":
        a, b = rng.sample(GENEVAL_CLASSES[1:], 2)
        ca, cb = rng.sample(GENEVAL_COLORS, 2)
        include = [{"class": a, "count": 1, "color": ca}, {"class": b, "count": 1, "color": cb}]
        prompt = f"a photo of {_article(ca)} {a} and {_article(cb)} {b}"
        return {"tag": task, "include": include, "prompt": prompt}
    raise ValueError(f"unknown GenEval task {task!r}; allowed: {', '.join(GENEVAL_TASKS[1:])}")


def training_prompts(exclude: Iterable[str], seed: int = TRAIN_SEED) -> list[dict[str, Any]]:
    """``geneval:train``: :data:`TRAIN_DRAWS` prompts per task drawn with ``seed``, duplicates and every
    prompt text in ``exclude`` (the benchmark's) removed, in draw order. ``single_object`` is absent: its
    80 prompts are all in the benchmark."""
    rng = random.Random(seed)
    seen = set(exclude)
    rows = []
    for task, draws in TRAIN_DRAWS.items():
        for _ in range(draws):
            row = draw_prompt(task, rng)
            if row["prompt"] not in seen:
                seen.add(row["prompt"])
                rows.append(row)
    return rows


def to_jsonl(rows: Iterable[dict[str, Any]]) -> str:
    """GenEval's metadata file format: one JSON object per line, ``prompt`` last as in the benchmark."""
    lines = []
    for row in rows:
        ordered = {k: v for k, v in row.items() if k != "prompt"} | {"prompt": row["prompt"]}
        lines.append(json.dumps(ordered))
    return "\n".join(lines) + "\n"
