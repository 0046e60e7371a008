"""VLM-judge reward: a vision-language model asked a yes/no question about the prompt and the image.

score = P(yes) / (P(yes) + P(no)) from the next-token distribution after the question, i.e.
``sigmoid(logsumexp(logits[yes ids]) − logsumexp(logits[no ids]))``, in ``[0, 1]``. One batched forward
under no_grad, no generation loop; the logits are taken at the last position only (``logits_to_keep=1``,
so the ``[B, T, vocab]`` tensor never exists) and reduced in float32.

This is the VQAScore recipe (Lin et al., "Evaluating Text-to-Visual Generation with Image-to-Text
Generation", arXiv 2404.01291: P("Yes") for "Does this figure show '{text}'? Please answer yes or no."),
normalised over the two answers as the brief of docs/design.md §4 ("Where disaggregation can win") needs a
bounded reward. VLM judges of this size are used as FlowGRPO rewards (flow_grpo/rewards.py
``unifiedreward_score_sglang`` queries UnifiedReward-7B; UnifiedReward-qwen-7b is a
``Qwen2_5_VLForConditionalGeneration``); they generate a rationale and parse a score, which costs a decode
loop on top of the one forward timed here.

Architecture: transformers' ``Qwen2_5_VLForConditionalGeneration``.

* ``vlm-judge``: Qwen2.5-VL-7B-Instruct's configuration (8.29 B parameters: 28 decoder layers of width
  3584 with GQA 28/4 heads, vocabulary 152064, untied head; a 32-block, 1280-wide window-attention ViT with
  patch 14 and 2×2 token merging). ``tiny-vlm-judge``: the same architecture with 2 + 2 layers of width
  64 / 32 for CPU tests.
* ``reward.weights_path`` unset: random weights (seeded by ``seed``) at that size, the tokenizer the
  offline BERT WordPiece stand-in (:func:`digenrl.models.text.fallback_tokenizer_dir`) with Qwen's chat and
  vision special tokens added. The systems cost does not depend on weight values, as for the generators
  (docs/rewards.md, "Rewards with a model"); a run built like this logs a warning, because its reward is
  noise.
* ``reward.weights_path=/dir``: a LOCAL directory written by ``save_pretrained`` (the Qwen2.5-VL-7B-Instruct
  or UnifiedReward-qwen-7b snapshot, or :meth:`VLMJudge.save_pretrained`): ``config.json`` + safetensors
  (``from_pretrained(local_files_only=True)``), the tokenizer files, ``preprocessor_config.json``. The chat
  template is the tokenizer's (or ``chat_template.jinja`` / ``chat_template.json`` in the directory);
  without one the question is wrapped in Qwen's ChatML turn format (:func:`chatml_text`).

``needs_weights = True`` (the judge runs a model, so it can live on scorer ranks and its bytes count in
``reward_param_bytes``) with ``weights_optional = True``: :func:`digenrl.rewards.registry.build_reward`
passes ``weights_path`` through, ``None`` meaning random weights at the configured size.

Vision attention (``vision_attention``). The ViT attends within 112-pixel windows (and over the whole image
in 4 of its 32 blocks). With SDPA, transformers runs one attention call per window
(``Qwen2_5_VLVisionAttention`` splits at ``cu_seqlens``): 25 windows per 504² image × 28 windowed blocks,
11,200 small calls for 16 images, so the tower is launch-bound (measured on one H200, random weights, bf16:
0.86 s for the vision tower on 16 images, 0.17 s with one call). ``varlen`` packs every window of the batch
into ONE call of torch's variable-length flash attention (``torch.nn.attention.varlen.varlen_attn``, CUDA,
16-bit), as FlashAttention-2 deployments of this model do; ``loop`` keeps transformers' per-window calls;
``auto`` (default) is ``varlen`` where that kernel runs (CUDA, bf16/fp16, a torch with ``varlen_attn``,
``attn_implementation="sdpa"``), else ``loop``. Both compute the same function: off CUDA the varlen entry
point loops over the windows itself, so CPU tests check its packing exactly; on the H200 in bf16 both paths
are 2.5% (relative L2, random weights, 4 images) from a float32 run of the tower and 2.2% from each other.

Image preprocessing reproduces ``Qwen2VLImageProcessor`` on tensors (as :mod:`clip_backbone` does for CLIP):
``smart_resize`` to multiples of patch × merge within ``[min_pixels, max_pixels]``, bicubic antialiased
resize, normalisation with the processor's mean/std, and the flat patch layout the vision tower's
``Conv3d`` patch embedding reads (each still image repeated ``temporal_patch_size`` times). A 512² image
becomes 504² = 36 × 36 patches = 324 language-model tokens.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from digenrl.models.families.qwen_image import QWEN25_VL_7B_CONFIG
from digenrl.rewards.base import RewardFunction
from digenrl.rewards.local_weights import (
    FULL_LAYOUT,
    build_random,
    check_batch_size,
    require_files,
    save_pretrained_all,
    warn_random_weights,
)
from digenrl.rewards.local_weights import offline_tokenizer as stand_in_tokenizer
from digenrl.rewards.registry import register_reward

log = logging.getLogger(__name__)

DEFAULT_QUESTION = 'Does this image show "{prompt}"? Please answer yes or no.'
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."  # Qwen2-VL / Qwen2.5-VL chat template default
YES_WORDS = ("Yes", "yes")
NO_WORDS = ("No", "no")
IMAGE_TOKEN = "<|image_pad|>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
#: Tokens the offline stand-in tokenizer gets, so the Qwen2.5-VL prompt format tokenises as one id each.
QWEN_SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", VISION_START, VISION_END, IMAGE_TOKEN, "<|video_pad|>")

#: Qwen2.5-VL-7B-Instruct (config.json of the public checkpoint; 8,292,166,656 parameters): the one
#: declaration, also Qwen-Image's text encoder (digenrl/models/families/qwen_image.py).
QWEN25_VL_7B: dict[str, dict[str, Any]] = QWEN25_VL_7B_CONFIG
#: The tiny twin: same architecture and image pipeline, 2 + 2 layers (vocabulary: the tokenizer's).
TINY_QWEN25_VL: dict[str, dict[str, Any]] = {
    "text_config": {
        "vocab_size": None,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "rope_theta": 1000000.0,  # the rope settings spelled as the 7B's (one form for both)
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    },
    "vision_config": {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 64,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 56,
        "fullatt_block_indexes": [1],
        "tokens_per_second": 2,
    },
}
#: Qwen2-VL / Qwen2.5-VL preprocessor defaults (OpenAI CLIP mean/std, 56² .. 28²·1280 pixels).
QWEN_IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
QWEN_IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)
QWEN_MIN_PIXELS = 56 * 56
QWEN_MAX_PIXELS = 28 * 28 * 1280


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's target size: both sides multiples of ``factor``, area within [min_pixels, max_pixels],
    aspect ratio kept as well as possible (the rule of transformers' ``qwen2_vl`` ``smart_resize``)."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio must be below 200, got {height}x{width}")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


#: Registered with transformers' ``AttentionInterface`` for the vision tower only. The name contains "flash"
#: because Qwen2.5-VL's vision attention hands the windows' ``cu_seqlens`` to flash-style implementations
#: only (transformers ``is_flash_attention_requested``); every other implementation is called per window.
VARLEN_ATTENTION = "flash_varlen_torch"
VISION_ATTENTION_MODES = ("auto", "loop", "varlen")


def varlen_window_attention(
    module: Any,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None = None,
    scaling: float | None = None,
    dropout: float = 0.0,
    cu_seq_lens_q: Tensor | None = None,
    max_length_q: int | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Attention of ``[1, H, T, D]`` packed windows bounded by ``cu_seq_lens_q`` → ``([T, H, D], None)``.

    One ``varlen_attn`` call on CUDA in 16 bits; elsewhere one SDPA call per window (what transformers' own
    non-flash path does), so CPU tests check the packing of this entry point exactly.
    """
    if cu_seq_lens_q is None or attention_mask is not None or dropout:
        raise ValueError("varlen window attention needs cu_seq_lens_q, no attention_mask and no dropout")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, H, D]
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        from torch.nn.attention.varlen import varlen_attn

        cu = cu_seq_lens_q.to(device=q.device, dtype=torch.int32)
        longest = int(max_length_q) if max_length_q is not None else int((cu[1:] - cu[:-1]).max())
        return varlen_attn(q, k, v, cu, cu, longest, longest, scale=scaling), None
    bounds = cu_seq_lens_q.tolist()
    windows = [
        F.scaled_dot_product_attention(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], scale=scaling)
        for a, b in itertools.pairwise(bounds)
    ]
    return torch.cat(windows, dim=2)[0].transpose(0, 1), None


def varlen_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``varlen_attn``'s flash kernel runs here (CUDA, 16-bit, a torch that has it)."""
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return False
    return importlib.util.find_spec("torch.nn.attention.varlen") is not None


def _register_varlen_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(VARLEN_ATTENTION, varlen_window_attention)


@dataclass(frozen=True)
class QwenImageTransform:
    """Tensor version of ``Qwen2VLImageProcessor``: ``[N, 3, H, W]`` in ``[0, 1]`` → patches + grid."""

    min_pixels: int = QWEN_MIN_PIXELS
    max_pixels: int = QWEN_MAX_PIXELS
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    mean: tuple[float, float, float] = QWEN_IMAGE_MEAN
    std: tuple[float, float, float] = QWEN_IMAGE_STD

    @classmethod
    def from_image_processor(cls, processor: Any) -> QwenImageTransform:
        size = processor.size
        get = size.get if isinstance(size, dict) else lambda key, default=None: getattr(size, key, default)
        mean = processor.image_mean if processor.do_normalize else (0.0, 0.0, 0.0)
        std = processor.image_std if processor.do_normalize else (1.0, 1.0, 1.0)
        return cls(
            min_pixels=int(get("shortest_edge", None) or QWEN_MIN_PIXELS),
            max_pixels=int(get("longest_edge", None) or QWEN_MAX_PIXELS),
            patch_size=int(processor.patch_size),
            temporal_patch_size=int(processor.temporal_patch_size),
            merge_size=int(processor.merge_size),
            mean=tuple(float(v) for v in mean),  # type: ignore[arg-type]
            std=tuple(float(v) for v in std),  # type: ignore[arg-type]
        )

    def image_processor(self) -> Any:
        """The transformers (PIL-backend) processor with these settings, for ``save_pretrained``."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        return Qwen2VLImageProcessorPil(
            size={"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels},
            patch_size=self.patch_size,
            temporal_patch_size=self.temporal_patch_size,
            merge_size=self.merge_size,
            image_mean=list(self.mean),
            image_std=list(self.std),
        )

    def output_hw(self, height: int, width: int) -> tuple[int, int]:
        factor = self.patch_size * self.merge_size
        return smart_resize(height, width, factor, self.min_pixels, self.max_pixels)

    def tokens_per_image(self, height: int, width: int) -> int:
        """Language-model tokens one ``height × width`` image becomes (patches / merge²)."""
        out_h, out_w = self.output_hw(height, width)
        return (out_h // self.patch_size) * (out_w // self.patch_size) // self.merge_size**2

    def __call__(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """``(pixel_values [N·gh·gw, 3·T·P·P], image_grid_thw [N, 3])`` of float32 images in [0, 1]."""
        batch, channels = images.shape[:2]
        out_h, out_w = self.output_hw(*images.shape[-2:])
        if (out_h, out_w) != tuple(images.shape[-2:]):
            images = F.interpolate(
                images, size=(out_h, out_w), mode="bicubic", align_corners=False, antialias=True
            )
            images = images.clamp(0.0, 1.0)  # the processor resamples uint8 through PIL, which clips
        mean = torch.tensor(self.mean, dtype=images.dtype, device=images.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, dtype=images.dtype, device=images.device).view(1, 3, 1, 1)
        images = (images - mean) / std
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        grid_h, grid_w = out_h // p, out_w // p
        # Patch order: merge windows row-major, then the m×m patches inside a window; within a patch the
        # (channel, time, row, column) order of the vision tower's Conv3d kernel.
        patches = images.reshape(batch, channels, grid_h // m, m, p, grid_w // m, m, p)
        patches = patches.permute(0, 2, 5, 3, 6, 1, 4, 7)  # [N, gh/m, gw/m, m, m, C, p, p]
        patches = patches.unsqueeze(6).expand(*patches.shape[:6], t, p, p)
        pixel_values = patches.reshape(batch * grid_h * grid_w, channels * t * p * p)
        grid = torch.tensor([[1, grid_h, grid_w]] * batch, dtype=torch.long, device=images.device)
        return pixel_values, grid


def chatml_text(question: str, system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> str:
    """One user turn holding an image and ``question``, then the assistant's turn opening, in the ChatML
    turn format of Qwen2-VL / Qwen2.5-VL (used when the tokenizer has no chat template)."""
    return (
        f"<|im_start|>system\n{system_prompt}<|im_end|>\n"
        f"<|im_start|>user\n{VISION_START}{IMAGE_TOKEN}{VISION_END}{question}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def build_config(architecture: dict[str, dict[str, Any]], tokenizer: Any) -> Any:
    """A ``Qwen2_5_VLConfig`` of ``architecture`` whose special ids are ``tokenizer``'s (random weights)."""
    from transformers import Qwen2_5_VLConfig

    text = dict(architecture["text_config"])
    text["vocab_size"] = text["vocab_size"] or len(tokenizer)
    if text["vocab_size"] < len(tokenizer):
        raise ValueError(f"vocab_size {text['vocab_size']} is smaller than the tokenizer ({len(tokenizer)})")
    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in QWEN_SPECIAL_TOKENS}
    text.update(
        bos_token_id=ids["<|im_start|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=tokenizer.pad_token_id
    )
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config=dict(architecture["vision_config"]),
        image_token_id=ids[IMAGE_TOKEN],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=False,
    )


def offline_tokenizer() -> Any:
    """The offline WordPiece stand-in with Qwen's chat / vision special tokens added (one id each)."""
    return stand_in_tokenizer(QWEN_SPECIAL_TOKENS)


def _chat_template_from_dir(directory: str) -> str | None:
    jinja = Path(directory) / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    as_json = Path(directory) / "chat_template.json"
    if as_json.is_file():
        return json.loads(as_json.read_text()).get("chat_template")
    return None


def answer_token_ids(tokenizer: Any, words: tuple[str, ...]) -> list[int]:
    """Distinct ids of ``words``; each must be ONE token (the first token of the answer is scored)."""
    ids = []
    for word in words:
        pieces = tokenizer.encode(word, add_special_tokens=False)
        if len(pieces) != 1:
            raise ValueError(
                f"answer word {word!r} is {len(pieces)} tokens for this tokenizer; it must be one"
            )
        ids.append(int(pieces[0]))
    return sorted(set(ids))


def default_dtype_for(device: torch.device) -> torch.dtype:
    """bf16 on GPUs (how 7B judges are served), float32 elsewhere."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


@register_reward("vlm-judge")
class VLMJudge(RewardFunction):
    """P(yes) of a Qwen2.5-VL judge asked whether the image shows the prompt, batched, no grad.

    Args:
        weights_path: local ``save_pretrained`` directory, or ``None`` for random weights at
            :attr:`architecture`'s size.
        dtype: model dtype (default: bf16 on CUDA, float32 elsewhere).
        batch_size: images per forward.
        question: the user question; ``{prompt}`` is replaced by the generation prompt.
        seed: seed of the random weights (ignored when loading).
        attn_implementation: transformers attention backend (``sdpa``; ``flash_attention_2`` if installed).
        vision_attention: ``auto`` | ``loop`` | ``varlen``, how the vision tower's windows are attended
            (module docstring); the resolved choice is :attr:`vision_attention`.
    """

    needs_weights = True
    weights_optional = True
    weights_layout = FULL_LAYOUT
    architecture: dict[str, dict[str, Any]] = QWEN25_VL_7B

    def __init__(
        self,
        weights_path: str | os.PathLike[str] | None = None,
        device: torch.device | str = "cpu",
        *,
        dtype: torch.dtype | None = None,
        batch_size: int = 16,
        question: str = DEFAULT_QUESTION,
        seed: int = 0,
        attn_implementation: str = "sdpa",
        vision_attention: str = "auto",
    ) -> None:
        super().__init__(device)
        if vision_attention not in VISION_ATTENTION_MODES:
            raise ValueError(
                f"vision_attention must be one of {VISION_ATTENTION_MODES}, got {vision_attention!r}"
            )
        if "{prompt}" not in question:
            raise ValueError(f"question must contain '{{prompt}}' (where the prompt goes), got {question!r}")
        self.dtype = dtype or default_dtype_for(self.device)
        self.batch_size = check_batch_size(batch_size)
        self.question = question
        self.weights_path = None if weights_path is None else os.fspath(weights_path)
        if self.weights_path is None:
            self.model, self.tokenizer, self.transform = self._random(seed, attn_implementation)
            warn_random_weights(self.name, self.num_parameters(), "a Qwen2.5-VL judge")
        else:
            self.model, self.tokenizer, self.transform = self._load_dir(
                self.weights_path, attn_implementation
            )
        self.model.eval().requires_grad_(False)
        self.vision_attention = self.set_vision_attention(vision_attention)
        self.tokenizer.padding_side = "left"  # the answer's logits are at position -1 of every row
        self.image_token_id = int(self.model.config.image_token_id)
        tokenizer_image_id = self.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
        if tokenizer_image_id != self.image_token_id:
            raise ValueError(
                f"the tokenizer's {IMAGE_TOKEN} id ({tokenizer_image_id}) is not the model's image_token_id "
                f"({self.image_token_id})"
            )
        self.yes_ids = answer_token_ids(self.tokenizer, YES_WORDS)
        self.no_ids = answer_token_ids(self.tokenizer, NO_WORDS)
        if set(self.yes_ids) & set(self.no_ids):
            raise ValueError(f"yes ids {self.yes_ids} and no ids {self.no_ids} overlap")

    # ------------------------------------------------------------------ construction
    def _random(self, seed: int, attn_implementation: str) -> tuple[Any, Any, QwenImageTransform]:
        from transformers import Qwen2_5_VLForConditionalGeneration

        tokenizer = offline_tokenizer()
        config = build_config(self.architecture, tokenizer)
        config._attn_implementation = attn_implementation
        # Built on the device in the target dtype (no float32 CPU copy of 8 B parameters); buffers the model
        # computes in float32 (rotary inverse frequencies) stay float32, as from_pretrained leaves them.
        model = build_random(
            Qwen2_5_VLForConditionalGeneration, config, seed=seed, device=self.device, dtype=self.dtype
        )
        return model, tokenizer, QwenImageTransform()

    def _load_dir(self, directory: str, attn_implementation: str) -> tuple[Any, Any, QwenImageTransform]:
        from transformers import AutoConfig, AutoTokenizer, Qwen2_5_VLForConditionalGeneration
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        from digenrl.models.construction import realign_tensors

        directory = require_files(directory, self.weights_layout, "Qwen2.5-VL (save_pretrained)")
        config = AutoConfig.from_pretrained(directory, local_files_only=True)
        if config.model_type != "qwen2_5_vl":
            raise ValueError(
                f"reward.weights_path={directory!r} holds a {config.model_type!r} model; the VLM judge runs "
                "Qwen2.5-VL checkpoints (model_type 'qwen2_5_vl')"
            )
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(
            directory, local_files_only=True, dtype=self.dtype, attn_implementation=attn_implementation
        )
        model = realign_tensors(model.to(self.device))
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        if getattr(tokenizer, "chat_template", None) is None:
            tokenizer.chat_template = _chat_template_from_dir(directory)
        processor = Qwen2VLImageProcessorPil.from_pretrained(directory, local_files_only=True)
        return model, tokenizer, QwenImageTransform.from_image_processor(processor)

    def set_vision_attention(self, mode: str) -> str:
        """Switch the vision tower between transformers' per-window calls (``loop``) and one varlen call
        (``varlen``); ``auto`` picks ``varlen`` where its kernel runs. Returns the mode now in use."""
        if mode not in VISION_ATTENTION_MODES:
            raise ValueError(f"vision_attention must be one of {VISION_ATTENTION_MODES}, got {mode!r}")
        vision_config = self.model.model.visual.config
        text_attention = self.model.config.text_config._attn_implementation
        if mode == "auto":
            fast = text_attention == "sdpa" and varlen_available(self.device, self.dtype)
            mode = "varlen" if fast else "loop"
        if mode == "varlen":
            _register_varlen_attention()
            vision_config._attn_implementation = VARLEN_ATTENTION
        else:
            vision_config._attn_implementation = text_attention
        return mode

    def save_pretrained(self, directory: str | os.PathLike[str]) -> Path:
        """Write model, tokenizer and image processor so ``weights_path=directory`` loads this judge."""
        return save_pretrained_all(directory, self.model, self.tokenizer, self.transform.image_processor())

    # ------------------------------------------------------------------ scoring

    def chat_text(self, prompt: str) -> str:
        """The judge's input text for ``prompt`` with ONE image placeholder (expanded in :meth:`encode`)."""
        question = self.question.replace("{prompt}", prompt)
        if getattr(self.tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = chatml_text(question)
        if text.count(IMAGE_TOKEN) != 1:
            raise ValueError(f"the chat text must hold exactly one {IMAGE_TOKEN}, got {text!r}")
        return text

    def encode(self, images: Tensor, prompts: list[str]) -> dict[str, Tensor]:
        """The model's inputs for a batch: pixel patches, grid, left-padded ids with the image tokens."""
        pixel_values, grid = self.transform(images.to(self.device, torch.float32))
        tokens = int(grid[0].prod()) // self.transform.merge_size**2  # all images of a batch share a size
        texts = [self.chat_text(p).replace(IMAGE_TOKEN, IMAGE_TOKEN * tokens) for p in prompts]
        enc = self.tokenizer(texts, padding=True, add_special_tokens=False, return_tensors="pt")
        input_ids = enc["input_ids"].to(self.device)
        return {
            "input_ids": input_ids,
            "attention_mask": enc["attention_mask"].to(self.device),
            "pixel_values": pixel_values.to(self.dtype),
            "image_grid_thw": grid,
            # text 0 / image 1: what the processor returns and get_rope_index needs for the 3-D positions
            "mm_token_type_ids": (input_ids == self.image_token_id).int(),
        }

    def answer_logits(self, images: Tensor, prompts: list[str]) -> Tensor:
        """Float32 next-token logits ``[N, vocab]`` after the question (one forward, last position)."""
        inputs = self.encode(images, prompts)
        out = self.model(**inputs, use_cache=False, logits_to_keep=1)
        return out.logits[:, -1].float()

    @torch.no_grad()
    def score_images(self, images: Tensor, prompts: list[str]) -> Tensor:
        scores = []
        for start in range(0, images.shape[0], self.batch_size):
            logits = self.answer_logits(
                images[start : start + self.batch_size], prompts[start : start + self.batch_size]
            )
            yes = torch.logsumexp(logits[:, self.yes_ids], dim=-1)
            no = torch.logsumexp(logits[:, self.no_ids], dim=-1)
            scores.append(torch.sigmoid(yes - no))
        return torch.cat(scores)


@register_reward("tiny-vlm-judge")
class TinyVLMJudge(VLMJudge):
    """:class:`VLMJudge` with the 2 + 2-layer twin configuration (CPU tests); loads directories alike."""

    architecture = TINY_QWEN25_VL
