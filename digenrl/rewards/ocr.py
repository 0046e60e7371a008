"""OCR reward: does the image show the text the prompt asks for? ``1 − edit distance / target length``.

The reward is FlowGRPO's (flow_grpo/ocr.py ``OcrScorer.__call__``, the ``ocr`` entry of
flow_grpo/rewards.py): the target is the text between the prompt's first pair of double quotes
(``prompt.split('"')[1]``); target and read text are compared with spaces removed and lower-cased; the
distance is 0 when the target occurs in the read text, else the Levenshtein distance between them capped at
the target's length; the reward is ``1 − distance / len(target)``, in ``[0, 1]``. Here the target may also
come from the prompt set's metadata (a ``.jsonl`` prompt file's ``text`` field, docs/rewards.md), which wins
over the quotes; a prompt with neither is refused at start-up for ``data.prompts``
(:meth:`OcrReward.check_prompts`); met later (an evaluation set), its whole text is the target, as GenRL's
port of this reward does (ModelTC/GenRL genrl/reward/ocr.py), with a warning. The edit distance is a small
dynamic programme (:func:`edit_distance`): no declared dependency provides one.

OCR model: GOT-OCR 2.0 (Wei et al., "General OCR Theory", arXiv 2409.01704) as transformers'
``GotOcr2ForConditionalGeneration``, greedy decoding of its plain-OCR query. FlowGRPO reads the image
with PaddleOCR, a text detector followed by a line recogniser, over the whole image; GOT-OCR 2.0 likewise
reads all the text of a whole image (scene text and documents) in one model with no detector, which is
what this reward needs. TrOCR (``VisionEncoderDecoderModel``) was the alternative, but it recognises one
pre-cropped text line: on a whole generated image without a detector in front it would misread. Real size:
the stepfun-ai/GOT-OCR-2.0-hf configuration (a SAM-style ViT-B with window attention at 1024 px whose
16× downsampled neck gives 256 image tokens, and a 24-layer Qwen2 decoder of width 1024; 561 M
parameters). The query is the one ``GotOcr2Processor`` builds for plain OCR (the checkpoint has no chat
template): system turn, ``<img>`` + 256 ``<imgpad>`` + ``</img>``, ``OCR: ``. Decoding stops at
``<|im_end|>`` or after ``max_new_tokens``; random weights never stop early, so a cost measured with them
is the ``max_new_tokens`` worst case.

* ``reward.weights_path=/dir``: a LOCAL ``save_pretrained`` directory of GOT-OCR 2.0 (the
  stepfun-ai/GOT-OCR-2.0-hf snapshot): ``config.json`` + weights, tokenizer, ``preprocessor_config.json``;
* unset: random weights at that size (seeded, a warning that the scores are noise), the tokenizer the
  offline stand-in with GOT's special tokens added;
* ``tiny-ocr``: a 2 + 2-layer twin at 128 px (4 image tokens) for CPU tests.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from digenrl.rewards.base import PromptMetadata, RewardFunction
from digenrl.rewards.clip_backbone import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, ClipImageTransform
from digenrl.rewards.local_weights import (
    FULL_LAYOUT,
    build_random,
    check_batch_size,
    offline_tokenizer,
    require_files,
    save_pretrained_all,
    warn_random_weights,
)
from digenrl.rewards.registry import register_reward

log = logging.getLogger(__name__)

TARGET_FIELD = "text"  # the metadata field that names the text to render
IM_START, IM_END, IMG_START, IMG_END, IMG_PAD = "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<imgpad>"
GOT_SPECIAL_TOKENS = (IM_START, IM_END, IMG_START, IMG_END, IMG_PAD)
#: GotOcr2Processor's system turn (transformers models/got_ocr2/processing_got_ocr2.py ``system_query``).
GOT_SYSTEM = "system\nYou should follow the instructions carefully and explain your answers in detail."
NECK_DOWNSAMPLE = 4  # GotOcr2MultiModalProjector: two stride-2 convolutions after the patch grid

#: stepfun-ai/GOT-OCR-2.0-hf (transformers GotOcr2Config defaults: vision and Qwen2 text config).
GOT_OCR2: dict[str, Any] = {
    "vision_config": {
        "hidden_size": 768,
        "output_channels": 256,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "image_size": 1024,
        "patch_size": 16,
        "window_size": 14,
        "global_attn_indexes": [2, 5, 8, 11],
        "mlp_dim": 3072,
    },
    "text_config": {
        "vocab_size": 151860,
        "hidden_size": 1024,
        "intermediate_size": 2816,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
    },
}

TINY_GOT_OCR2: dict[str, Any] = {
    "vision_config": {
        "hidden_size": 32,
        "output_channels": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 128,
        "patch_size": 16,
        "window_size": 4,
        "global_attn_indexes": [1],
        "mlp_dim": 64,
    },
    "text_config": {
        "vocab_size": None,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
    },
}


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (unit-cost insertions, deletions, substitutions), two-row dynamic programme."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, start=1):
        current = [i]
        for j, char_b in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


def target_text(prompt: str, metadata: PromptMetadata) -> str | None:
    """The text the image should show: metadata ``text``, else the prompt's first double-quoted span
    (flow_grpo/ocr.py ``prompt.split('"')[1]``); ``None`` when neither gives a non-blank text."""
    text = metadata.get(TARGET_FIELD)
    if isinstance(text, str) and text.strip():
        return text
    parts = prompt.split('"')
    if len(parts) >= 3 and parts[1].strip():
        return parts[1]
    return None


def ocr_score(read: str, target: str) -> float:
    """flow_grpo/ocr.py's reward of ``read`` for ``target`` (module docstring), in ``[0, 1]``."""
    read = read.replace(" ", "").lower()
    target = target.replace(" ", "").lower()
    if not target:
        raise ValueError("the OCR target text is empty")
    distance = 0 if target in read else min(edit_distance(read, target), len(target))
    return 1.0 - distance / len(target)


def got_query(image_tokens: int) -> str:
    """GotOcr2Processor's plain-OCR conversation for one image of ``image_tokens`` tokens."""
    return (
        f"{IM_START}{GOT_SYSTEM}{IM_END}{IM_START}user\n{IMG_START}{IMG_PAD * image_tokens}{IMG_END}\n"
        f"OCR: {IM_END}{IM_START}assistant\n"
    )


def got_config(architecture: dict[str, Any], tokenizer: Any) -> Any:
    """A ``GotOcr2Config`` of ``architecture`` whose special ids are ``tokenizer``'s."""
    from transformers import GotOcr2Config

    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in GOT_SPECIAL_TOKENS}
    text = dict(architecture["text_config"])
    text["vocab_size"] = max(text.get("vocab_size") or 0, len(tokenizer))
    text.update(eos_token_id=ids[IM_END], bos_token_id=ids[IM_START], pad_token_id=tokenizer.pad_token_id)
    vision = dict(architecture["vision_config"])
    tokens = (vision["image_size"] // vision["patch_size"] // NECK_DOWNSAMPLE) ** 2
    return GotOcr2Config(
        vision_config=vision, text_config=text, image_token_index=ids[IMG_PAD], image_seq_length=tokens
    )


@register_reward("ocr")
class OcrReward(RewardFunction):
    """FlowGRPO's OCR reward of each image for its prompt's target text, read by GOT-OCR 2.0.

    Args:
        weights_path: local ``save_pretrained`` directory, or ``None`` for random weights (``seed``).
        dtype: model dtype (default: bf16 on CUDA, float32 elsewhere).
        batch_size: images per ``generate`` call.
        max_new_tokens: most tokens read per image.
    """

    needs_weights = True
    weights_optional = True
    weights_layout = FULL_LAYOUT
    architecture: dict[str, Any] = GOT_OCR2

    def __init__(
        self,
        weights_path: str | os.PathLike[str] | None = None,
        device: torch.device | str = "cpu",
        *,
        dtype: torch.dtype | None = None,
        batch_size: int = 16,
        max_new_tokens: int = 64,
        seed: int = 0,
    ) -> None:
        super().__init__(device)
        self.batch_size = check_batch_size(batch_size)
        self.max_new_tokens = check_batch_size(max_new_tokens)
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self._warned_prompts: set[str] = set()
        if weights_path is None:
            from transformers import GotOcr2ForConditionalGeneration

            self.tokenizer = offline_tokenizer(GOT_SPECIAL_TOKENS)
            config = got_config(self.architecture, self.tokenizer)
            self.model = build_random(
                GotOcr2ForConditionalGeneration, config, seed=seed, device=self.device, dtype=self.dtype
            )
            size = config.vision_config.image_size
            self.transform = ClipImageTransform(None, (size, size), None, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD)
            warn_random_weights(self.name, self.num_parameters(), "GOT-OCR 2.0 (save_pretrained)")
        else:
            self._load(os.fspath(weights_path))
        self.model.eval().requires_grad_(False)
        vision = self.model.config.vision_config
        self.image_tokens = (vision.image_size // vision.patch_size // NECK_DOWNSAMPLE) ** 2
        self.end_id = self.tokenizer.convert_tokens_to_ids(IM_END)

    def _load(self, directory: str) -> None:
        from transformers import (
            AutoConfig,
            AutoImageProcessor,
            AutoTokenizer,
            GotOcr2ForConditionalGeneration,
        )

        from digenrl.models.construction import realign_tensors

        require_files(directory, self.weights_layout, "GOT-OCR 2.0")
        config = AutoConfig.from_pretrained(directory, local_files_only=True)
        if config.model_type != "got_ocr2":
            raise ValueError(
                f"reward.weights_path={directory!r} holds a {config.model_type!r} model; the OCR reward runs "
                "GOT-OCR 2.0 checkpoints (model_type 'got_ocr2')"
            )
        model = GotOcr2ForConditionalGeneration.from_pretrained(
            directory, local_files_only=True, dtype=self.dtype
        )
        self.model = realign_tensors(model.to(self.device))
        self.tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        processor = AutoImageProcessor.from_pretrained(directory, local_files_only=True)
        if getattr(processor, "crop_to_patches", False):
            raise ValueError(
                f"{directory}/preprocessor_config.json sets crop_to_patches; the reward reads whole images"
            )
        self.transform = ClipImageTransform.from_image_processor(processor)

    def save_pretrained(self, directory: str | os.PathLike[str]) -> Path:
        """Write model, tokenizer and image processor so ``weights_path=directory`` loads this reward."""
        return save_pretrained_all(directory, self.model, self.tokenizer, self.transform.image_processor())

    @classmethod
    def check_prompts(cls, prompts: list[str], metadata: list[PromptMetadata], key: str) -> None:
        for index, (prompt, meta) in enumerate(zip(prompts, metadata, strict=True)):
            if target_text(prompt, meta) is None:
                raise ValueError(
                    f"{key}: prompt {index + 1} ({prompt!r}) gives the OCR reward no text to look for; "
                    f'put the text in double quotes in the prompt or give it as the "{TARGET_FIELD}" field '
                    "of a .jsonl prompt file (docs/rewards.md)"
                )

    @torch.no_grad()
    def read_text(self, images: Tensor) -> list[str]:
        """What GOT-OCR 2.0 reads in each image (greedy decoding, at most ``max_new_tokens`` tokens)."""
        device = self.model.lm_head.weight.device
        texts = []
        for start in range(0, images.shape[0], self.batch_size):
            chunk = images[start : start + self.batch_size]
            pixel_values = self.transform(chunk.to(device, torch.float32)).to(self.dtype)
            tokens = self.tokenizer(
                [got_query(self.image_tokens)] * chunk.shape[0],
                add_special_tokens=False,
                return_token_type_ids=False,
                return_tensors="pt",
            ).to(device)
            out = self.model.generate(
                **tokens,
                pixel_values=pixel_values,
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                eos_token_id=self.end_id,
                pad_token_id=self.tokenizer.pad_token_id,
            )
            texts += self.tokenizer.batch_decode(
                out[:, tokens["input_ids"].shape[1] :], skip_special_tokens=True
            )
        return texts

    def targets(self, prompts: list[str], metadata: list[PromptMetadata]) -> list[str]:
        found = []
        for prompt, meta in zip(prompts, metadata, strict=True):
            target = target_text(prompt, meta)
            if target is None:
                if prompt not in self._warned_prompts:
                    self._warned_prompts.add(prompt)
                    log.warning(
                        "OCR reward: prompt %r names no text (quotes or metadata); using all of it", prompt
                    )
                target = prompt
            found.append(target)
        return found

    def score_images(self, images: Tensor, prompts: list[str]) -> Tensor:
        return self.score_batch(images, prompts, [{} for _ in prompts])

    def score_batch(self, images: Tensor, prompts: list[str], metadata: list[PromptMetadata]) -> Tensor:
        targets = self.targets(prompts, metadata)
        read = self.read_text(images)
        scores = [ocr_score(text, target) for text, target in zip(read, targets, strict=True)]
        return torch.tensor(scores, dtype=torch.float32, device=images.device)


@register_reward("tiny-ocr")
class TinyOcrReward(OcrReward):
    """:class:`OcrReward` with a 2 + 2-layer GOT-OCR 2.0 at 128 px (CPU tests); loads directories alike."""

    architecture = TINY_GOT_OCR2
