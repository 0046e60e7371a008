"""LAION aesthetic reward: CLIP ViT-L/14 image embedding → L2-normalise → linear MLP head.

Head architecture (christophschuhmann/improved-aesthetic-predictor, simple_inference.py ``MLP``; the same
in ddpo_pytorch/aesthetic_scorer.py): ``nn.Sequential`` of Linear(768, 1024), Dropout(0.2),
Linear(1024, 128), Dropout(0.2), Linear(128, 64), Dropout(0.1), Linear(64, 16), Linear(16, 1) — no
activations (the ReLUs are commented out in the original), dropouts inactive at inference. The input is
the CLIP *projected* image embedding divided by its L2 norm (ddpo_pytorch/aesthetic_scorer.py).
``768`` is ViT-L/14's ``projection_dim``; here the input width follows the loaded CLIP config.

Weights directory layout (``reward.weights_path``, local):

    <weights_path>/config.json, model.safetensors   CLIPModel.save_pretrained of openai/clip-vit-large-patch14
    <weights_path>/preprocessor_config.json         its CLIP image processor (224 px, OpenAI mean/std)
    <weights_path>/aesthetic_head.safetensors       the head, keys layers.{0,2,4,6,7}.{weight,bias}

The public head ``sac+logos+ava1-l14-linearMSE.pth`` is a ``torch.save``'d state dict whose keys are
exactly ``layers.0.weight`` … ``layers.7.bias`` (Sequential indices; dropouts hold no parameters), the
same names :class:`AestheticHead` uses. Convert it once with
:func:`convert_laion_aesthetic_checkpoint` (``python -c "from digenrl.rewards.aesthetic import
convert_laion_aesthetic_checkpoint as c; c('sac+logos+ava1-l14-linearMSE.pth', '<weights_path>')"``).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor, nn

from digenrl.rewards.base import RewardFunction
from digenrl.rewards.clip_backbone import LocalClip
from digenrl.rewards.local_weights import (
    IMAGE_PROCESSOR_FILES,
    PRETRAINED_LAYOUT,
    check_batch_size,
    require_local_dir,
)
from digenrl.rewards.registry import register_reward

AESTHETIC_HEAD_FILENAME = "aesthetic_head.safetensors"
LAION_HEAD_HIDDEN_DIMS = (1024, 128, 64, 16)  # improved-aesthetic-predictor simple_inference.py MLP
LAION_HEAD_DROPOUTS = (0.2, 0.2, 0.1)  # after the first three Linear layers; none after Linear(64, 16)
LAION_EMBED_DIM = 768  # CLIP ViT-L/14 projection_dim
AESTHETIC_LAYOUT = {
    **PRETRAINED_LAYOUT,
    "image processor": IMAGE_PROCESSOR_FILES,
    "aesthetic head": (AESTHETIC_HEAD_FILENAME,),
}


class AestheticHead(nn.Module):
    """The LAION improved-aesthetic-predictor MLP; parameter names match the public ``.pth`` state dict."""

    def __init__(self, embed_dim: int = LAION_EMBED_DIM) -> None:
        super().__init__()
        h1, h2, h3, h4 = LAION_HEAD_HIDDEN_DIMS
        d1, d2, d3 = LAION_HEAD_DROPOUTS
        self.layers = nn.Sequential(
            nn.Linear(embed_dim, h1),
            nn.Dropout(d1),
            nn.Linear(h1, h2),
            nn.Dropout(d2),
            nn.Linear(h2, h3),
            nn.Dropout(d3),
            nn.Linear(h3, h4),
            nn.Linear(h4, 1),
        )

    def forward(self, normalized_embeds: Tensor) -> Tensor:
        return self.layers(normalized_embeds).squeeze(-1)


def head_from_state_dict(state_dict: dict[str, Tensor], source: str) -> AestheticHead:
    """The head (any input width) holding ``state_dict`` (keys ``layers.{0,2,4,6,7}.*``); errors name
    ``source``. ImageReward's MLP has this layout too (digenrl/rewards/imagereward.py)."""
    if "layers.0.weight" not in state_dict:
        raise ValueError(f"{source} is not an aesthetic-head state dict (keys: {sorted(state_dict)[:6]}...)")
    head = AestheticHead(embed_dim=state_dict["layers.0.weight"].shape[1])
    try:
        head.load_state_dict(state_dict, strict=True)
    except RuntimeError as error:
        raise ValueError(f"{source} does not match the LAION aesthetic head layout: {error}") from error
    return head


def save_aesthetic_head(head: AestheticHead | dict[str, Tensor], directory: str | os.PathLike[str]) -> Path:
    """Write ``head`` (module or state dict) to ``<directory>/aesthetic_head.safetensors``; returns path."""
    from safetensors.torch import save_file

    state_dict = head.state_dict() if isinstance(head, nn.Module) else head
    checked = head_from_state_dict(dict(state_dict), "head")
    path = Path(directory) / AESTHETIC_HEAD_FILENAME
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().float().contiguous().cpu() for k, v in checked.state_dict().items()}, str(path))
    return path


def convert_laion_aesthetic_checkpoint(
    pth_path: str | os.PathLike[str], directory: str | os.PathLike[str]
) -> Path:
    """Convert the public ``sac+logos+ava1-l14-linearMSE.pth`` into ``aesthetic_head.safetensors``."""
    state_dict = torch.load(pth_path, map_location="cpu", weights_only=True)
    return save_aesthetic_head(head_from_state_dict(state_dict, str(pth_path)), directory)


def load_aesthetic_head(directory: str | os.PathLike[str]) -> AestheticHead:
    from safetensors.torch import load_file

    path = Path(require_local_dir(directory, "reward.weights_path")) / AESTHETIC_HEAD_FILENAME
    if not path.is_file():
        raise ValueError(
            f"reward.weights_path={str(directory)!r} has no {AESTHETIC_HEAD_FILENAME}; create it with "
            "digenrl.rewards.aesthetic.convert_laion_aesthetic_checkpoint"
        )
    return head_from_state_dict(load_file(str(path)), str(path)).eval()


@register_reward("aesthetic")
class Aesthetic(RewardFunction):
    """LAION aesthetic score (≈1–10 for the public head) of each image; prompts are ignored."""

    needs_weights = True
    weights_layout = AESTHETIC_LAYOUT

    def __init__(
        self,
        weights_path: str | os.PathLike[str],
        device: torch.device | str = "cpu",
        *,
        processor_path: str | os.PathLike[str] | None = None,
        dtype: torch.dtype = torch.float32,
        batch_size: int = 32,
    ) -> None:
        super().__init__(device)
        self.clip = LocalClip.load(
            weights_path, processor_path=processor_path, device=self.device, dtype=dtype, with_tokenizer=False
        )
        self.head = load_aesthetic_head(weights_path).requires_grad_(False).to(self.device)
        projection_dim = self.clip.model.config.projection_dim
        if self.head.layers[0].in_features != projection_dim:
            raise ValueError(
                f"{AESTHETIC_HEAD_FILENAME} expects {self.head.layers[0].in_features}-d embeddings but "
                f"the CLIP model in reward.weights_path has projection_dim={projection_dim}"
            )
        self.batch_size = check_batch_size(batch_size)

    @torch.no_grad()
    def score_images(self, images: Tensor, prompts: list[str]) -> Tensor:
        return torch.cat(
            [
                self.head(self.clip.image_embeddings(images[start : start + self.batch_size]))
                for start in range(0, images.shape[0], self.batch_size)
            ]
        )
