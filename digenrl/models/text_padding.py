"""Padded text without masked attention (``model.text_padding=split``, issue 37).

Qwen-Image's text encoder pads every prompt to ``max_length`` (512) and the transformer masks the padded text
keys (``encoder_hidden_states_mask``, diffusers 0.42 ``QwenDoubleStreamAttnProcessor2_0``). A mask sends
torch's SDPA to the memory-efficient kernel (no flash / cuDNN for an arbitrary mask), and the padded tokens
still go through every block's text-stream linears: with 1024 image tokens at 512², padding is a third of the
tokens a forward computes.

Cutting the padding is exact for such a transformer (declared by :attr:`ModelFamily.cuts_text_padding`):

* a padded text token is masked as a key in every block, so no real token or image token ever reads it;
  the image output, the only output, does not depend on it (its own row goes through the text stream
  token by token — RMSNorm, linears, modulation by the timestep — and is dropped at the end);
* text RoPE positions count from the first text token (diffusers ``QwenEmbedRope.forward``:
  ``txt_freqs = pos_freqs[max_vid_index : max_vid_index + text_seq_len]``), so the real tokens keep their
  positions when the padded tail is cut; ``compute_text_seq_len_from_mask`` takes the length from the
  embeddings' shape, which is the cut length when no mask is passed.

So rows are grouped by their real text length (:attr:`TextCondition.lengths`, known on the host), and each
group runs as one forward of its rows with the text cut to that length and no mask: the unmasked flash /
cuDNN kernels, and no padded tokens. Outputs are put back in the rows' order, so callers see the same
tensor; only float rounding differs (another kernel, other matmul shapes). A FlowGRPO group repeats one prompt
G times, so a micro-batch of one group is one forward; a classifier-free-guidance batch (cond ++ uncond) is
two. Rows whose lengths are unknown (a mask that is not a prefix) or zero keep the padded, masked forward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from digenrl.config import TEXT_PADDING_MODES
from digenrl.data.device_index import index_on
from digenrl.data.text_condition import TextCondition

__all__ = ["TEXT_PADDING_MODES", "check_text_padding", "length_groups", "padding_free_forward"]

#: (latents [b, ...], sigma [b], condition of b rows, guidance [b] or None) -> velocity [b, ...]
Forward = Callable[[Tensor, Tensor, TextCondition, Tensor | None], Tensor]


def check_text_padding(mode: str) -> str:
    if mode not in TEXT_PADDING_MODES:
        raise ValueError(f"model.text_padding={mode!r}; allowed: {', '.join(TEXT_PADDING_MODES)}")
    return mode


def length_groups(lengths: tuple[int, ...]) -> list[tuple[int, list[int]]]:
    """``(length, rows)`` for each distinct length, in order of first appearance."""
    groups: dict[int, list[int]] = {}
    for row, n in enumerate(lengths):
        groups.setdefault(n, []).append(row)
    return list(groups.items())


def _rows(t: Tensor | None, rows: list[int]) -> Tensor | None:
    """Rows of ``t``: a slice when they are consecutive (a view, no copy), else an index queued to the device
    (no host sync: digenrl/data/device_index.py)."""
    if t is None:
        return None
    if rows == list(range(rows[0], rows[-1] + 1)):
        return t[rows[0] : rows[-1] + 1]
    return t.index_select(0, index_on(rows, t.device))


def padding_free_forward(
    forward: Forward, latents: Tensor, sigma: Tensor, cond: TextCondition, guidance: Tensor | None
) -> Tensor:
    """``forward`` over ``cond``'s rows grouped by real text length, each group with its text cut to that
    length and no mask (module docstring); the padded, masked ``forward`` where lengths are unknown."""
    cond = cond.with_lengths()  # no device read when the lengths came with the condition
    if cond.mask is None or cond.lengths is None or min(cond.lengths) == 0:
        return forward(latents, sigma, cond, guidance)
    groups = length_groups(cond.lengths)
    outs, order = [], []
    for n, rows in groups:
        # contiguous: a cut [rows, :n] is a strided view, which the blocks' linears and norms would copy or
        # run on slow strided kernels (bf16 on a CPU: 10x), and compile would specialise on its strides
        part = TextCondition(_rows(cond.embeds, rows)[:, :n].contiguous(), _rows(cond.pooled, rows))
        outs.append(forward(_rows(latents, rows), _rows(sigma, rows), part, _rows(guidance, rows)))
        order += rows
    if len(outs) == 1:
        return outs[0]
    out = torch.cat(outs)
    if order == sorted(order):
        return out
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.as_tensor(order)] = torch.arange(len(order))
    return out.index_select(0, index_on(inverse, out.device))
