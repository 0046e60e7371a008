"""What the simulator and the planner need to price Ulysses sequence parallelism of a model, torch-free
(docs/models.md, "Sequence parallelism"; the runtime: digenrl/models/sequence_parallel.py).

DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv 2309.14509, §3): with the sequence sharded over N ranks, each
attention exchanges its activations in all-to-alls — before attention the sequence shards of Q, K and V
become head shards, after it the output's head shards become sequence shards again. In one all-to-all a
rank sends (N−1)/N of its local tensor (tokens/N × hidden per sample), so its bytes fall as 1/N while the
compute falls as 1/N too; the paper keeps the communication per link constant as N and the sequence grow
together. nccl-tests (doc/PERFORMANCE.md) prices an all-to-all the same way: (n−1)/n of the bytes over
each rank's link.

Only models with a diffusers context-parallel plan can be sharded (digenrl/models/sequence_parallel.py);
among the zoo's video models that is Wan (HunyuanVideo has none in diffusers 0.42). The entries mirror the
model specs (``tests/plan/test_sequence_shape.py`` checks they agree), as
:mod:`digenrl.plan.rollout_defaults` does for the rollout defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SequenceShape:
    """One transformer's attention geometry: heads, hidden width (heads × head dim), blocks, the patch
    (temporal, spatial) over the latent, and the activation-sized all-to-alls each block makes per
    forward: Wan's self-attention 4 (Q, K, V in, output back) and its text cross-attention 2 (the query in,
    the output back; the text keys and values, 512 tokens against tens of thousands, are left out)."""

    heads: int
    hidden: int
    blocks: int
    patch: tuple[int, int]
    exchanges_per_block: int

    def tokens(self, latent_shape: list[int] | tuple[int, ...]) -> int:
        """Tokens of one sample whose latent is ``latent_shape`` (C, f, h, w)."""
        _, frames, height, width = latent_shape
        patch_t, patch = self.patch
        return (frames // patch_t) * (height // patch) * (width // patch)

    def exchange_bytes(
        self, samples: int, tokens: int, degree: int, passes: int, dtype_bytes: int = 2
    ) -> float:
        """Bytes one rank of an N = ``degree`` group sends in the all-to-alls of ``passes`` passes
        (forward = 1; the backward exchanges as many tensors again, a checkpointed forward's recomputation
        once more) over ``samples`` samples of ``tokens`` tokens (module docstring)."""
        if degree <= 1 or samples <= 0:
            return 0.0
        local = samples * tokens / degree * self.hidden * dtype_bytes
        return passes * self.blocks * self.exchanges_per_block * local * (degree - 1) / degree


_WAN21_1_3B = SequenceShape(heads=12, hidden=12 * 128, blocks=30, patch=(1, 2), exchanges_per_block=6)
_WAN21_14B = SequenceShape(heads=40, hidden=40 * 128, blocks=40, patch=(1, 2), exchanges_per_block=6)
SEQUENCE_SHAPES: dict[str, SequenceShape] = {
    "wan2.1-1.3b": _WAN21_1_3B,
    "wan2.1-14b": _WAN21_14B,
    "tiny-wan": SequenceShape(heads=2, hidden=2 * 12, blocks=2, patch=(1, 2), exchanges_per_block=6),
}


def sequence_shape(model: str) -> SequenceShape | None:
    """``model``'s entry; None where its sequence cannot be sharded (no diffusers context-parallel plan)."""
    return SEQUENCE_SHAPES.get(model)


def sequence_degrees(
    model: str, latent_shape: list[int] | tuple[int, ...], devices_per_node: int
) -> list[int]:
    """The degrees N > 1 the planner tries for ``model``: dividing its heads, its tokens at ``latent_shape``
    and the devices of a node (a group stays inside one node: its all-to-alls run on the intra-node link)."""
    shape = sequence_shape(model)
    if shape is None:
        return []
    tokens = shape.tokens(latent_shape)
    return [
        n
        for n in range(2, devices_per_node + 1)
        if devices_per_node % n == 0 and shape.heads % n == 0 and tokens % n == 0
    ]


def group_problem(
    ranks: Sequence[int], degree: int, node_of: Callable[[int], int], key: str = "sequence_parallel"
) -> str | None:
    """Why groups of ``degree`` consecutive ranks of a pool (``ranks``) cannot cover it inside nodes (None:
    they can); ``node_of``: rank → node (the profile's); ``key`` names the knob in the message."""
    ranks = tuple(ranks)
    if len(ranks) % degree:
        return f"{key}={degree} does not divide the pool's {len(ranks)} ranks; use a divisor of {len(ranks)}"
    for first in range(0, len(ranks), degree):
        group = ranks[first : first + degree]
        nodes = {node_of(r) for r in group}
        if len(nodes) > 1:
            return (
                f"{key}={degree}: ranks {group[0]}-{group[-1]} span nodes {sorted(nodes)}; a group must stay "
                "inside one node (its all-to-alls run on the intra-node link), so choose a degree that "
                "divides the pool's devices per node"
            )
    return None


#: Systems whose schedule shares samples out per sequence-parallel group (the runtime's: colocated_sync.py,
#: separate_sync.py).
SEQUENCE_PARALLEL_SYSTEMS = ("colocated-sync", "separate-sync")


def support_problem(key: str, degree: int, system: str, mode: str, backend: str, split: str) -> str | None:
    """Why a run of ``system`` (trainer ``mode`` / ``backend``, ``colocated.split``) cannot shard its sequence
    ``degree`` ways (None: it can), naming ``key``: the runtime wires it for ``colocated-sync`` with
    replicated LoRA training (and, colocated, an equal split) so far (docs/models.md, "Sequence
    parallelism")."""
    if degree == 1:
        return None
    if system not in SEQUENCE_PARALLEL_SYSTEMS:
        return (
            f"{key}={degree} runs under system={' or '.join(SEQUENCE_PARALLEL_SYSTEMS)} so far, not "
            f'system={system!r}; set {key}=1 or change the system (docs/models.md, "Sequence parallelism")'
        )
    if mode != "lora" or backend in ("fsdp2", "deepspeed"):
        return (
            f"{key}={degree} is wired for replicated LoRA training (trainer.mode=lora, trainer.backend=auto, "
            f"ddp or none), not trainer.mode={mode} trainer.backend={backend}; set {key}=1"
        )
    if split != "equal":
        return (
            f"{key}={degree} shares samples out equally per group; set colocated.split=equal (got {split!r})"
        )
    return None
