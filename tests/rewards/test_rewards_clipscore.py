"""CLIPScore on a tiny CLIP: ``2.5 · max(cos, 0)`` against an independent float64 computation (the
transformers processor and tokenizer on PIL images), its range, seeding, the save → from_pretrained round
trip, the real-size configuration (meta device) and the errors of an incomplete weights directory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from digenrl.rewards import build_reward
from digenrl.rewards.clipscore import CLIP_VIT_L_14, ClipScore, TinyClipScore
from digenrl.rewards.registry import reward_needs_weights
from tests.rewards.test_rewards_clip import exact_uint8_images, reference_image_embeds, reference_model
from tests.rewards.tiny_clip import save_tiny_clip

PROMPTS = ["a cat on a mat", "a red car", "a cat on a mat", "an astronaut riding a horse on the moon"]


@pytest.fixture(scope="module")
def tiny_clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_clip(tmp_path_factory.mktemp("tiny_clip"))


@pytest.fixture(scope="module")
def tiny() -> ClipScore:
    return build_reward("tiny-clipscore", batch_size=3)


def reference_cosine(directory: Path, pil_images, prompts: list[str]) -> np.ndarray:
    from transformers import AutoTokenizer

    tokens = AutoTokenizer.from_pretrained(directory, local_files_only=True)(
        prompts, padding="max_length", truncation=True, max_length=77, return_tensors="pt"
    )
    with torch.no_grad():
        text = reference_model(directory).get_text_features(**tokens)
    text = text if isinstance(text, torch.Tensor) else text.pooler_output
    text = text / text.norm(dim=-1, keepdim=True)
    return (text * reference_image_embeds(directory, pil_images)).sum(-1).numpy()


def test_registered_with_optional_weights() -> None:
    assert reward_needs_weights("clipscore") and reward_needs_weights("tiny-clipscore")
    assert ClipScore.weights_optional and TinyClipScore.weights_optional


def test_clipscore_is_2_5_times_the_clipped_cosine(tiny_clip_dir: Path) -> None:
    images, pil_images = exact_uint8_images(len(PROMPTS))
    reward = build_reward("clipscore", weights_path=str(tiny_clip_dir), batch_size=3)
    scores = reward(images, PROMPTS)
    assert scores.shape == (len(PROMPTS),) and scores.dtype == torch.float32
    cosine = reference_cosine(tiny_clip_dir, pil_images, PROMPTS)
    np.testing.assert_allclose(scores.numpy(), 2.5 * np.clip(cosine, 0, None), atol=1e-5)
    prefixed = build_reward("clipscore", weights_path=str(tiny_clip_dir), prefix="A photo depicts ")
    expected = 2.5 * np.clip(
        reference_cosine(tiny_clip_dir, pil_images, [f"A photo depicts {p}" for p in PROMPTS]), 0, None
    )
    np.testing.assert_allclose(prefixed(images, PROMPTS).numpy(), expected, atol=1e-5)


def test_negative_cosines_score_zero() -> None:
    """Negating the image projection negates every cosine: the clipped score is then 0 everywhere."""
    images = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    reward = build_reward("tiny-clipscore")
    cosine = reward.clip.cosine(images, PROMPTS, 4)
    assert (cosine > 0).all()  # a random tiny CLIP happens to give positive cosines here
    torch.testing.assert_close(reward(images, PROMPTS), 2.5 * cosine, atol=1e-6, rtol=0)
    with torch.no_grad():
        reward.clip.model.visual_projection.weight.neg_()
    torch.testing.assert_close(reward.clip.cosine(images, PROMPTS, 4), -cosine, atol=1e-6, rtol=0)
    assert torch.equal(reward(images, PROMPTS), torch.zeros(4))


def test_tiny_twin_is_seeded_deterministic_and_batch_invariant(tiny: ClipScore) -> None:
    images = torch.rand(4, 3, 48, 40)
    first = tiny(images, PROMPTS)
    assert torch.equal(first, tiny(images, PROMPTS))
    assert torch.equal(first, build_reward("tiny-clipscore", batch_size=3)(images, PROMPTS))  # same seed
    singles = build_reward("tiny-clipscore", batch_size=1)(images, PROMPTS)
    torch.testing.assert_close(singles, first, atol=1e-6, rtol=0)
    assert not torch.allclose(first, build_reward("tiny-clipscore", seed=1)(images, PROMPTS), atol=1e-4)
    assert ((first >= 0) & (first <= 2.5)).all()


def test_save_then_from_pretrained_gives_identical_scores(tiny: ClipScore, tmp_path: Path) -> None:
    directory = tiny.save_pretrained(tmp_path / "clipscore")
    loaded = build_reward("clipscore", weights_path=str(directory))
    assert type(loaded) is ClipScore and loaded.clip.transform == tiny.clip.transform
    images = torch.rand(3, 3, 32, 32)
    torch.testing.assert_close(loaded(images, PROMPTS[:3]), tiny(images, PROMPTS[:3]), atol=0, rtol=0)


def test_real_size_is_clip_vit_l_14() -> None:
    reward = build_reward("clipscore", device="meta")
    config = reward.clip.model.config
    assert reward.num_parameters() == 427_616_513  # openai/clip-vit-large-patch14
    assert config.vision_config.patch_size == 14 and config.projection_dim == 768
    assert config.text_config.vocab_size == CLIP_VIT_L_14["text_config"]["vocab_size"]


def test_incomplete_weights_directory_names_the_missing_files(tiny: ClipScore, tmp_path: Path) -> None:
    directory = tiny.save_pretrained(tmp_path / "partial")
    (directory / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"reward\.weights_path=.*missing: weights \(model\.safetensors"):
        build_reward("clipscore", weights_path=str(directory))
    directory = tiny.save_pretrained(tmp_path / "no_processor")
    (directory / "preprocessor_config.json").unlink()
    with pytest.raises(ValueError, match=r"missing: image processor \(preprocessor_config\.json\)"):
        build_reward("clipscore", weights_path=str(directory))
    with pytest.raises(ValueError, match=r"not an existing local directory"):
        build_reward("clipscore", weights_path=str(tmp_path / "nowhere"))
