"""Prompt sets and prompt sources: which P prompts make up iteration k's logical batch.

A prompt set (``data.prompts`` for training, ``data.eval_prompts`` for evaluation) is one of (formats in
docs/rewards.md, "Prompt sets"):

* ``builtin`` (= ``builtin:train``): the small list :data:`BUILTIN_PROMPTS` shipped with the package;
  ``builtin:eval``: :data:`BUILTIN_EVAL_PROMPTS`, held out from it (no prompt in common);
* a published recipe's set shipped as a data file, ``NAME:SPLIT`` (``NAME`` alone = ``NAME:train``):
  :data:`SHIPPED_SETS` (``pickscore``, ``geneval``, ``ocr``, ``drawbench``; sources, commits and
  licences in digenrl/data/prompt_sets/README.md);
* a ``.jsonl`` file: one JSON object per line with a string field ``prompt``; every other field is the
  prompt's metadata, handed to the reward beside the prompt (e.g. ``text``, what an OCR reward expects
  the image to show);
* any other file: plain text, one prompt per line (blank lines skipped), no metadata.

The choice of an iteration's prompts is a pure function of ``(seed, iteration)``, so a resumed run, a
different rank count or a different schedule all see the same prompts in the same order; a prompt's
position in that list is its *prompt index* (the group id used by advantages and by per-sample seeding).

Metadata travels by prompt text: a rank that scores looks a prompt's metadata up in the sets it loaded
from the same config (:func:`metadata_lookup`), so trajectories and the transport carry only the text.
A set (or the training and evaluation sets together) may therefore not give one prompt text two
different metadata; that is refused at start-up, naming both places.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from digenrl.config import DataConfig, read_text_file
from digenrl.data.seeding import mix_seed

BUILTIN_PROMPTS: tuple[str, ...] = (
    "a red fox in fresh snow",
    "a lighthouse on a rocky coast at dusk",
    "a bowl of ripe oranges on a wooden table",
    "a snowy mountain under a clear blue sky",
    "a cat sleeping on a stack of books",
    "a city street at night with neon signs",
    "a field of sunflowers in summer",
    "an old steam train crossing a stone bridge",
    "a cup of coffee next to a croissant",
    "a green parrot on a branch",
    "a sailboat on a calm lake at sunrise",
    "a desert with tall sand dunes",
    "a bicycle leaning against a brick wall",
    "a waterfall in a tropical forest",
    "a plate of sushi on a black slate",
    "a hot air balloon over green hills",
    "a glass of lemonade with ice cubes",
    "a wolf howling at the full moon",
    "a cozy cabin in a pine forest",
    "a vintage car parked by the sea",
    "a stack of pancakes with berries",
    "a koi pond with lily pads",
    "an astronaut walking on the moon",
    "a chessboard with carved wooden pieces",
    "a robot painting a landscape",
    "a penguin on an iceberg",
    "a market stall full of spices",
    "a castle on a hill in fog",
    "a butterfly on a purple flower",
    "a library with tall bookshelves",
    "a bonfire on a beach at night",
    "a panda eating bamboo",
)

#: The built-in held-out set (``builtin:eval``): none of these is in :data:`BUILTIN_PROMPTS`.
BUILTIN_EVAL_PROMPTS: tuple[str, ...] = (
    "a fox curled up asleep in autumn leaves",
    "a windmill beside a tulip field",
    "a teapot and two cups on a tray",
    "a frozen lake under northern lights",
    "a dog catching a frisbee in a park",
    "a rainy alley with glowing lanterns",
    "a basket of apples in an orchard",
    "a paper boat floating in a puddle",
    "an owl perched on a fence post at dusk",
    "a rowing boat tied to a wooden pier",
    "a red barn in a snowy field",
    "a bowl of ramen with a soft-boiled egg",
    "a giraffe under an acacia tree",
    "a stone bridge over a mountain stream",
    "a violin resting on sheet music",
    "a jellyfish glowing in dark water",
)

BUILTIN_SETS: dict[str, tuple[str, ...]] = {
    "builtin": BUILTIN_PROMPTS,
    "builtin:train": BUILTIN_PROMPTS,
    "builtin:eval": BUILTIN_EVAL_PROMPTS,
}
PROMPT_FIELD = "prompt"

#: The folder of the shipped recipe prompt sets (package data; one README per set names its source).
PROMPT_SET_DIR = Path(__file__).with_name("prompt_sets")
#: Published recipes' prompt sets: name → split → file under :data:`PROMPT_SET_DIR`. A split the public
#: sources did not give us is absent; asking for it names where to get it (:data:`MISSING_SPLITS`).
SHIPPED_SETS: dict[str, dict[str, str]] = {
    "pickscore": {"train": "pickscore/train.txt", "eval": "pickscore/eval.txt"},
    "geneval": {"train": "geneval/train.jsonl", "eval": "geneval/eval.jsonl"},
    "ocr": {"eval": "ocr/eval.txt"},
    "drawbench": {"eval": "drawbench/eval.jsonl"},
}
MISSING_SPLITS: dict[str, str] = {
    "ocr:train": (
        "FlowGRPO's OCR training prompts (github.com/yifan123/flow_grpo dataset/ocr/train.txt) are not "
        "shipped: the public snapshot this package was built from lacked that file; download it and give its "
        "path (data.prompts=/path/to/train.txt)"
    ),
    "drawbench:train": "DrawBench is an evaluation benchmark (200 prompts) with no training split",
}


#: The longest prompt accepted, in characters: far beyond what any text encoder reads (T5's 512 tokens
#: are ~2,000 characters); a longer "prompt" is a wrong file, and would be tokenised whole every iteration.
MAX_PROMPT_CHARS = 20_000


@dataclass(frozen=True)
class PromptSet:
    """Prompts and, parallel to them, each prompt's metadata (empty mappings for a text file)."""

    prompts: tuple[str, ...]
    metadata: tuple[Mapping[str, Any], ...]
    source: str

    @classmethod
    def load(cls, source: str, key: str = "data.prompts") -> PromptSet:
        """Read ``source`` (a builtin name or a file, module docstring); errors name ``key`` and, for a
        bad line, the file and line number."""
        if source in BUILTIN_SETS:
            prompts = BUILTIN_SETS[source]
            return cls(prompts, tuple({} for _ in prompts), source)
        path = shipped_set_path(source, key) or Path(source)
        if not path.is_file():
            raise ValueError(
                f"{key}={source!r} is neither a shipped set nor an existing file; give a built-in set "
                f"({', '.join(BUILTIN_SETS)}), a shipped one ({', '.join(shipped_set_names())}), a .txt file "
                "(one prompt per line) or a .jsonl file (a 'prompt' field per line)"
            )
        rows = _read_jsonl(path, key) if path.suffix == ".jsonl" else _read_text(path, key)
        if not rows:
            what = (
                "JSON lines" if path.suffix == ".jsonl" else "prompts (one per line; blank lines are skipped)"
            )
            raise ValueError(f"{key}={source!r}: the file has no {what}")
        _check_consistent(rows, key, source)
        for line, prompt, _ in rows:
            if len(prompt) > MAX_PROMPT_CHARS:
                raise ValueError(
                    f"{key}={source!r}, line {line}: a prompt of {len(prompt)} characters; text encoders "
                    f"read at most a few hundred tokens (T5: 512), so keep prompts under {MAX_PROMPT_CHARS} "
                    "characters"
                )
        return cls(tuple(r[1] for r in rows), tuple(r[2] for r in rows), source)

    def __len__(self) -> int:
        return len(self.prompts)


def shipped_set_names() -> list[str]:
    """Every ``NAME:SPLIT`` of :data:`SHIPPED_SETS`."""
    return [f"{name}:{split}" for name, splits in SHIPPED_SETS.items() for split in splits]


def shipped_set_path(source: str, key: str) -> Path | None:
    """The data file of a shipped set (``NAME`` or ``NAME:SPLIT``), or ``None`` when ``source`` names none
    (then it is a path). A known name with a split that is not shipped is an error naming ``key``."""
    name, _, split = source.partition(":")
    if name not in SHIPPED_SETS or Path(source).exists():
        return None
    split = split or "train"
    spec = f"{name}:{split}"
    if split not in SHIPPED_SETS[name]:
        why = MISSING_SPLITS.get(spec, f"{name!r} has no split {split!r}")
        raise ValueError(
            f"{key}={source!r}: {why}; shipped splits of {name!r}: "
            f"{', '.join(f'{name}:{s}' for s in SHIPPED_SETS[name])}"
        )
    return PROMPT_SET_DIR / SHIPPED_SETS[name][split]


def _read_text(path: Path, key: str) -> list[tuple[int, str, Mapping[str, Any]]]:
    lines = [line.strip() for line in read_text_file(path, key).splitlines()]
    return [(number, line, {}) for number, line in enumerate(lines, start=1) if line]


def _read_jsonl(path: Path, key: str) -> list[tuple[int, str, Mapping[str, Any]]]:
    rows = []
    for number, line in enumerate(read_text_file(path, key).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{key}={str(path)!r}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{where}: each line must be a JSON object, got {type(record).__name__}")
        prompt = record.pop(PROMPT_FIELD, None)
        if not isinstance(prompt, str) or not prompt.strip():
            found = "no 'prompt' field" if prompt is None else f"'prompt' = {prompt!r}"
            raise ValueError(f"{where}: each object needs a non-empty string field 'prompt' ({found})")
        rows.append((number, prompt.strip(), record))
    return rows


def _check_consistent(rows: list[tuple[int, str, Mapping[str, Any]]], key: str, source: str) -> None:
    first: dict[str, tuple[int, Mapping[str, Any]]] = {}
    for number, prompt, metadata in rows:
        seen = first.setdefault(prompt, (number, metadata))
        if seen[1] != metadata:
            raise ValueError(
                f"{key}={source!r}: prompt {prompt!r} appears on lines {seen[0]} and {number} with different "
                "metadata; a prompt's metadata is found by its text, so give each text one metadata"
            )


def configured_prompt_sets(data: DataConfig) -> dict[str, PromptSet]:
    """The run's prompt sets by config key: ``data.prompts`` (training) and ``data.eval_prompts``."""
    return {
        "data.prompts": PromptSet.load(data.prompts, "data.prompts"),
        "data.eval_prompts": PromptSet.load(data.eval_prompts, "data.eval_prompts"),
    }


def metadata_lookup(sets: Mapping[str, PromptSet]) -> dict[str, Mapping[str, Any]]:
    """Prompt text → metadata over several sets (``{config key: set}``), for the rewards' score calls.

    Prompts without metadata are left out (the reward then gets an empty mapping); a text given two
    different metadata by two sets is refused, naming both keys."""
    found: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for key, prompt_set in sets.items():
        for prompt, metadata in zip(prompt_set.prompts, prompt_set.metadata, strict=True):
            other = found.setdefault(prompt, (key, metadata))
            if other[1] != metadata:
                raise ValueError(
                    f"prompt {prompt!r} has metadata {dict(other[1])} in {other[0]}="
                    f"{sets[other[0]].source!r} but {dict(metadata)} in {key}={prompt_set.source!r}; give it "
                    "the same metadata in both"
                )
    return {prompt: metadata for prompt, (_, metadata) in found.items() if metadata}


class PromptSource:
    """A fixed prompt pool sampled per iteration without replacement (with replacement only when the
    pool is smaller than the batch)."""

    def __init__(self, prompts: list[str] | tuple[str, ...], seed: int):
        if not prompts:
            raise ValueError("data.prompts: the prompt list is empty; give at least one prompt")
        self.prompts = list(prompts)
        self.seed = seed

    def prompts_for(self, iteration: int, count: int) -> list[str]:
        """The ``count`` prompts of ``iteration``'s logical batch, in prompt-index order."""
        generator = torch.Generator().manual_seed(mix_seed(self.seed, iteration, 0x9407))
        n = len(self.prompts)
        if count <= n:
            order = torch.randperm(n, generator=generator)[:count]
        else:
            order = torch.randint(n, (count,), generator=generator)
        return [self.prompts[i] for i in order.tolist()]
