"""The text condition a flow transformer consumes: token embeddings, optional pooled vector and mask.

One uniform container for all families so the rollout engine can batch prompt groups, duplicate them
per sample (`repeat_interleave`), concatenate cond + uncond halves for classifier-free guidance (`cat`),
slice micro-batches (`index_select` / `[]`) and ship them between ranks (`to_dict` / `from_dict`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from digenrl.data.device_index import index_on


class TextShape(Protocol):
    """The shapes of a text encoder's output (a model spec's ``text_encoder``,
    :class:`digenrl.models.spec_types.TextEncoderSpec`)."""

    @property
    def seq_len(self) -> int: ...
    @property
    def embed_dim(self) -> int: ...
    @property
    def pooled_dim(self) -> int | None: ...
    @property
    def uses_mask(self) -> bool: ...


@dataclass
class TextCondition:
    """`embeds` [B, L, D]; `pooled` [B, Dp] or None; `mask` [B, L] (bool, True = real token) or None.

    `lengths`: host-side real-token count of each row, known when every row's mask is a prefix (real tokens,
    then right padding): what lets a model cut the padding (digenrl/models/text_padding.py) without reading
    the mask back from the device on every forward. Row operations carry it along where they can on the host
    (slices, host indices, repeats, concatenation); :meth:`with_lengths` reads it from the mask once.
    """

    embeds: Tensor
    pooled: Tensor | None = None
    mask: Tensor | None = None
    lengths: tuple[int, ...] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.embeds.ndim != 3:
            raise ValueError(f"TextCondition.embeds must be [B, L, D], got shape {tuple(self.embeds.shape)}")
        batch, length = self.embeds.shape[:2]
        if self.pooled is not None and (self.pooled.ndim != 2 or self.pooled.shape[0] != batch):
            raise ValueError(
                f"TextCondition.pooled must be [B={batch}, Dp], got shape {tuple(self.pooled.shape)}"
            )
        if self.mask is not None and tuple(self.mask.shape) != (batch, length):
            raise ValueError(
                f"TextCondition.mask must be [B={batch}, L={length}], got shape {tuple(self.mask.shape)}"
            )
        if self.lengths is not None and (
            self.mask is None or len(self.lengths) != batch or not all(0 <= n <= length for n in self.lengths)
        ):
            raise ValueError(
                f"TextCondition.lengths must give one count in [0, L={length}] per row of a masked batch of "
                f"{batch}, got {self.lengths}"
            )

    @property
    def batch_size(self) -> int:
        return self.embeds.shape[0]

    def __len__(self) -> int:
        return self.batch_size

    @property
    def device(self) -> torch.device:
        return self.embeds.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embeds.dtype

    def _map(self, fn, lengths: tuple[int, ...] | None = None) -> TextCondition:
        """``fn`` applied to every tensor; ``lengths``: the result's host lengths, if the caller knows."""
        return TextCondition(
            embeds=fn(self.embeds),
            pooled=None if self.pooled is None else fn(self.pooled),
            mask=None if self.mask is None else fn(self.mask),
            lengths=lengths,
        )

    def index_select(
        self, index: Tensor | Sequence[int], *, device_index: Tensor | None = None
    ) -> TextCondition:
        """Rows `index` (any order, repeats allowed). A host index (a sequence or a CPU tensor) keeps the
        host lengths; a device index drops them (reading it back would be the sync they exist to avoid).
        ``device_index``: the same rows already on the embeddings' device (a caller that moved them once for
        several tensors); otherwise the host index is queued there without a host sync (data/device_index)."""
        lengths = None
        if self.lengths is not None and not (isinstance(index, Tensor) and index.device.type != "cpu"):
            lengths = tuple(self.lengths[i] for i in torch.as_tensor(index, dtype=torch.long).tolist())
        idx = index_on(index, self.embeds.device) if device_index is None else device_index
        if idx.device != self.embeds.device:
            raise ValueError(f"device_index is on {idx.device}, the embeddings on {self.embeds.device}")
        return self._map(lambda t: t.index_select(0, idx), lengths)

    def __getitem__(self, key: int | slice | Tensor | Sequence[int]) -> TextCondition:
        """Batch indexing that always keeps the batch dimension (an int gives a batch of one)."""
        if isinstance(key, int):
            if not -self.batch_size <= key < self.batch_size:
                raise IndexError(f"TextCondition index {key} out of range for batch {self.batch_size}")
            key = slice(key % self.batch_size, key % self.batch_size + 1)
        if isinstance(key, slice):
            return self._map(lambda t: t[key], None if self.lengths is None else self.lengths[key])
        return self.index_select(key)

    def repeat_interleave(self, repeats: int) -> TextCondition:
        """Each row repeated `repeats` times in place: [a, b] -> [a, a, b, b] (group expansion)."""
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        lengths = None if self.lengths is None else tuple(n for n in self.lengths for _ in range(repeats))
        return self._map(lambda t: t.repeat_interleave(repeats, dim=0), lengths)

    def with_lengths(self) -> TextCondition:
        """This condition with its host :attr:`lengths` (one read of the mask from its device when they are
        not known yet; call it once per batch, not per forward). Unchanged when there is no mask, or when a
        row's mask is not a prefix (then no length describes it and the padding stays)."""
        if self.mask is None or self.lengths is not None:
            return self
        mask = self.mask.cpu()
        counts = mask.sum(dim=1)
        prefix = torch.arange(mask.shape[1]).unsqueeze(0) < counts.unsqueeze(1)
        if not torch.equal(mask, prefix):
            return self
        return TextCondition(self.embeds, self.pooled, self.mask, tuple(counts.tolist()))

    @classmethod
    def random(
        cls,
        text: TextShape,
        batch: int,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        real_tokens: int | None = None,
    ) -> TextCondition:
        """Random embeddings with the shapes of ``text`` (a model spec's ``text_encoder``): what benchmarks
        feed a random-weight transformer in place of an encoded prompt (the systems cost does not depend on
        the values). ``real_tokens``: of a masked encoder, that many real tokens a row and the rest padding
        (zero embeddings, masked), as a padded prompt arrives; None = every token real."""
        embeds = torch.randn(batch, text.seq_len, text.embed_dim, device=device, dtype=dtype)
        pooled = (
            None
            if text.pooled_dim is None
            else torch.randn(batch, text.pooled_dim, device=device, dtype=dtype)
        )
        if not text.uses_mask:
            return cls(embeds, pooled, None)
        real = text.seq_len if real_tokens is None else real_tokens
        if not 1 <= real <= text.seq_len:
            raise ValueError(f"real_tokens={real_tokens} must be in [1, {text.seq_len}]")
        mask = torch.zeros(batch, text.seq_len, device=device, dtype=torch.bool)
        mask[:, :real] = True
        embeds[:, real:] = 0
        return cls(embeds, pooled, mask, lengths=(real,) * batch)

    @classmethod
    def cat(cls, conditions: Sequence[TextCondition]) -> TextCondition:
        """Concatenate along the batch (e.g. [cond, uncond] for classifier-free guidance)."""
        if not conditions:
            raise ValueError("TextCondition.cat needs at least one condition")
        has_pooled = {c.pooled is not None for c in conditions}
        has_mask = {c.mask is not None for c in conditions}
        if len(has_pooled) != 1 or len(has_mask) != 1:
            raise ValueError("TextCondition.cat: all conditions must agree on having pooled / mask")
        shapes = {tuple(c.embeds.shape[1:]) for c in conditions}
        if len(shapes) != 1:
            raise ValueError(f"TextCondition.cat: embeds [L, D] differ across conditions: {sorted(shapes)}")
        first = conditions[0]
        known = all(c.lengths is not None for c in conditions)
        return cls(
            embeds=torch.cat([c.embeds for c in conditions]),
            pooled=None if first.pooled is None else torch.cat([c.pooled for c in conditions]),
            mask=None if first.mask is None else torch.cat([c.mask for c in conditions]),
            lengths=tuple(n for c in conditions for n in c.lengths) if known else None,
        )

    def to(self, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> TextCondition:
        """Move; `dtype` applies to the floating tensors only (the mask stays bool)."""

        def move(t: Tensor) -> Tensor:
            if dtype is not None and t.is_floating_point():
                return t.to(device=device, dtype=dtype)
            return t.to(device=device)

        return self._map(move, self.lengths)

    def detach(self) -> TextCondition:
        return self._map(lambda t: t.detach(), self.lengths)

    def pin_memory(self) -> TextCondition:
        return self._map(lambda t: t.pin_memory(), self.lengths)

    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.to_dict().values())

    def to_dict(self) -> dict[str, Tensor]:
        """Tensors by name (absent fields omitted), for transport or checkpointing."""
        out = {"embeds": self.embeds}
        if self.pooled is not None:
            out["pooled"] = self.pooled
        if self.mask is not None:
            out["mask"] = self.mask
        return out

    @classmethod
    def from_dict(cls, tensors: dict[str, Tensor]) -> TextCondition:
        unknown = set(tensors) - {"embeds", "pooled", "mask"}
        if unknown or "embeds" not in tensors:
            raise ValueError(
                f"TextCondition.from_dict: keys {sorted(tensors)}; need 'embeds' (+ 'pooled', 'mask')"
            )
        return cls(embeds=tensors["embeds"], pooled=tensors.get("pooled"), mask=tensors.get("mask"))
