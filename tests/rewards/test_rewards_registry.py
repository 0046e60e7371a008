"""Registry lookups, their error messages, and the weighted-sum composite reward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor

from digenrl.rewards import CompositeReward, RewardFunction, available_rewards, build_reward, register_reward
from digenrl.rewards import registry as registry_module

BUILTIN = {
    "jpeg-compressibility",
    "jpeg-incompressibility",
    "brightness",
    "colorfulness",
    "pickscore",
    "aesthetic",
    "vlm-judge",
    "tiny-vlm-judge",
    "clipscore",
    "tiny-clipscore",
    "hpsv2.1",
    "tiny-hpsv2.1",
    "imagereward",
    "tiny-imagereward",
    "ocr",
    "tiny-ocr",
    "geneval",
    "tiny-geneval",
    "video-pickscore",
    "tiny-video-pickscore",
    "remote",
}


def test_available_rewards_lists_builtins() -> None:
    names = available_rewards()
    assert set(names) >= BUILTIN
    assert names == sorted(names)


def test_unknown_name_lists_allowed_names() -> None:
    with pytest.raises(ValueError, match="unknown reward 'nope'") as info:
        build_reward("nope")
    for name in BUILTIN:
        assert name in str(info.value)


@pytest.mark.parametrize("name", ["pickscore", "aesthetic"])
def test_reward_needing_weights_without_path_names_the_setting(name: str) -> None:
    with pytest.raises(ValueError, match=r"reward\.weights_path"):
        build_reward(name)


def test_weights_path_must_be_an_existing_directory(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"reward\.weights_path=.*not an existing local directory"):
        build_reward("pickscore", weights_path=str(tmp_path / "missing"))


def test_weight_free_reward_rejects_weights_path(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"takes no weights.*reward\.weights_path"):
        build_reward("brightness", weights_path=str(tmp_path))


def test_build_reward_sets_name_and_flags() -> None:
    reward = build_reward("colorfulness")
    assert isinstance(reward, RewardFunction)
    assert reward.name == "colorfulness" and reward.needs_weights is False
    assert reward.to("cpu") is reward


def test_register_reward_makes_a_reward_buildable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))

    @register_reward("test-prompt-length")
    class PromptLength(RewardFunction):
        def score_images(self, images: Tensor, prompts: list[str]) -> Tensor:
            return torch.tensor([float(len(p)) for p in prompts])

    assert "test-prompt-length" in available_rewards()
    scores = build_reward("test-prompt-length")(torch.rand(2, 3, 4, 4), ["ab", "abcde"])
    np.testing.assert_array_equal(scores.numpy(), [2.0, 5.0])
    with pytest.raises(ValueError, match="already registered"):
        register_reward("brightness")(PromptLength)


def test_optional_weights_reward_builds_with_and_without_a_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """``weights_optional``: no path → ``weights_path=None`` (random weights); a path is passed through."""
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))

    @register_reward("test-optional-weights")
    class OptionalWeights(RewardFunction):
        needs_weights = True
        weights_optional = True

        def __init__(self, weights_path: str | None = None, device: str = "cpu") -> None:
            super().__init__(device)
            self.weights_path = weights_path

        def score_images(self, images: Tensor, prompts: list[str]) -> Tensor:
            return torch.zeros(images.shape[0])

    assert build_reward("test-optional-weights").weights_path is None
    assert build_reward("test-optional-weights", weights_path=str(tmp_path)).weights_path == str(tmp_path)
    assert registry_module.reward_needs_weights("test-optional-weights") is True


def test_composite_from_spec_is_weighted_sum() -> None:
    images = torch.rand(3, 3, 16, 16)
    prompts = ["a", "b", "c"]
    w_jpeg, w_bright = float(torch.empty(()).uniform_(0.1, 2.0)), float(torch.empty(()).uniform_(-2.0, 2.0))
    composite = CompositeReward.from_spec(
        {"jpeg-compressibility": w_jpeg, "brightness": w_bright},
        reward_kwargs={"jpeg-compressibility": {"scale": 1 / 500}},
    )
    jpeg = build_reward("jpeg-compressibility", scale=1 / 500)(images, prompts).double()
    bright = build_reward("brightness")(images, prompts).double()
    scores = composite(images, prompts)
    assert scores.dtype == torch.float32 and scores.shape == (3,)
    np.testing.assert_allclose(scores.numpy(), (w_jpeg * jpeg + w_bright * bright).numpy(), atol=1e-6)
    parts = composite.score_parts(images, prompts)
    assert set(parts) == {"jpeg-compressibility", "brightness"}
    np.testing.assert_allclose(parts["brightness"].numpy(), bright.numpy(), atol=1e-7)
    assert composite.needs_weights is False


def test_composite_of_video_equals_weighted_sum_of_frame_means() -> None:
    video = torch.rand(2, 3, 3, 8, 8)
    parts = [(build_reward("brightness"), 2.0), (build_reward("colorfulness"), -0.5)]
    expected = 2.0 * parts[0][0](video, ["a", "b"]) - 0.5 * parts[1][0](video, ["a", "b"])
    np.testing.assert_allclose(CompositeReward(parts)(video, ["a", "b"]).numpy(), expected.numpy(), atol=1e-6)


def test_composite_nan_part_propagates() -> None:
    images = torch.rand(2, 3, 8, 8)
    images[0, 1, 2, 2] = float("inf")
    scores = CompositeReward.from_spec({"brightness": 1.0, "colorfulness": 1.0})(images, ["a", "b"])
    assert torch.isnan(scores[0]) and torch.isfinite(scores[1])


@pytest.mark.parametrize(
    ("spec", "kwargs", "match"),
    [
        ({}, {}, "non-empty mapping"),
        ({"brightness": float("nan")}, {}, "finite number"),
        ({"brightness": "1"}, {}, "finite number"),
        ({"brightness": 1.0}, {"weights_paths": {"pickscore": "/x"}}, "not in the spec"),
        ({"nope": 1.0}, {}, "unknown reward"),
    ],
)
def test_composite_spec_errors(spec: dict, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CompositeReward.from_spec(spec, **kwargs)


def test_a_run_config_builds_its_reward_and_the_models_it_holds(tmp_path):
    """``reward.weights`` (a weighted sum) builds from a run's config, its one part with a model taking
    ``reward.weights_path``; ``modules()`` finds the model weights a colocated run parks."""
    from digenrl.rewards.registry import build_configured_reward
    from tests.rewards.tiny_clip import save_tiny_clip

    clip = save_tiny_clip(tmp_path / "clip")
    composite = build_configured_reward("brightness", {"pickscore": 1.0, "brightness": 0.5}, str(clip), "cpu")
    assert [type(m).__name__ for m in composite.modules()] == ["CLIPModel"]
    assert build_configured_reward("brightness", None, None, "cpu").modules() == []
    # a file's weights_path for a model reward, with reward=brightness on the command line: ignored, as a
    # weighted sum without a model part ignores it (startup validation rejects it when set alongside)
    assert build_configured_reward("brightness", None, str(clip), "cpu").name == "brightness"
    images = torch.rand(2, 3, 32, 32)
    parts = composite.score_parts(images, ["a", "b"])
    assert torch.allclose(composite(images, ["a", "b"]), parts["pickscore"] + 0.5 * parts["brightness"])
    with pytest.raises(ValueError, match="several rewards with models"):
        build_configured_reward("x", {"pickscore": 1.0, "aesthetic": 1.0}, str(clip), "cpu")


def test_composite_hands_metadata_to_every_part(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))

    @register_reward("test-text-length")
    class TextLength(RewardFunction):
        def score_images(self, images: Tensor, prompts: list[str]) -> Tensor:
            return self.score_batch(images, prompts, [{} for _ in prompts])

        def score_batch(self, images: Tensor, prompts: list[str], metadata: list) -> Tensor:
            return torch.tensor([float(len(m.get("text", ""))) for m in metadata])

    images = torch.rand(2, 3, 8, 8)
    composite = CompositeReward.from_spec({"test-text-length": 2.0, "brightness": 1.0})
    metadata = [{"text": "abc"}, {}]
    expected = 2.0 * torch.tensor([3.0, 0.0]) + build_reward("brightness")(images, ["a", "b"])
    torch.testing.assert_close(composite(images, ["a", "b"], metadata), expected)
    assert composite.score_parts(images, ["a", "b"], metadata)["test-text-length"].tolist() == [3.0, 0.0]
    assert composite(images, ["a", "b"]).tolist() == build_reward("brightness")(images, ["a", "b"]).tolist()
