"""PickScore and LAION-aesthetic rewards on a tiny random CLIP, vs independent float64 computations.

The reference path uses the transformers processor/tokenizer on PIL images and a float64 copy of the
loaded ``CLIPModel``; the rewards use their own tensor preprocessing and batching.
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from digenrl.rewards import build_reward
from digenrl.rewards.aesthetic import (
    AESTHETIC_HEAD_FILENAME,
    AestheticHead,
    convert_laion_aesthetic_checkpoint,
    save_aesthetic_head,
)
from digenrl.rewards.clip_backbone import ClipImageTransform
from tests.rewards.tiny_clip import TINY_IMAGE_SIZE, TINY_PROJECTION_DIM, save_tiny_clip


@pytest.fixture(scope="module")
def tiny_clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_clip(tmp_path_factory.mktemp("tiny_clip"))


PROMPTS = ["a cat on a mat", "a red car", "a cat on a mat", "an astronaut riding a horse on the moon"]


def exact_uint8_images(batch: int, size: int = TINY_IMAGE_SIZE) -> tuple[torch.Tensor, list[Image.Image]]:
    """Images whose float values are exactly k/255, so the PIL (uint8) path sees the same pixels."""
    pixels = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8)
    return pixels.float() / 255.0, [Image.fromarray(p.permute(1, 2, 0).numpy()) for p in pixels]


def reference_model(directory: Path):
    from transformers import CLIPModel

    return CLIPModel.from_pretrained(directory, local_files_only=True).double().eval()


def pooled(output) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output.pooler_output


def reference_image_embeds(directory: Path, pil_images: list[Image.Image]) -> torch.Tensor:
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(directory, local_files_only=True)
    pixel_values = processor(images=pil_images, return_tensors="pt")["pixel_values"].double()
    with torch.no_grad():
        embeds = pooled(reference_model(directory).get_image_features(pixel_values=pixel_values))
    return embeds / embeds.norm(dim=-1, keepdim=True)


def reference_pickscore(directory: Path, pil_images: list[Image.Image], prompts: list[str]) -> np.ndarray:
    from transformers import AutoTokenizer

    model = reference_model(directory)
    tokens = AutoTokenizer.from_pretrained(directory, local_files_only=True)(
        prompts, padding="max_length", truncation=True, max_length=77, return_tensors="pt"
    )
    with torch.no_grad():
        ids, mask = tokens["input_ids"], tokens["attention_mask"]
        text = pooled(model.get_text_features(input_ids=ids, attention_mask=mask))
    text = text / text.norm(dim=-1, keepdim=True)
    image = reference_image_embeds(directory, pil_images)
    return (model.logit_scale.detach().exp() * (text * image).sum(-1) / 26.0).numpy()


def test_pickscore_matches_independent_computation(tiny_clip_dir: Path) -> None:
    images, pil_images = exact_uint8_images(len(PROMPTS))
    reward = build_reward("pickscore", weights_path=str(tiny_clip_dir), batch_size=3)
    scores = reward(images, PROMPTS)
    assert scores.shape == (len(PROMPTS),) and scores.dtype == torch.float32
    assert torch.isfinite(scores).all()
    expected = reference_pickscore(tiny_clip_dir, pil_images, PROMPTS)
    np.testing.assert_allclose(scores.numpy(), expected, atol=1e-5)
    assert reward.needs_weights and reward.name == "pickscore"


def test_pickscore_depends_on_prompt_and_batching_does_not_matter(tiny_clip_dir: Path) -> None:
    images, _ = exact_uint8_images(1)
    images = images.expand(2, -1, -1, -1)
    small = build_reward("pickscore", weights_path=str(tiny_clip_dir), batch_size=1)
    big = build_reward("pickscore", weights_path=str(tiny_clip_dir), batch_size=8)
    prompts = ["a cat on a mat", "a completely different sentence about trains"]
    s_small, s_big = small(images, prompts), big(images, prompts)
    np.testing.assert_allclose(s_small.numpy(), s_big.numpy(), atol=1e-6)
    assert abs(float(s_small[0] - s_small[1])) > 1e-6


def test_pickscore_video_is_mean_of_frame_scores(tiny_clip_dir: Path) -> None:
    reward = build_reward("pickscore", weights_path=str(tiny_clip_dir))
    video = torch.rand(2, 3, 3, TINY_IMAGE_SIZE, TINY_IMAGE_SIZE)
    scores = reward(video, ["a cat", "a dog"])
    for b, prompt in enumerate(["a cat", "a dog"]):
        frames = video[b].permute(1, 0, 2, 3)
        frame_scores = reward(frames, [prompt] * 3)
        np.testing.assert_allclose(scores[b].item(), frame_scores.mean().item(), atol=1e-6)


def test_tensor_preprocessing_matches_processor_on_resized_images(tiny_clip_dir: Path) -> None:
    """Non-square, non-native sizes (resize + center crop) agree with the PIL path to ~uint8 steps."""
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(tiny_clip_dir, local_files_only=True)
    transform = ClipImageTransform.from_image_processor(processor)
    for height, width in [(40, 56), (64, 48), (20, 30)]:
        coarse = torch.rand(2, 3, height // 4, width // 4)
        smooth = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear")
        uint8 = (smooth * 255).round().to(torch.uint8)
        ours = transform(uint8.float() / 255.0)
        pil_images = [Image.fromarray(p.permute(1, 2, 0).numpy()) for p in uint8]
        ref = processor(images=pil_images, return_tensors="pt")["pixel_values"]
        assert ours.shape == ref.shape == (2, 3, TINY_IMAGE_SIZE, TINY_IMAGE_SIZE)
        quantum = 1.0 / 255.0 / min(processor.image_std)
        assert (ours - ref).abs().max() < 2.5 * quantum
        assert (ours - ref).abs().mean() < 0.6 * quantum


@pytest.fixture
def aesthetic_dir(tiny_clip_dir: Path, tmp_path: Path) -> Path:
    directory = tmp_path / "aesthetic"
    shutil.copytree(tiny_clip_dir, directory)
    head = AestheticHead(embed_dim=TINY_PROJECTION_DIM)
    for layer in head.layers:  # variance-preserving init: O(1) scores that differ between images
        if isinstance(layer, torch.nn.Linear):
            torch.nn.init.normal_(layer.weight, std=layer.in_features**-0.5)
            torch.nn.init.normal_(layer.bias, std=0.1)
    save_aesthetic_head(head, directory)
    return directory


def test_aesthetic_head_architecture_matches_laion() -> None:
    layers = AestheticHead().layers
    linear_dims = [(m.in_features, m.out_features) for m in layers if isinstance(m, torch.nn.Linear)]
    assert linear_dims == [(768, 1024), (1024, 128), (128, 64), (64, 16), (16, 1)]
    assert [type(m).__name__ for m in layers] == ["Linear", "Dropout"] * 3 + ["Linear", "Linear"]
    assert [m.p for m in layers if isinstance(m, torch.nn.Dropout)] == [0.2, 0.2, 0.1]
    assert sorted(AestheticHead().state_dict()) == sorted(
        f"layers.{i}.{kind}" for i in (0, 2, 4, 6, 7) for kind in ("weight", "bias")
    )


def test_aesthetic_matches_independent_computation(aesthetic_dir: Path) -> None:
    from safetensors.torch import load_file

    images, pil_images = exact_uint8_images(3)
    reward = build_reward("aesthetic", weights_path=str(aesthetic_dir), batch_size=2)
    scores = reward(images, ["ignored"] * 3)
    assert scores.shape == (3,) and scores.dtype == torch.float32 and torch.isfinite(scores).all()

    head = {k: v.double() for k, v in load_file(aesthetic_dir / AESTHETIC_HEAD_FILENAME).items()}
    x = reference_image_embeds(aesthetic_dir, pil_images)
    for index in (0, 2, 4, 6, 7):  # purely linear stack; dropouts are identity at inference
        x = x @ head[f"layers.{index}.weight"].T + head[f"layers.{index}.bias"]
    np.testing.assert_allclose(scores.numpy(), x.squeeze(-1).numpy(), rtol=1e-5, atol=1e-5)


def test_convert_laion_checkpoint_keeps_key_names_and_values(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    dims = [TINY_PROJECTION_DIM, 1024, 128, 64, 16, 1]
    state = {}
    for index, (d_in, d_out) in zip((0, 2, 4, 6, 7), itertools.pairwise(dims), strict=True):
        state[f"layers.{index}.weight"] = torch.randn(d_out, d_in)
        state[f"layers.{index}.bias"] = torch.randn(d_out)
    pth = tmp_path / "sac+logos+ava1-l14-linearMSE.pth"
    torch.save(state, pth)
    path = convert_laion_aesthetic_checkpoint(pth, tmp_path / "out")
    assert path.name == AESTHETIC_HEAD_FILENAME
    converted = load_file(path)
    assert set(converted) == set(state)
    for key, value in state.items():
        torch.testing.assert_close(converted[key], value)
    with pytest.raises(ValueError, match="aesthetic-head"):
        save_aesthetic_head({"fc.weight": torch.zeros(1, 1)}, tmp_path / "bad")


def test_aesthetic_missing_or_mismatched_head_is_reported(tiny_clip_dir: Path, tmp_path: Path) -> None:
    no_head = tmp_path / "no_head"
    shutil.copytree(tiny_clip_dir, no_head)
    with pytest.raises(ValueError, match=AESTHETIC_HEAD_FILENAME):
        build_reward("aesthetic", weights_path=str(no_head))
    save_aesthetic_head(AestheticHead(embed_dim=TINY_PROJECTION_DIM + 1), no_head)
    with pytest.raises(ValueError, match="projection_dim"):
        build_reward("aesthetic", weights_path=str(no_head))
