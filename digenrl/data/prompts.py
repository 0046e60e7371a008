"""Prompt sources: which P prompts make up iteration k's logical batch.

The choice is a pure function of ``(seed, iteration)``, so a resumed run, a different rank count or a
different schedule all see the same prompts in the same order; a prompt's position in that list is
its *prompt index* (the group id used by advantages and by per-sample seeding).
"""

from __future__ import annotations

from pathlib import Path

import torch

from digenrl.config import read_text_file
from digenrl.rollout.noise import mix_seed

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


class PromptSource:
    """A fixed prompt pool sampled per iteration without replacement (with replacement only when the
    pool is smaller than the batch)."""

    def __init__(self, prompts: list[str] | tuple[str, ...], seed: int):
        if not prompts:
            raise ValueError("data.prompts: the prompt list is empty; give at least one prompt")
        self.prompts = list(prompts)
        self.seed = seed

    @classmethod
    def from_config(cls, source: str, seed: int) -> PromptSource:
        """``source`` is ``builtin`` or a path to a text file with one prompt per line."""
        if source == "builtin":
            return cls(BUILTIN_PROMPTS, seed)
        path = Path(source)
        if not path.is_file():
            raise ValueError(
                f"data.prompts={source!r} is neither 'builtin' nor an existing file; allowed: builtin or the "
                "path of a text file with one prompt per line"
            )
        prompts = [line.strip() for line in read_text_file(path, "data.prompts").splitlines()]
        if not any(prompts):
            raise ValueError(
                f"data.prompts={source!r}: the file has no prompts (one per line; blank lines are skipped)"
            )
        return cls([line for line in prompts if line], seed)

    def prompts_for(self, iteration: int, count: int) -> list[str]:
        """The ``count`` prompts of ``iteration``'s logical batch, in prompt-index order."""
        generator = torch.Generator().manual_seed(mix_seed(self.seed, iteration, 0x9407))
        n = len(self.prompts)
        if count <= n:
            order = torch.randperm(n, generator=generator)[:count]
        else:
            order = torch.randint(n, (count,), generator=generator)
        return [self.prompts[i] for i in order.tolist()]
