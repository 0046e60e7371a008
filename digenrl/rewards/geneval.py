"""GenEval reward: an object detector plus GenEval's count, colour and position rules.

GenEval (Ghosh et al., "GenEval: An Object-Focused Framework for Evaluating Text-to-Image Alignment",
NeurIPS 2023, arXiv 2310.11513; github.com/djghosh13/geneval) detects COCO objects in the generated image,
classifies each needed object's colour with CLIP, and checks the prompt's metadata (``geneval`` prompt
sets, digenrl/data/geneval_prompts.py) with the rules in :mod:`digenrl.rewards.geneval_rules`. FlowGRPO
trains on the partial-credit ``score`` of those rules (its reward server, github.com/yifan123/reward-server),
which is this reward's default (``mode="score"``); ``mode="strict"`` gives FlowGRPO's exact-count binary
verdict and ``mode="correct"`` GenEval's benchmark verdict (the number GenEval reports).

Models, both read from one LOCAL directory (``reward.weights_path=/dir``; model hubs are not contacted):

* ``/dir/detector``: GenEval's detector, Mask2Former with a Swin-S backbone for COCO instance
  segmentation (GenEval runs mmdetection's ``mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco``; the same
  architecture in transformers is ``Mask2FormerForUniversalSegmentation``, e.g. the
  facebook/mask2former-swin-small-coco-instance snapshot, trained by Mask2Former's authors rather than by
  mmdetection, so scores can differ by the two checkpoints' quality), with its
  ``preprocessor_config.json``. Post-processing is mmdetection's (top 100 (query, class) pairs, masks
  resized to the image and cut at logit 0, score = class probability × mean mask probability, boxes from
  the masks). A DETR-family ``AutoModelForObjectDetection`` directory (DETR, YOLOS: softmax over classes
  plus "no object"; the facebook/detr-resnet-50 config names a timm ResNet, so ``pip install timm``) is
  also read: boxes only. Preprocessing (shortest edge to ``size.shortest_edge``, longest at most
  ``size.longest_edge``, bilinear; normalise; Mask2Former: zero-pad to a multiple of 32) runs on tensors.
  Labels map to GenEval's class names through ``id2label``
  (:data:`~digenrl.rewards.geneval_rules.LABEL_ALIASES` for COCO's short names); other labels are ignored.
* ``/dir/clip``: a ``CLIPModel`` ``save_pretrained`` directory with tokenizer and image processor (GenEval
  uses open_clip ViT-L-14 "openai", the weights of openai/clip-vit-large-patch14). Colour: the zero-shot
  classifier of clip_benchmark (each colour's text embedding is the renormalised mean of GenEval's three
  templates "a photo of a {c} {object}", "a photo of a {c}-colored {object}", "a photo of a {c} object"),
  applied to the object's crop: with a mask, the object over GenEval's grey background (#999), cropped to
  its box, as GenEval does; from a box detector, the box alone (GenEval's path without a mask).

Without ``weights_path`` both are built at their real sizes with random weights (a warning; for cost
measurements); ``tiny-geneval`` is the CPU twin (tiny Mask2Former + 2 + 2-layer CLIP).
"""

from __future__ import annotations

import inspect
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from digenrl.data.geneval_prompts import GENEVAL_CLASSES, GENEVAL_COLORS
from digenrl.rewards.base import PromptMetadata, RewardFunction
from digenrl.rewards.clip_backbone import ClipImageTransform, LocalClip
from digenrl.rewards.clipscore import CLIP_VIT_L_14, TINY_CLIP
from digenrl.rewards.geneval_rules import (
    LABEL_ALIASES,
    Detected,
    Detections,
    Verdict,
    check_metadata,
    judge,
    keep_detections,
)
from digenrl.rewards.local_weights import (
    FULL_LAYOUT,
    IMAGE_PROCESSOR_FILES,
    PRETRAINED_LAYOUT,
    build_random,
    check_batch_size,
    require_files,
    warn_random_weights,
)
from digenrl.rewards.registry import register_reward

MODES = ("score", "strict", "correct")
#: GenEval's colour templates (evaluate_images.py ``color_classification``).
COLOUR_TEMPLATES = ("a photo of a {c} {o}", "a photo of a {c}-colored {o}", "a photo of a {c} object")
IMAGENET_MEAN = (0.485, 0.456, 0.406)  # DetrImageProcessor defaults (IMAGENET_DEFAULT_MEAN/STD)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: The files of ``reward.weights_path``: a detector and a CLIP, each a save_pretrained folder.
GENEVAL_LAYOUT: dict[str, tuple[str, ...]] = {
    **{
        f"detector {what}": tuple(f"detector/{f}" for f in files) for what, files in PRETRAINED_LAYOUT.items()
    },
    "detector image processor": tuple(f"detector/{f}" for f in IMAGE_PROCESSOR_FILES),
    **{f"CLIP {what}": tuple(f"clip/{f}" for f in files) for what, files in FULL_LAYOUT.items()},
}

#: GenEval's detector: Mask2Former with a Swin-S backbone for COCO instance segmentation (Cheng et al.,
#: "Masked-attention Mask Transformer for Universal Image Segmentation", CVPR 2022, arXiv 2112.01527; the
#: facebook/mask2former-swin-small-coco-instance sizes = transformers' Mask2FormerConfig defaults: hidden 256,
#: 6 pixel-decoder and 9 + 1 transformer-decoder layers, 100 queries), 80 COCO classes; 69 M parameters.
MASK2FORMER_SWIN_S: dict[str, Any] = {
    "kind": "mask2former",
    "backbone": {"embed_dim": 96, "depths": [2, 2, 18, 2], "num_heads": [3, 6, 12, 24], "window_size": 7},
    "model": {},
    "size": {"shortest_edge": 800, "longest_edge": 1333},  # mmdetection's test resize (1333, 800)
}
TINY_MASK2FORMER: dict[str, Any] = {
    "kind": "mask2former",
    "backbone": {"embed_dim": 32, "depths": [1, 1, 1, 1], "num_heads": [1, 1, 2, 2], "window_size": 4},
    "model": {
        "hidden_dim": 32,
        "mask_feature_size": 32,
        "feature_size": 32,
        "num_queries": 10,
        "encoder_layers": 1,
        "decoder_layers": 2,
        "num_attention_heads": 2,
        "encoder_feedforward_dim": 32,
        "dim_feedforward": 32,
    },
    "size": {"shortest_edge": 64, "longest_edge": 64},
}
#: A DETR (transformers' ResNet backbone), the box-only alternative; the tiny size is for CPU tests.
TINY_DETR: dict[str, Any] = {
    "kind": "detr",
    "backbone": {
        "embedding_size": 8,
        "hidden_sizes": [8, 16, 16, 16],
        "depths": [1, 1, 1, 1],
        "layer_type": "basic",
    },
    "model": {
        "d_model": 16,
        "encoder_layers": 1,
        "decoder_layers": 1,
        "encoder_attention_heads": 2,
        "decoder_attention_heads": 2,
        "encoder_ffn_dim": 32,
        "decoder_ffn_dim": 32,
        "num_queries": 12,
    },
    "size": {"shortest_edge": 32, "longest_edge": 64},
}
BACKGROUND_GREY = 0x99 / 255  # GenEval's --options bgcolor default "#999"
MAX_PER_IMAGE = 100  # mmdetection Mask2Former test_cfg max_per_image (instance segmentation)
SIZE_DIVISOR = 32  # Mask2FormerImageProcessor size_divisor: inputs padded to a multiple of it


def detr_resize_hw(height: int, width: int, shortest: int, longest: int | None) -> tuple[int, int]:
    """DETR's and Mask2Former's resize (transformers image_processing_detr ``get_size_with_aspect_ratio``):
    the short side to ``shortest`` unless that pushes the long side past ``longest``."""
    short, long = min(height, width), max(height, width)
    size = shortest
    if longest is not None and long / short * size > longest:
        size = round(longest * short / long)
    if height <= width:
        return size, int(size * width / height)
    return int(size * height / width), size


def mask_boxes(masks: Tensor) -> Tensor:
    """Tight boxes ``[N, 4]`` (x0, y0, x1 + 1, y1 + 1) of boolean masks ``[N, H, W]``, zeros for an empty
    mask (mmdetection ``mask2bbox``, what GenEval's Mask2Former reports as its boxes)."""
    boxes = torch.zeros(masks.shape[0], 4, dtype=torch.float32, device=masks.device)
    rows, cols = masks.any(dim=2), masks.any(dim=1)
    for i in range(masks.shape[0]):
        ys, xs = torch.nonzero(rows[i]).flatten(), torch.nonzero(cols[i]).flatten()
        if len(ys) and len(xs):
            boxes[i] = torch.stack([xs[0], ys[0], xs[-1] + 1, ys[-1] + 1]).float()
    return boxes


@dataclass
class Detector:
    """A COCO detector with its tensor pre/post-processing: ``kind`` ``mask2former`` (instance masks,
    GenEval's own detector) or ``detr`` (boxes only; DETR, YOLOS). Module docstring."""

    model: Any
    kind: str
    size: dict[str, int]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    class_of_label: dict[int, str]  # detector label id → GenEval class (labels GenEval lacks: absent)

    @classmethod
    def from_model(cls, model: Any, processor: Mapping[str, Any]) -> Detector:
        kind = "mask2former" if model.config.model_type == "mask2former" else "detr"
        labels = {int(k): v for k, v in model.config.id2label.items()}
        named = {i: LABEL_ALIASES.get(name, name) for i, name in labels.items()}
        size = dict(processor.get("size") or {})
        if "shortest_edge" not in size:
            raise ValueError(
                f"reward.weights_path: the detector's preprocessor_config.json size {size!r} has no "
                "shortest_edge (the DETR / Mask2Former processors' format)"
            )
        normalise = processor.get("do_normalize", True)
        return cls(
            model.eval().requires_grad_(False),
            kind,
            size,
            tuple(processor.get("image_mean", IMAGENET_MEAN)) if normalise else (0.0, 0.0, 0.0),
            tuple(processor.get("image_std", IMAGENET_STD)) if normalise else (1.0, 1.0, 1.0),
            {i: name for i, name in named.items() if name in GENEVAL_CLASSES},
        )

    @classmethod
    def load(cls, directory: Path, device: torch.device, dtype: torch.dtype) -> Detector:
        from transformers import AutoConfig, AutoModelForObjectDetection, Mask2FormerForUniversalSegmentation

        try:
            config = AutoConfig.from_pretrained(directory, local_files_only=True)
            model_class = (
                Mask2FormerForUniversalSegmentation
                if config.model_type == "mask2former"
                else AutoModelForObjectDetection
            )
            model = model_class.from_pretrained(directory, local_files_only=True, dtype=dtype)
        except ImportError as exc:
            raise ValueError(
                f"reward.weights_path: the detector in {str(directory)!r} needs a package that is not "
                f"installed ({str(exc).strip().splitlines()[0]}); install it (DETR's COCO checkpoints: "
                "pip install timm)"
            ) from None
        processor = json.loads((directory / IMAGE_PROCESSOR_FILES[0]).read_text(encoding="utf-8"))
        detector = cls.from_model(model.to(device), processor)
        detector.check()
        return detector

    @classmethod
    def random(cls, architecture: dict[str, Any], *, seed: int, device: torch.device, dtype: torch.dtype):
        from transformers import (
            DetrConfig,
            DetrForObjectDetection,
            Mask2FormerConfig,
            Mask2FormerForUniversalSegmentation,
            ResNetConfig,
            SwinConfig,
        )

        labels = dict(enumerate(GENEVAL_CLASSES))
        if architecture["kind"] == "mask2former":
            stages = [f"stage{i}" for i in range(1, 5)]
            backbone = SwinConfig(**architecture["backbone"], out_features=stages)
            config = Mask2FormerConfig(backbone_config=backbone, id2label=labels, **architecture["model"])
            model_class = Mask2FormerForUniversalSegmentation
        else:
            backbone = ResNetConfig(**architecture["backbone"], out_features=["stage4"])
            config = DetrConfig(backbone_config=backbone, id2label=labels, **architecture["model"])
            model_class = DetrForObjectDetection
        model = build_random(model_class, config, seed=seed, device=device, dtype=dtype)
        size = dict(architecture["size"])
        return cls.from_model(model, {"size": size, "image_mean": IMAGENET_MEAN, "image_std": IMAGENET_STD})

    def check(self) -> None:
        """Refuse a detector this reward cannot read, naming the setting."""
        head = getattr(
            self.model, "class_predictor" if self.kind == "mask2former" else "class_labels_classifier", None
        )
        out = getattr(head, "out_features", None)
        if out != len(self.model.config.id2label) + 1:
            raise ValueError(
                f"reward.weights_path: detector {type(self.model).__name__} does not classify its queries "
                "with a softmax over its classes plus 'no object'; GenEval's reward reads Mask2Former "
                "(instance segmentation) or DETR / YOLOS"
            )
        if not self.class_of_label:
            raise ValueError(
                "reward.weights_path: the detector's id2label names none of GenEval's 80 COCO classes"
            )

    def save_pretrained(self, directory: Path) -> None:
        self.model.save_pretrained(directory)
        processor_type = "Mask2FormerImageProcessor" if self.kind == "mask2former" else "DetrImageProcessor"
        processor = {
            "image_processor_type": processor_type,
            "do_resize": True,
            "size": self.size,
            "do_rescale": True,
            "rescale_factor": 1 / 255,
            "do_normalize": True,
            "image_mean": list(self.mean),
            "image_std": list(self.std),
        }
        if self.kind == "mask2former":
            processor["size_divisor"] = SIZE_DIVISOR
        (directory / IMAGE_PROCESSOR_FILES[0]).write_text(json.dumps(processor, indent=2), encoding="utf-8")

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def __call__(self, images: Tensor) -> list[tuple[Tensor, Tensor, list[str], Tensor | None]]:
        """Per image: boxes ``[N, 4]`` (x0, y0, x1, y1 in the image's pixels), confidences ``[N]``, the
        GenEval class of each, and (Mask2Former) their masks ``[N, H, W]`` bool. Predictions of "no object"
        or of a class GenEval lacks are dropped."""
        height, width = images.shape[-2:]
        resized = detr_resize_hw(height, width, self.size["shortest_edge"], self.size.get("longest_edge"))
        x = F.interpolate(
            images.to(self.device, torch.float32), size=resized, mode="bilinear", antialias=True
        )
        mean = torch.tensor(self.mean, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=x.device).view(1, 3, 1, 1)
        x = (x - mean) / std
        if self.kind == "mask2former":  # zero-pad bottom/right to the size divisor, as the processor does
            pad_h, pad_w = (-resized[0]) % SIZE_DIVISOR, (-resized[1]) % SIZE_DIVISOR
            x = F.pad(x, (0, pad_w, 0, pad_h))
        dtype = next(self.model.parameters()).dtype
        inputs: dict[str, Tensor] = {"pixel_values": x.to(dtype)}
        if self.kind == "detr" and "pixel_mask" in inspect.signature(self.model.forward).parameters:
            inputs["pixel_mask"] = torch.ones(x.shape[0], *resized, dtype=torch.long, device=x.device)
        out = self.model(**inputs)
        if self.kind == "mask2former":
            return [
                self._instances(
                    out.class_queries_logits[i], out.masks_queries_logits[i], resized, (height, width)
                )
                for i in range(images.shape[0])
            ]
        return self._detr_boxes(out, height, width)

    def _instances(
        self, logits: Tensor, mask_logits: Tensor, resized: tuple[int, int], original: tuple[int, int]
    ) -> tuple[Tensor, Tensor, list[str], Tensor]:
        """mmdetection's Mask2Former instance post-processing (MaskFormerFusionHead ``instance_postprocess``):
        the top :data:`MAX_PER_IMAGE` (query, class) pairs by class probability; masks upsampled to the
        padded input, cropped to the resized image, resized to the original and cut at logit 0; score =
        class probability × the mask's mean probability inside it; boxes from the masks."""
        probs = logits.float().softmax(dim=-1)[:, :-1]  # [Q, C]
        num_classes = probs.shape[1]
        top, flat = probs.flatten().topk(min(MAX_PER_IMAGE, probs.numel()))
        labels, queries = flat % num_classes, flat // num_classes
        keep = [i for i, label in enumerate(labels.tolist()) if label in self.class_of_label]
        top, labels, queries = top[keep], labels[keep], queries[keep]
        padded = (mask_logits.shape[-2] * 4, mask_logits.shape[-1] * 4)
        masks = F.interpolate(
            mask_logits[queries][None].float(), size=padded, mode="bilinear", align_corners=False
        )
        masks = masks[..., : resized[0], : resized[1]]
        masks = F.interpolate(masks, size=original, mode="bilinear", align_corners=False)[0]
        binary = masks > 0
        inside = binary.flatten(1).float()
        mask_score = (masks.sigmoid().flatten(1) * inside).sum(1) / (inside.sum(1) + 1e-6)
        names = [self.class_of_label[int(label)] for label in labels]
        return mask_boxes(binary).cpu(), (top * mask_score).cpu(), names, binary.cpu()

    def _detr_boxes(self, out: Any, height: int, width: int) -> list[tuple[Tensor, Tensor, list[str], None]]:
        """``DetrImageProcessor.post_process_object_detection``: softmax, drop "no object", the best class
        per query, centre boxes → corners in pixels."""
        probs = out.logits.float().softmax(dim=-1)[..., :-1]
        scores, labels = probs.max(dim=-1)
        cx, cy, w, h = out.pred_boxes.float().unbind(-1)
        scale = torch.tensor([width, height, width, height], device=scores.device, dtype=torch.float32)
        boxes = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=-1) * scale
        results = []
        for i in range(scores.shape[0]):
            rows = [q for q, label in enumerate(labels[i].tolist()) if label in self.class_of_label]
            names = [self.class_of_label[int(labels[i, q])] for q in rows]
            results.append((boxes[i, rows].cpu(), scores[i, rows].cpu(), names, None))
        return results


class ColourClassifier:
    """GenEval's CLIP zero-shot colour classifier of object crops (module docstring); the per-class text
    classifier is built once per class name and cached."""

    def __init__(self, clip: LocalClip) -> None:
        self.clip = clip
        self._weights: dict[str, Tensor] = {}

    def classifier(self, name: str) -> Tensor:
        """``[colours, D]``: per colour the renormalised mean of its templates' unit text embeddings
        (clip_benchmark ``zero_shot_classifier``)."""
        if name not in self._weights:
            rows = []
            for colour in GENEVAL_COLORS:
                texts = [t.format(c=colour, o=name) for t in COLOUR_TEMPLATES]
                mean = self.clip.text_embeddings(texts).mean(dim=0)
                rows.append(mean / torch.linalg.vector_norm(mean))
            self._weights[name] = torch.stack(rows)
        return self._weights[name]

    def crops(self, image: Tensor, objects: list[Detected]) -> list[Tensor]:
        """Each object's crop ``[1, 3, h, w]`` of ``image`` ``[3, H, W]``: with a mask, the image over
        GenEval's grey background (``bgcolor`` #999) through the mask, then the box (corners rounded
        outwards, >= 1 px); without, the box of the image (GenEval's ``ImageCrops``)."""
        height, width = image.shape[-2:]
        out = []
        for obj in objects:
            box = obj.box
            source = image
            if obj.mask is not None:
                source = torch.where(obj.mask.to(image.device)[None], image, BACKGROUND_GREY)
            x0 = min(max(math.floor(float(box[0])), 0), width - 1)
            y0 = min(max(math.floor(float(box[1])), 0), height - 1)
            x1 = min(max(math.ceil(float(box[2])), x0 + 1), width)
            y1 = min(max(math.ceil(float(box[3])), y0 + 1), height)
            out.append(source[None, :, y0:y1, x0:x1])
        return out

    def __call__(self, image: Tensor, objects: list[Detected], name: str) -> list[str]:
        if not objects:
            return []
        embeds = torch.cat([self.clip.image_embeddings(crop) for crop in self.crops(image, objects)])
        picks = (embeds @ self.classifier(name).T).argmax(dim=-1)
        return [GENEVAL_COLORS[i] for i in picks.tolist()]


@register_reward("geneval")
class GenEvalReward(RewardFunction):
    """GenEval's rules on a detector's boxes (module docstring); needs each prompt's GenEval metadata.

    Args:
        weights_path: local directory with ``detector/`` and ``clip/`` (module docstring), or ``None`` for
            random weights at the real sizes.
        mode: ``score`` (FlowGRPO's partial credit, in ``[0, 1]``), ``strict`` (FlowGRPO's exact-count
            verdict, 0/1) or ``correct`` (GenEval's benchmark verdict, 0/1).
        batch_size: images per detector forward.
    """

    needs_weights = True
    weights_optional = True
    weights_layout = GENEVAL_LAYOUT
    detector_architecture: dict[str, Any] = MASK2FORMER_SWIN_S
    clip_architecture: dict[str, Any] = CLIP_VIT_L_14

    def __init__(
        self,
        weights_path: str | os.PathLike[str] | None = None,
        device: torch.device | str = "cpu",
        *,
        mode: str = "score",
        dtype: torch.dtype = torch.float32,
        batch_size: int = 8,
        seed: int = 0,
    ) -> None:
        super().__init__(device)
        if mode not in MODES:
            raise ValueError(f"GenEval reward mode {mode!r}; allowed: {', '.join(MODES)}")
        self.mode = mode
        self.batch_size = check_batch_size(batch_size)
        if weights_path is None:
            self.detector = Detector.random(
                self.detector_architecture, seed=seed, device=self.device, dtype=dtype
            )
            size = self.clip_architecture["vision_config"]["image_size"]
            transform = ClipImageTransform.resize_and_crop(size)
            clip = LocalClip.random(self.clip_architecture, transform, seed=seed + 1, device=self.device)
            self.colours = ColourClassifier(clip)
            warn_random_weights(
                self.name,
                self.num_parameters(),
                "a Mask2Former (or DETR) detector and a CLIP (save_pretrained)",
            )
        else:
            root = Path(require_files(weights_path, GENEVAL_LAYOUT, "GenEval (detector/ + clip/)"))
            self.detector = Detector.load(root / "detector", self.device, dtype)
            self.colours = ColourClassifier(LocalClip.load(root / "clip", device=self.device, dtype=dtype))

    def modules(self) -> list[torch.nn.Module]:
        return [self.detector.model, self.colours.clip.model]

    def save_pretrained(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``detector/`` and ``clip/`` so ``weights_path=directory`` loads this reward."""
        root = Path(directory)
        (root / "detector").mkdir(parents=True, exist_ok=True)
        self.detector.save_pretrained(root / "detector")
        self.colours.clip.save_pretrained(root / "clip")
        return root

    @classmethod
    def check_prompts(cls, prompts: list[str], metadata: list[PromptMetadata], key: str) -> None:
        """Every prompt needs GenEval metadata (``include`` clauses of known classes, colours, relations):
        a ``geneval`` prompt set or a ``.jsonl`` file in its format."""
        for prompt, meta in zip(prompts, metadata, strict=True):
            problem = check_metadata(meta, GENEVAL_CLASSES, GENEVAL_COLORS)
            if problem is not None:
                raise ValueError(
                    f"{key}: reward {cls.name!r} needs GenEval metadata for each prompt (a geneval prompt "
                    f"set, e.g. {key}=geneval:train, or a .jsonl in its format); prompt {prompt!r}: {problem}"
                )

    def verdicts(self, images: Tensor, metadata: list[PromptMetadata]) -> list[Verdict]:
        """GenEval's verdict of each image (``[N, 3, H, W]`` in ``[0, 1]``) for its prompt's metadata."""
        found = []
        for start in range(0, images.shape[0], self.batch_size):
            found.extend(self.detector(images[start : start + self.batch_size]))
        out = []
        for image, (boxes, scores, names, masks), meta in zip(images, found, metadata, strict=True):
            kept: Detections = keep_detections(boxes, scores, names, str(meta.get("tag", "")), masks)
            out.append(judge(kept, meta, lambda b, n, image=image: self.colours(image, b, n)))
        return out

    @torch.no_grad()
    def score_batch(self, images: Tensor, prompts: list[str], metadata: list[PromptMetadata]) -> Tensor:
        self.check_prompts(prompts, metadata, "the scored prompts")
        verdicts = self.verdicts(images, metadata)
        if self.mode == "score":
            values = [v.score for v in verdicts]
        else:
            values = [float(v.strict if self.mode == "strict" else v.correct) for v in verdicts]
        return torch.tensor(values, dtype=torch.float32, device=images.device)

    def score_images(self, images: Tensor, prompts: list[str]) -> Tensor:
        raise ValueError(f"reward {self.name!r} needs each prompt's GenEval metadata; call it with metadata")


@register_reward("tiny-geneval")
class TinyGenEvalReward(GenEvalReward):
    """:class:`GenEvalReward` with a tiny Mask2Former and a 2 + 2-layer CLIP (CPU tests); loads directories
    alike (a DETR's too)."""

    detector_architecture = TINY_MASK2FORMER
    clip_architecture = TINY_CLIP
